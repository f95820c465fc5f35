/* Linear device memory: every way to take it reserves what the driver really takes (the size rounded up to
 * the GPU's allocation granularity) against the container's limit before the driver allocates, rolls back when
 * the driver fails, and gives back on free. Over the limit the answer is CUDA_ERROR_OUT_OF_MEMORY, as from a
 * full GPU. Stream-ordered frees give back when the free has happened in stream order. */
#include <stdlib.h>

#include "gs_alloc.h"
#include "gs_log.h"
#include "gs_pools.h"

/* A stream-ordered allocation from pool `pool` (a gs_poolcache id, 0 = not known) on GPU d: what the pool keeps
 * covers part of it, the rest is reserved; the entry remembers the pool, so that its free gives back only what the
 * pool does not keep. */
#define GS_POOL_TRACKED(d, pool, charge, call, key, undo)                                                  \
    do {                                                                                                  \
        uint64_t reused_ = 0;                                                                             \
        int tracked_;                                                                                     \
        CUresult rc_ = gs_poolcache_any_keeps() ? gs_pool_alloc_begin((d), (pool), (charge), &reused_, &tracked_) \
                                                : gs_alloc_begin((d), (charge), &tracked_);               \
        if (rc_)                                                                                          \
            return rc_;                                                                                   \
        rc_ = (call);                                                                                     \
        if (gs_pool_alloc_end(rc_, tracked_, (d), (pool), (charge), reused_, &gs_pointers,                \
                              rc_ ? 0 : (uint64_t)(key))) {                                               \
            undo;                                                                                         \
            return CUDA_ERROR_OUT_OF_MEMORY;                                                              \
        }                                                                                                 \
        return rc_;                                                                                       \
    } while (0)

GS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    GS_ENTER_OR_RETURN(cuMemAlloc_v2);
    GS_ALLOC_CURRENT(&gs_pointers, bytesize, gs_cu.cuMemAlloc_v2(dptr, bytesize), dptr, gs_cu.cuMemFree_v2(*dptr));
}

/* The CUDA 3.1 entry point, still exported by the driver (32-bit device pointers). */
GS_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    GS_ENTER_OR_RETURN(cuMemAlloc);
    GS_ALLOC_CURRENT(&gs_pointers, bytesize, gs_cu.cuMemAlloc(dptr, bytesize), dptr,
                     gs_cu.cuMemFree ? gs_cu.cuMemFree(*dptr) : CUDA_SUCCESS);
}

GS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    GS_ENTER_OR_RETURN(cuMemAllocManaged);
    GS_ALLOC_CURRENT(&gs_pointers, bytesize, gs_cu.cuMemAllocManaged(dptr, bytesize, flags), dptr,
                     gs_cu.cuMemFree_v2(*dptr));
}

/* cuMemAllocAsync takes from the device's current pool (its default one unless cuDeviceSetMemPool chose another). */
static CUresult alloc_async(gs_pfn_cuMemAllocAsync real, gs_pfn_cuMemFreeAsync free_async, CUdeviceptr *dptr,
                            size_t bytesize, CUstream stream)
{
    int d;
    GS_ALLOC_TARGET(d, dptr, real(dptr, bytesize, stream));
    GS_POOL_TRACKED(d, gs_pool_current_of(d), gs_charge_size(d, bytesize), real(dptr, bytesize, stream), *dptr,
                    free_async(*dptr, stream));
}

GS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocAsync);
    return alloc_async(gs_cu.cuMemAllocAsync, gs_cu.cuMemFreeAsync, dptr, bytesize, stream);
}

GS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocAsync_ptsz);
    return alloc_async(gs_cu.cuMemAllocAsync_ptsz, gs_cu.cuMemFreeAsync_ptsz, dptr, bytesize, stream);
}

/* The pitch is the driver's choice: reserve rows of the usual 512-byte alignment, then settle to the real
 * size (charging a wider pitch, or undoing the allocation when that does not fit). */
#define GS_PITCH_ALIGN 512

/* Settle a pitched allocation that `reserved` was charged for to its real `bytes` (pitch x height); on failure the
 * allocation at `ptr` is freed through the entry point of its version. */
