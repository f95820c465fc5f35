/* cuInit and context creation: the device table is built once the driver is up, and a process's first
 * context on a GPU is charged against the limit (GPUSHARE_CONTEXT_RESERVE) before it is created. On a GPU with
 * a compute share the process learns its NVML pid while it creates the context (gs_pidmap.h). */
#include "gs_log.h"
#include "gs_shim.h"
#include "gs_throttle.h"
#include "gs_context.h"

GS_EXPORT CUresult cuInit(unsigned int flags)
{
    CUresult rc = gs_enter();
    if (rc)
        return rc;
    if (!gs_cu.cuInit)
        return CUDA_ERROR_NOT_INITIALIZED;
    rc = gs_cu.cuInit(flags);
    if (rc == CUDA_SUCCESS && gs_devices_setup() != 0 && gs_state == GS_STATE_REFUSED)
        return CUDA_ERROR_NOT_PERMITTED;
    return rc;
}

GS_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    GS_CONTEXT_HOOK(cuDevicePrimaryCtxRetain, dev, gs_cu.cuDevicePrimaryCtxRetain(pctx, dev));
}

GS_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    GS_CONTEXT_HOOK(cuCtxCreate_v2, dev, gs_cu.cuCtxCreate_v2(pctx, flags, dev));
}

GS_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags,
                                  CUdevice dev)
{
    GS_CONTEXT_HOOK(cuCtxCreate_v3, dev, gs_cu.cuCtxCreate_v3(pctx, params, n, flags, dev));
}

GS_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    GS_CONTEXT_HOOK(cuCtxCreate_v4, dev, gs_cu.cuCtxCreate_v4(pctx, params, flags, dev));
}
