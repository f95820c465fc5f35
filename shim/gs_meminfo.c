/* The virtual view through CUDA: total = min(limit, physical), used = the container's accounted usage, free
 * never negative and never above what the GPU really has free. Errors are the driver's own, never the shim's. */
#include "gs_region.h"
#include "gs_shim.h"

GS_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    GS_ENTER_OR_RETURN(cuMemGetInfo_v2);
    CUresult rc = gs_cu.cuMemGetInfo_v2(free_bytes, total_bytes);
    int d;
    if (rc != CUDA_SUCCESS || !free_bytes || !total_bytes || !gs_devices_ready() || !gs_any_limit ||
        gs_current_device(&d) != CUDA_SUCCESS || d < 0 || d >= gs_ndevs || !gs_devs[d].limit)
        return rc;
    const struct gs_dev *dev = &gs_devs[d];
    int charged;
    gs_ctx_charge(d, &charged); /* a process that asks has a context: count it, if it fits */
    gs_region_reap_lazily();
    uint64_t total = dev->limit < *total_bytes ? dev->limit : *total_bytes;
    uint64_t used = gs_region_usage(dev->rd);
    uint64_t free_v = used < total ? total - used : 0;
    if (free_v > *free_bytes)
        free_v = *free_bytes;
    *free_bytes = free_v;
    *total_bytes = total;
    return rc;
}

GS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    GS_ENTER_OR_RETURN(cuDeviceTotalMem_v2);
    CUresult rc = gs_cu.cuDeviceTotalMem_v2(bytes, dev);
    if (rc == CUDA_SUCCESS && bytes && gs_devices_ready() && dev >= 0 && dev < gs_ndevs && gs_devs[dev].limit &&
        gs_devs[dev].limit < *bytes)
        *bytes = gs_devs[dev].limit;
    return rc;
}
