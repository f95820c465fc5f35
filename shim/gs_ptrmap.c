/* Pointer map: linear probing with backward-shift deletion (no tombstones), grown at half full. */
#include "gs_ptrmap.h"

#include <sched.h>
#include <stdlib.h>

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spin briefly, then yield: the holder may be off the CPU (or growing the map). */
static void lock(struct gs_ptrmap *m)
{
    for (unsigned spins = 0; __atomic_exchange_n(&m->lock, 1, __ATOMIC_ACQUIRE);) {
        while (__atomic_load_n(&m->lock, __ATOMIC_RELAXED)) {
            if (++spins < 128)
                cpu_relax();
            else
                sched_yield();
        }
    }
}

static void unlock(struct gs_ptrmap *m)
{
    __atomic_store_n(&m->lock, 0, __ATOMIC_RELEASE);
}

static size_t home(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 17) & (cap - 1);
}

static int grow(struct gs_ptrmap *m)
{
    size_t cap = m->cap ? m->cap * 2 : 256;
    struct gs_ptr_entry *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].key)
            continue;
        size_t j = home(m->slots[i].key, cap);
        while (slots[j].key)
            j = (j + 1) & (cap - 1);
        slots[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = slots;
    m->cap = cap;
    return 0;
}

int gs_ptrmap_put(struct gs_ptrmap *m, uint64_t key, uint64_t bytes, int dev, int pool)
{
    int rc = 0;
    lock(m);
    if ((m->count + 1) * 2 > m->cap && grow(m)) {
        rc = -1;
    } else {
        size_t i = home(key, m->cap);
        while (m->slots[i].key && m->slots[i].key != key)
            i = (i + 1) & (m->cap - 1);
        if (!m->slots[i].key)
            m->count++;
        m->slots[i] = (struct gs_ptr_entry){key, bytes, dev, pool};
    }
    unlock(m);
    return rc;
}

int gs_ptrmap_take(struct gs_ptrmap *m, uint64_t key, struct gs_ptr_entry *out)
{
    if (!__atomic_load_n(&m->count, __ATOMIC_RELAXED))
        return 0;
    int found = 0;
    lock(m);
    if (m->cap) {
        size_t mask = m->cap - 1, i = home(key, m->cap);
        while (m->slots[i].key && m->slots[i].key != key)
            i = (i + 1) & mask;
        if (m->slots[i].key == key) {
            *out = m->slots[i];
            found = 1;
            m->count--;
            size_t hole = i;
            for (size_t j = (i + 1) & mask; m->slots[j].key; j = (j + 1) & mask) {
                if (((j - home(m->slots[j].key, m->cap)) & mask) >= ((j - hole) & mask)) {
                    m->slots[hole] = m->slots[j];
                    hole = j;
                }
            }
            m->slots[hole].key = 0;
        }
    }
    unlock(m);
    return found;
}

void gs_ptrmap_reset(struct gs_ptrmap *m)
{
    m->lock = 0;
    free(m->slots);
    m->slots = NULL;
    m->cap = m->count = 0;
}
