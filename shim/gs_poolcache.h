/* What stream-ordered memory pools keep. A pool keeps memory freed into it (still taken on the GPU) while what it
 * holds stays within its release threshold (default 0: nothing), and reuses it for its next allocations; it gives
 * it back on cuMemPoolTrimTo, a lower threshold and cuMemPoolDestroy. This unit counts, per pool, the bytes in use
 * and the bytes kept, so that the kept bytes stay charged: several pools that each keep everything cannot hold more
 * than the container's cap between them. Pools are named by an id (0 = none), which a destroyed pool's allocations
 * keep: it no longer matches. Above gs_state and gs_config; the charges themselves are gs_account's. */
#ifndef GS_POOLCACHE_H
#define GS_POOLCACHE_H

#include <stdint.h>

#include "gs_cuda_types.h"

/* Register a pool on CUDA ordinal dev (-1: not device memory): its id, 0 when the table is full. A pool already
 * registered keeps its id. */
int gs_poolcache_add(CUmemoryPool pool, int dev);
/* The id of a registered pool, or 0; *dev its CUDA ordinal. */
int gs_poolcache_find(CUmemoryPool pool, int *dev);
/* Each device's default pool, and its current one: the pool cuDeviceSetMemPool chose, else the default pool once
 * known (set_default makes it current where none is); 0 = not known. */
void gs_poolcache_set_default(int dev, int id);
int gs_poolcache_default(int dev);
void gs_poolcache_set_current(int dev, int id);
extern int gs_poolcache_current_ids[]; /* by CUDA ordinal (GS_MAX_DEVICES of them) */
static inline int gs_poolcache_current(int dev)
{
    return __atomic_load_n(&gs_poolcache_current_ids[dev], __ATOMIC_ACQUIRE); /* dev: a valid CUDA ordinal */
}

/* Pools whose release threshold is not 0: while there are none, no pool keeps anything and an allocation or a free
 * needs none of the figures below (the common case costs one load). */
extern int gs_poolcache_keepers;
static inline int gs_poolcache_any_keeps(void)
{
    return __atomic_load_n(&gs_poolcache_keepers, __ATOMIC_ACQUIRE) != 0;
}

/* An allocation of `bytes` from pool id: the kept bytes it reuses (no new charge for them). */
uint64_t gs_poolcache_take(int id, uint64_t bytes);
/* That allocation failed: the pool keeps what it would have reused. */
void gs_poolcache_untake(int id, uint64_t bytes, uint64_t reused);
/* `bytes` of pool id's were freed: returns the bytes it does not keep (to give back); all of them for a pool that
 * is gone. */
uint64_t gs_poolcache_freed(int id, uint64_t bytes);
/* A new release threshold, or cuMemPoolTrimTo(keep): returns the bytes the pool no longer keeps. */
uint64_t gs_poolcache_set_threshold(int id, uint64_t threshold);
uint64_t gs_poolcache_trim(int id, uint64_t keep);
/* The pool is destroyed: returns what it kept. */
uint64_t gs_poolcache_remove(int id);

#endif /* GS_POOLCACHE_H */