static CUresult pitch_settle(int d, uint64_t reserved, uint64_t bytes, uint64_t ptr, int v1)
{
    uint64_t actual = gs_charge_size(d, bytes);
    int tracked;
    if (actual <= reserved) {
        gs_alloc_undo(d, reserved - actual);
    } else if (gs_alloc_begin(d, actual - reserved, &tracked) != CUDA_SUCCESS) {
        /* A pitch wider than expected that does not fit. */
        if (v1)
            (void)(gs_cu.cuMemFree ? gs_cu.cuMemFree((CUdeviceptr_v1)ptr) : CUDA_SUCCESS);
        else
            gs_cu.cuMemFree_v2(ptr);
        gs_alloc_undo(d, reserved);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (gs_alloc_end(CUDA_SUCCESS, 1, d, actual, &gs_pointers, ptr)) {
        if (v1)
            (void)(gs_cu.cuMemFree ? gs_cu.cuMemFree((CUdeviceptr_v1)ptr) : CUDA_SUCCESS);
        else
            gs_cu.cuMemFree_v2(ptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int elem)
{
    GS_ENTER_OR_RETURN(cuMemAllocPitch_v2);
    int d;
    GS_ALLOC_TARGET(d, dptr, gs_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, elem));
    if (!pitch || width > (SIZE_MAX >> 1) || !height)
        return gs_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    uint64_t widest = ((uint64_t)width + GS_PITCH_ALIGN - 1) / GS_PITCH_ALIGN * GS_PITCH_ALIGN;
    if (widest && height > UINT64_MAX / widest)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t reserved = gs_charge_size(d, widest * height);
    int tracked;
    CUresult rc = gs_alloc_begin(d, reserved, &tracked);
    if (rc)
        return rc;
    rc = gs_cu.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS || !tracked) {
        if (tracked)
            gs_alloc_undo(d, reserved);
        return rc;
    }
    return pitch_settle(d, reserved, (uint64_t)*pitch * height, *dptr, 0);
}

/* The CUDA 3.1 entry point, still exported by the driver (32-bit pointer and sizes): a program linked to libcuda
 * that declares it reaches it without any lookup, so it is charged like the current one. */
GS_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                   unsigned int height, unsigned int elem)
{
    GS_ENTER_OR_RETURN(cuMemAllocPitch);
    int d;
    GS_ALLOC_TARGET(d, dptr, gs_cu.cuMemAllocPitch(dptr, pitch, width, height, elem));
    if (!pitch || !height)
        return gs_cu.cuMemAllocPitch(dptr, pitch, width, height, elem);
    uint64_t widest = ((uint64_t)width + GS_PITCH_ALIGN - 1) / GS_PITCH_ALIGN * GS_PITCH_ALIGN;
    uint64_t reserved = gs_charge_size(d, widest * height); /* 33 bits x 32 bits: no overflow */
    int tracked;
    CUresult rc = gs_alloc_begin(d, reserved, &tracked);
    if (rc)
        return rc;
    rc = gs_cu.cuMemAllocPitch(dptr, pitch, width, height, elem);
    if (rc != CUDA_SUCCESS || !tracked) {
        if (tracked)
            gs_alloc_undo(d, reserved);
        return rc;
    }
    return pitch_settle(d, reserved, (uint64_t)*pitch * height, *dptr, 1);
}

static CUresult from_pool(gs_pfn_cuMemAllocFromPoolAsync real, gs_pfn_cuMemFreeAsync free_async, CUdeviceptr *dptr,
                          size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    int d;
    GS_ALLOC_TARGET(d, dptr, real(dptr, bytesize, pool, stream));
    int pd, id = gs_pool_lookup(pool, &pd);
    if (id) {
        if (pd < 0)
            return real(dptr, bytesize, pool, stream); /* a host pool: not device memory */
        d = pd;
    }
    GS_POOL_TRACKED(d, id, gs_charge_size(d, bytesize), real(dptr, bytesize, pool, stream), *dptr,
                    free_async(*dptr, stream));
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocFromPoolAsync);
    return from_pool(gs_cu.cuMemAllocFromPoolAsync, gs_cu.cuMemFreeAsync, dptr, bytesize, pool, stream);
}

GS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemAllocFromPoolAsync_ptsz);
    return from_pool(gs_cu.cuMemAllocFromPoolAsync_ptsz, gs_cu.cuMemFreeAsync_ptsz, dptr, bytesize, pool, stream);
}

GS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    GS_ENTER_OR_RETURN(cuMemFree_v2);
    GS_UNTRACK(&gs_pointers, dptr, gs_cu.cuMemFree_v2(dptr));
}

GS_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    GS_ENTER_OR_RETURN(cuMemFree);
    GS_UNTRACK(&gs_pointers, dptr, gs_cu.cuMemFree(dptr));
}

/* --- stream-ordered frees ------------------------------------------------------------------------------------ */

static void give_back_in_stream_order(void *entry)
{
    gs_free_entry(entry);
    free(entry);
}

/* cuMemFreeAsync frees when the stream reaches it: the charge goes back then. When the stream has finished all
 * its work after the free was queued (cuStreamQuery: the free itself has run), at once; otherwise from a host
 * function queued behind the free. While the stream is being captured into a graph nothing is freed now (the
 * graph's memory stays reserved for the graph), and the charge stays. Without cuLaunchHostFunc the charge goes
 * back at once. */
static CUresult free_async(gs_pfn_cuMemFreeAsync real, gs_pfn_cuLaunchHostFunc host_fn,
                           gs_pfn_cuStreamIsCapturing capturing, gs_pfn_cuStreamQuery query, CUdeviceptr dptr,
                           CUstream stream)
{
    struct gs_ptr_entry e;
    int had = gs_free_begin(&gs_pointers, dptr, &e);
    CUresult rc = real(dptr, stream);
    if (!had || rc != CUDA_SUCCESS) {
        gs_free_end(rc, had, &gs_pointers, &e);
        return rc;
    }
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (capturing && capturing(stream, &status) == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE)
        return rc;
    if (query && query(stream) == CUDA_SUCCESS) { /* checked after the free was queued: it has run */
        gs_free_entry(&e);
        return rc;
    }
    struct gs_ptr_entry *later = host_fn ? malloc(sizeof *later) : NULL;
    if (later) {
        *later = e;
        if (host_fn(stream, give_back_in_stream_order, later) == CUDA_SUCCESS)
            return rc;
        free(later);
    }
    GS_DEBUG("cannot queue the release of %llu bytes behind their free; giving them back now",
             (unsigned long long)e.bytes);
    gs_free_entry(&e);
    return rc;
}

GS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemFreeAsync);
    return free_async(gs_cu.cuMemFreeAsync, gs_cu.cuLaunchHostFunc, gs_cu.cuStreamIsCapturing, gs_cu.cuStreamQuery,
                      dptr, stream);
}

GS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    GS_ENTER_OR_RETURN(cuMemFreeAsync_ptsz);
    return free_async(gs_cu.cuMemFreeAsync_ptsz, gs_cu.cuLaunchHostFunc_ptsz, gs_cu.cuStreamIsCapturing_ptsz,
                      gs_cu.cuStreamQuery_ptsz, dptr, stream);
}
