/* Memory another process shares through cuIpcOpenMemHandle: mapped into this process, it counts against this
 * container's limit too (the size is the driver's, from cuMemGetAddressRange). A container cannot grow past
 * its limit by having a neighbour allocate for it. Two processes of one container sharing memory this way are
 * both charged for it. */
#include "gs_alloc.h"
#include "gs_log.h"

static CUresult open_handle(gs_pfn_cuIpcOpenMemHandle real, CUdeviceptr *dptr, CUipcMemHandle handle,
                            unsigned int flags)
{
    int d;
    GS_ALLOC_TARGET(d, dptr, real(dptr, handle, flags));
    CUresult rc = real(dptr, handle, flags);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUdeviceptr base = 0;
    size_t size = 0;
    if (!gs_cu.cuMemGetAddressRange_v2 || gs_cu.cuMemGetAddressRange_v2(&base, &size, *dptr) != CUDA_SUCCESS) {
        GS_ERROR("cannot tell the size of memory opened through cuIpcOpenMemHandle; refused");
        gs_cu.cuIpcCloseMemHandle(*dptr);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    /* Opened first (the size is known only then), so a handle that does not fit is closed again. */
    uint64_t charge = gs_charge_size(d, size);
    int tracked;
    rc = gs_alloc_begin(d, charge, &tracked);
    if (rc == CUDA_SUCCESS && gs_alloc_end(CUDA_SUCCESS, tracked, d, charge, &gs_pointers, *dptr) != CUDA_SUCCESS)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc != CUDA_SUCCESS) {
        gs_cu.cuIpcCloseMemHandle(*dptr);
        *dptr = 0;
    }
    return rc;
}

GS_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{
    GS_ENTER_OR_RETURN(cuIpcOpenMemHandle_v2);
    if (!gs_cu.cuIpcCloseMemHandle)
        return CUDA_ERROR_NOT_SUPPORTED;
    return open_handle(gs_cu.cuIpcOpenMemHandle_v2, dptr, handle, flags);
}

GS_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{
    GS_ENTER_OR_RETURN(cuIpcOpenMemHandle);
    if (!gs_cu.cuIpcCloseMemHandle)
        return CUDA_ERROR_NOT_SUPPORTED;
    return open_handle(gs_cu.cuIpcOpenMemHandle, dptr, handle, flags);
}

GS_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    GS_ENTER_OR_RETURN(cuIpcCloseMemHandle);
    GS_UNTRACK(&gs_pointers, dptr, gs_cu.cuIpcCloseMemHandle(dptr));
}
