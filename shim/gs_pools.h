/* Stream-ordered memory pools as the memory hooks need them: which pool an allocation comes from. */
#ifndef GS_POOLS_H
#define GS_POOLS_H

#include "gs_cuda_types.h"
#include "gs_poolcache.h"

/* The id (gs_poolcache.h) of pool: one created or made current in this process, or a device's default pool; 0 when
 * not known. *dev: its CUDA ordinal (-1: not device memory). */
int gs_pool_lookup(CUmemoryPool pool, int *dev);
/* The id of CUDA ordinal d's default pool, asked from the driver once; 0 when it cannot say. */
int gs_pool_default_of(int d);
/* The id of the pool cuMemAllocAsync takes from on CUDA ordinal d: the one cuDeviceSetMemPool made current, else
 * the device's default pool; 0 when not known. */
static inline int gs_pool_current_of(int d)
{
    int id = gs_poolcache_current(d);
    return id ? id : gs_pool_default_of(d);
}

#endif /* GS_POOLS_H */
