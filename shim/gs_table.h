/* A hash table from a nonzero 64-bit key to a fixed-size value (open addressing, linear probing, backward-shift
 * deletion, grown at half full). Not locked: its user holds its own lock. A pointer to a value stays valid until
 * the next put or take. */
#ifndef GS_TABLE_H
#define GS_TABLE_H

#include <stddef.h>
#include <stdint.h>

struct gs_table {
    size_t vsize;          /* bytes of a value */
    size_t cap, count;
    unsigned char *slots;  /* cap slots of a uint64_t key (0 = empty) followed by the value */
};

#define GS_TABLE_INIT(type) {sizeof(type), 0, 0, NULL}

/* The value under key, or NULL. */
void *gs_table_get(struct gs_table *t, uint64_t key);
/* The value under key, made (zeroed) when missing; NULL when host memory runs out. */
void *gs_table_put(struct gs_table *t, uint64_t key);
/* Remove key: 1 with its value copied to out (when not NULL), 0 when it was not there. */
int gs_table_take(struct gs_table *t, uint64_t key, void *out);
/* Empty the table and free its memory. */
void gs_table_reset(struct gs_table *t);

#endif /* GS_TABLE_H */
