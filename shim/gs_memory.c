/* Memory hooks: every way to take device memory reserves against the container's limit before the driver
 * allocates, rolls back when the driver fails, and gives back on free. Over the limit the answer is
 * CUDA_ERROR_OUT_OF_MEMORY, as from a full GPU. */
#include <pthread.h>

#include "gs_shim.h"

/* Pools created with a location, so cuMemAllocFromPoolAsync charges the right GPU (or none, for host pools). */
#define MAX_POOLS 64
static struct {
    pthread_mutex_t lock;
    CUmemoryPool pool[MAX_POOLS];
    int dev[MAX_POOLS]; /* CUDA ordinal, -1 = not device memory */
} pools = {PTHREAD_MUTEX_INITIALIZER, {0}, {0}};

static void child_after_fork(void)
{
    pthread_mutex_init(&pools.lock, NULL);
}
GS_ON_FORK_CHILD(child_after_fork)

/* Where allocations of the calling thread go: its current context's device. -1 with *rc when unknown. */
static int current_or(CUresult *rc)
{
    int d = -1;
    *rc = gs_current_device(&d);
    return *rc == CUDA_SUCCESS ? d : -1;
}

/* The common shape: reserve on d, call the driver, keep or roll back. */
#define GS_ALLOC_ON(d, bytes, call, dptr)                            \
    do {                                                             \
        int tracked_;                                                \
        CUresult rc_ = gs_alloc_begin((d), (bytes), &tracked_);      \
        if (rc_)                                                     \
            return rc_;                                              \
        rc_ = (call);                                                \
        gs_alloc_end(rc_, tracked_, (d), (bytes), &gs_pointers, rc_ == CUDA_SUCCESS ? *(dptr) : 0); \
        return rc_;                                                  \
    } while (0)

#define GS_ALLOC_CURRENT(bytes, call, dptr)                          \
    do {                                                             \
        CUresult rc0_;                                               \
        if (!gs_devices_ready() || !gs_any_limit || !dptr)           \
            return (call);                                           \
        int d_ = current_or(&rc0_);                                  \
        if (rc0_ != CUDA_SUCCESS)                                    \
            return (call);                                           \
        GS_ALLOC_ON(d_, (bytes), (call), (dptr));                    \
    } while (0)

#define GS_ENTER_OR_RETURN(name)              \
    do {                                      \
        CUresult e_ = gs_enter();             \
        if (e_)                               \
            return e_;                        \
        if (!gs_cu.name)                      \
            return CUDA_ERROR_NOT_SUPPORTED;  \
    } while (0)

GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    GS_ENTER_OR_RETURN(cuMemAlloc_v2);
    GS_ALLOC_CURRENT(bytesize, gs_cu.cuMemAlloc_v2(dptr, bytesize), dptr);
}

GS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    GS_ENTER_OR_RETURN(cuMemAllocManaged);
    GS_ALLOC_CURRENT(bytesize, gs_cu.cuMemAllocManaged(dptr, bytesize, flags), dptr);
}

GS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocAsync);
    GS_ALLOC_CURRENT(bytesize, gs_cu.cuMemAllocAsync(dptr, bytesize, stream), dptr);
}

GS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocAsync_ptsz);
    GS_ALLOC_CURRENT(bytesize, gs_cu.cuMemAllocAsync_ptsz(dptr, bytesize, stream), dptr);
}

/* The pitch is the driver's choice: reserve rows of the usual 512-byte alignment, then settle to the real
 * size (charging a wider pitch, or undoing the allocation when that does not fit). */
#define GS_PITCH_ALIGN 512
GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elem)
{
    GS_ENTER_OR_RETURN(cuMemAllocPitch_v2);
    CUresult rc = CUDA_SUCCESS;
    int d = gs_devices_ready() && gs_any_limit ? current_or(&rc) : -1;
    if (d < 0 || rc != CUDA_SUCCESS || !dptr || !pitch || width > (SIZE_MAX >> 1) || !height)
        return gs_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    uint64_t widest = ((uint64_t)width + GS_PITCH_ALIGN - 1) / GS_PITCH_ALIGN * GS_PITCH_ALIGN;
    if (height > UINT64_MAX / widest)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t reserved = widest * height;
    int tracked;
    rc = gs_alloc_begin(d, reserved, &tracked);
    if (rc)
        return rc;
    rc = gs_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS || !tracked) {
        if (tracked)
            gs_alloc_undo(d, reserved);
        return rc;
    }
    uint64_t actual = (uint64_t)*pitch * height;
    if (actual <= reserved) {
        gs_alloc_undo(d, reserved - actual);
        gs_alloc_end(CUDA_SUCCESS, 1, d, actual, &gs_pointers, *dptr);
        return CUDA_SUCCESS;
    }
    /* A pitch wider than expected: charge the difference or undo the allocation. */
    int more;
    if (gs_alloc_begin(d, actual - reserved, &more) != CUDA_SUCCESS) {
        gs_cu.cuMemFree_v2(*dptr);
        gs_alloc_undo(d, reserved);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    gs_alloc_end(CUDA_SUCCESS, 1, d, actual, &gs_pointers, *dptr);
    return CUDA_SUCCESS;
}

