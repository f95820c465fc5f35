/* What this process allocated under a limit: device pointer (or cuMemCreate handle) -> bytes and device, so a
 * free gives back exactly what its allocation took. Open addressing under one spin lock (held for a few dozen
 * instructions; an uncontended pthread mutex cost two locked instructions per call, a fifth of the shim's time on
 * an allocation + free pair); only allocation paths use it. */
#ifndef GS_PTRMAP_H
#define GS_PTRMAP_H

#include <stddef.h>
#include <stdint.h>

struct gs_ptr_entry {
    uint64_t key; /* 0 = empty */
    uint64_t bytes;
    int dev;      /* CUDA ordinal */
    int pool;     /* the stream-ordered pool it came from (a gs_poolcache id), 0 = none */
};

struct gs_ptrmap {
    int lock; /* 0 = free */
    struct gs_ptr_entry *slots;
    size_t cap, count;
};

#define GS_PTRMAP_INIT {0, NULL, 0, 0}

/* 0, or -1 when host memory runs out. */
int gs_ptrmap_put(struct gs_ptrmap *m, uint64_t key, uint64_t bytes, int dev, int pool);
/* Remove key: 1 and *out when it was there, 0 otherwise. */
int gs_ptrmap_take(struct gs_ptrmap *m, uint64_t key, struct gs_ptr_entry *out);
/* Empty the map (a forked child owns none of its parent's allocations). */
void gs_ptrmap_reset(struct gs_ptrmap *m);

#endif /* GS_PTRMAP_H */
