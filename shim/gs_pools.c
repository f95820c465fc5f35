/* Stream-ordered memory pools: where each lies, and what each keeps. A pool keeps memory freed into it (still taken
 * on the GPU) up to its release threshold and reuses it; that memory stays charged (gs_poolcache.h), and goes back
 * when the pool stops keeping it: cuMemPoolTrimTo, a lower threshold (cuMemPoolSetAttribute), cuMemPoolDestroy. The
 * driver trims a pool to its threshold at the next synchronisation; the shim at the free, in stream order. */
#include "gs_alloc.h"
#include "gs_log.h"
#include "gs_pools.h"

#define ATTR_RELEASE_THRESHOLD 4 /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (cuuint64_t) */

int gs_pool_default_of(int d)
{
    int id = gs_poolcache_default(d);
    if (id || !gs_cu.cuDeviceGetDefaultMemPool)
        return id;
    CUmemoryPool pool = NULL;
    if (gs_cu.cuDeviceGetDefaultMemPool(&pool, d) != CUDA_SUCCESS || !pool)
        return 0;
    id = gs_poolcache_add(pool, d);
    gs_poolcache_set_default(d, id);
    return id;
}

int gs_pool_lookup(CUmemoryPool pool, int *dev)
{
    *dev = -1;
    int id = gs_poolcache_find(pool, dev);
    if (id || !pool)
        return id;
    for (int d = 0; d < gs_ndevs; d++) /* a default pool not met yet */
        gs_pool_default_of(d);
    return gs_poolcache_find(pool, dev);
}

/* Give back what pool id on CUDA ordinal d no longer keeps. */
static void give_back(int d, uint64_t bytes)
{
    if (bytes && d >= 0 && d < gs_ndevs)
        gs_alloc_undo(d, bytes);
}

GS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    GS_ENTER_OR_RETURN(cuMemPoolCreate);
    CUresult rc = gs_cu.cuMemPoolCreate(pool, props);
    if (rc != CUDA_SUCCESS || !pool || !props || !gs_devices_ready())
        return rc;
    int dev = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props->location.id : -1;
    if (!gs_poolcache_add(*pool, dev) && gs_any_limit) {
        /* Its kept memory could not be counted: refused rather than let it escape the limit. */
        GS_ERROR("cuMemPoolCreate: this process has too many memory pools for the shim to count what they keep; "
                 "destroy pools that are no longer used");
        gs_cu.cuMemPoolDestroy(*pool);
        *pool = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return rc;
}

GS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    GS_ENTER_OR_RETURN(cuMemPoolDestroy);
    CUresult rc = gs_cu.cuMemPoolDestroy(pool);
    int d;
    int id = rc == CUDA_SUCCESS ? gs_poolcache_find(pool, &d) : 0;
    if (id) /* its allocations still in use keep their charge; what it kept goes back */
        give_back(d, gs_poolcache_remove(id));
    return rc;
}

GS_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    GS_ENTER_OR_RETURN(cuMemPoolSetAttribute);
    CUresult rc = gs_cu.cuMemPoolSetAttribute(pool, attr, value);
    if (rc != CUDA_SUCCESS || attr != ATTR_RELEASE_THRESHOLD || !value || !gs_devices_ready())
        return rc;
    int d, id = gs_pool_lookup(pool, &d);
    if (id)
        give_back(d, gs_poolcache_set_threshold(id, *(const cuuint64_t *)value));
    return rc;
}

GS_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    GS_ENTER_OR_RETURN(cuMemPoolTrimTo);
    CUresult rc = gs_cu.cuMemPoolTrimTo(pool, keep);
    if (rc != CUDA_SUCCESS || !gs_devices_ready())
        return rc;
    int d, id = gs_pool_lookup(pool, &d);
    if (id)
        give_back(d, gs_poolcache_trim(id, keep));
    return rc;
}

GS_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    GS_ENTER_OR_RETURN(cuDeviceSetMemPool);
    CUresult rc = gs_cu.cuDeviceSetMemPool(dev, pool);
    if (rc != CUDA_SUCCESS || !gs_devices_ready())
        return rc;
    int d, id = gs_pool_lookup(pool, &d);
    if (!id)
        id = gs_poolcache_add(pool, dev); /* a pool this process did not create (imported): on that device */
    gs_poolcache_set_current(dev, id);
    return rc;
}