static int pool_device(CUmemoryPool pool, int *dev)
{
    int found = 0;
    pthread_mutex_lock(&pools.lock);
    for (int i = 0; i < MAX_POOLS; i++) {
        if (pools.pool[i] == pool && pool) {
            *dev = pools.dev[i];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&pools.lock);
    return found;
}

static CUresult from_pool(gs_pfn_cuMemAllocFromPoolAsync real, CUdeviceptr *dptr, size_t bytesize,
                          CUmemoryPool pool, CUstream stream)
{
    CUresult rc = CUDA_SUCCESS;
    int d = gs_devices_ready() && gs_any_limit ? current_or(&rc) : -1;
    if (d < 0 || rc != CUDA_SUCCESS || !dptr)
        return real(dptr, bytesize, pool, stream);
    int pd;
    if (pool_device(pool, &pd)) {
        if (pd < 0)
            return real(dptr, bytesize, pool, stream); /* a host pool: not device memory */
        d = pd;
    }
    GS_ALLOC_ON(d, bytesize, real(dptr, bytesize, pool, stream), dptr);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocFromPoolAsync);
    return from_pool(gs_cu.cuMemAllocFromPoolAsync, dptr, bytesize, pool, stream);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocFromPoolAsync_ptsz);
    return from_pool(gs_cu.cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, stream);
}

GS_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    GS_ENTER_OR_RETURN(cuMemPoolCreate);
    CUresult rc = gs_cu.cuMemPoolCreate(pool, props);
    if (rc != CUDA_SUCCESS || !pool || !props)
        return rc;
    int dev = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props->location.id : -1;
    pthread_mutex_lock(&pools.lock);
    for (int i = 0; i < MAX_POOLS; i++) {
        if (!pools.pool[i]) {
            pools.pool[i] = *pool;
            pools.dev[i] = dev;
            break;
        }
    }
    pthread_mutex_unlock(&pools.lock);
    return rc;
}

GS_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    GS_ENTER_OR_RETURN(cuMemPoolDestroy);
    CUresult rc = gs_cu.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&pools.lock);
        for (int i = 0; i < MAX_POOLS; i++)
            if (pools.pool[i] == pool)
                pools.pool[i] = NULL;
        pthread_mutex_unlock(&pools.lock);
    }
    return rc;
}

/* cuMemCreate takes physical memory on an explicit location; only device locations count. */
GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    GS_ENTER_OR_RETURN(cuMemCreate);
    if (!gs_devices_ready() || !gs_any_limit || !handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return gs_cu.cuMemCreate(handle, size, prop, flags);
    int d = prop->location.id, tracked;
    CUresult rc = gs_alloc_begin(d, size, &tracked);
    if (rc)
        return rc;
    rc = gs_cu.cuMemCreate(handle, size, prop, flags);
    gs_alloc_end(rc, tracked, d, size, &gs_handles, rc == CUDA_SUCCESS ? *handle : 0);
    return rc;
}

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    GS_ENTER_OR_RETURN(cuMemRelease);
    struct gs_ptr_entry e;
    int had = gs_free_begin(&gs_handles, handle, &e);
    CUresult rc = gs_cu.cuMemRelease(handle);
    gs_free_end(rc, had, &gs_handles, &e);
    return rc;
}

#define GS_FREE(call, key)                                           \
    do {                                                             \
        struct gs_ptr_entry e_;                                      \
        int had_ = gs_free_begin(&gs_pointers, (key), &e_);          \
        CUresult rc_ = (call);                                       \
        gs_free_end(rc_, had_, &gs_pointers, &e_);                   \
        return rc_;                                                  \
    } while (0)

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    GS_ENTER_OR_RETURN(cuMemFree_v2);
    GS_FREE(gs_cu.cuMemFree_v2(dptr), dptr);
}

GS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemFreeAsync);
    GS_FREE(gs_cu.cuMemFreeAsync(dptr, stream), dptr);
}

GS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemFreeAsync_ptsz);
    GS_FREE(gs_cu.cuMemFreeAsync_ptsz(dptr, stream), dptr);
}
