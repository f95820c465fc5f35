/* The hash table of gs_table.h. */
#include "gs_table.h"

#include <stdlib.h>
#include <string.h>

static size_t slot_size(const struct gs_table *t)
{
    return sizeof(uint64_t) + ((t->vsize + 7) & ~(size_t)7);
}

static uint64_t *key_at(const struct gs_table *t, size_t i)
{
    return (uint64_t *)(t->slots + i * slot_size(t));
}

static size_t home(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t probe(const struct gs_table *t, uint64_t key)
{
    size_t i = home(key, t->cap);
    while (*key_at(t, i) && *key_at(t, i) != key)
        i = (i + 1) & (t->cap - 1);
    return i;
}

static int grow(struct gs_table *t)
{
    struct gs_table bigger = {t->vsize, t->cap ? t->cap * 2 : 64, 0, NULL};
    bigger.slots = calloc(bigger.cap, slot_size(t));
    if (!bigger.slots)
        return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (*key_at(t, i)) {
            memcpy(bigger.slots + probe(&bigger, *key_at(t, i)) * slot_size(t), key_at(t, i), slot_size(t));
            bigger.count++;
        }
    }
    free(t->slots);
    *t = bigger;
    return 0;
}

void *gs_table_get(struct gs_table *t, uint64_t key)
{
    if (!t->count || !key)
        return NULL;
    size_t i = probe(t, key);
    return *key_at(t, i) ? key_at(t, i) + 1 : NULL;
}

void *gs_table_put(struct gs_table *t, uint64_t key)
{
    void *v = gs_table_get(t, key);
    if (v || !key)
        return v;
    if ((t->count + 1) * 2 > t->cap && grow(t))
        return NULL;
    size_t i = probe(t, key);
    memset(key_at(t, i), 0, slot_size(t));
    *key_at(t, i) = key;
    t->count++;
    return key_at(t, i) + 1;
}

int gs_table_take(struct gs_table *t, uint64_t key, void *out)
{
    if (!t->count || !key)
        return 0;
    size_t mask = t->cap - 1, i = probe(t, key);
    if (!*key_at(t, i))
        return 0;
    if (out)
        memcpy(out, key_at(t, i) + 1, t->vsize);
    t->count--;
    size_t hole = i;
    for (size_t j = (i + 1) & mask; *key_at(t, j); j = (j + 1) & mask) {
        if (((j - home(*key_at(t, j), t->cap)) & mask) >= ((j - hole) & mask)) {
            memcpy(key_at(t, hole), key_at(t, j), slot_size(t));
            hole = j;
        }
    }
    *key_at(t, hole) = 0;
    return 1;
}

void gs_table_reset(struct gs_table *t)
{
    free(t->slots);
    t->slots = NULL;
    t->cap = t->count = 0;
}
