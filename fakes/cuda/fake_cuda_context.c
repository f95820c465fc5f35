/* Fake driver: what contexts answer beyond creation (fake_cuda_init.c): the context stack, limits, flags and
 * cache settings the runtime and frameworks read, and error strings. */
#include <string.h>

#include "fake_cuda_mem.h"

#pragma GCC diagnostic ignored "-Wunused-parameter" /* entry points keep cuda.h's parameter lists */

#define STACK_DEPTH 16
static __thread struct fake_ctx *stack[STACK_DEPTH];
static __thread int depth;

CUresult impl_cuCtxPushCurrent_v2(CUcontext ctx)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = fake_current;
    fake_current = (struct fake_ctx *)ctx;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxPushCurrent_v2)

CUresult impl_cuCtxPopCurrent_v2(CUcontext *out)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fake_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (out)
        *out = (CUcontext)fake_current;
    fake_current = depth ? stack[--depth] : NULL;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxPopCurrent_v2)

CUresult impl_cuCtxGetApiVersion(CUcontext ctx, unsigned *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 3020;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetApiVersion)

CUresult impl_cuCtxGetFlags(unsigned *flags)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    return fake_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
FAKE_EXPORT(cuCtxGetFlags)

CUresult impl_cuCtxSetFlags(unsigned flags)
{
    return fake_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
FAKE_EXPORT(cuCtxSetFlags)

CUresult impl_cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = ctx ? (struct fake_ctx *)ctx : fake_current;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *id = c->id;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetId)

CUresult impl_cuCtxGetDevice_v2(CUdevice *dev, CUcontext ctx)
{
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = ctx ? (struct fake_ctx *)ctx : fake_current;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = c->device;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetDevice_v2)

CUresult impl_cuCtxSynchronize_v2(CUcontext ctx)
{
    return impl_cuCtxSynchronize();
}
FAKE_EXPORT(cuCtxSynchronize_v2)

CUresult impl_cuCtxGetCacheConfig(int *config)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    *config = 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetCacheConfig)

CUresult impl_cuCtxSetCacheConfig(int config)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxSetCacheConfig)

CUresult impl_cuCtxGetSharedMemConfig(int *config)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    *config = 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetSharedMemConfig)

CUresult impl_cuCtxSetSharedMemConfig(int config)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxSetSharedMemConfig)

CUresult impl_cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetStreamPriorityRange)

CUresult impl_cuCtxResetPersistingL2Cache(void)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxResetPersistingL2Cache)

CUresult impl_cuCtxEnablePeerAccess(CUcontext peer, unsigned flags)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}
FAKE_EXPORT(cuCtxEnablePeerAccess)

CUresult impl_cuCtxDisablePeerAccess(CUcontext peer)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}
FAKE_EXPORT(cuCtxDisablePeerAccess)

CUresult impl_cuCtxGetExecAffinity(void *affinity, int type)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}
FAKE_EXPORT(cuCtxGetExecAffinity)

/* --- error strings -------------------------------------------------------------------------------------------- */
static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static int error_index(int code)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code)
            return (int)i;
    return -1;
}

CUresult impl_cuGetErrorString(CUresult error, const char **text)
{
    int i = error_index(error);
    if (!text)
        return CUDA_ERROR_INVALID_VALUE;
    *text = i >= 0 ? errors[i].text : NULL;
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuGetErrorString)

CUresult impl_cuGetErrorName(CUresult error, const char **name)
{
    int i = error_index(error);
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    *name = i >= 0 ? errors[i].name : NULL;
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuGetErrorName)

CUresult impl_cuFlushGPUDirectRDMAWrites(int target, int scope)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuFlushGPUDirectRDMAWrites)

/* --- features the fake GPUs do not have (multicast objects, green contexts, driver logs, ...) ----------------
 * Looked up eagerly by PyTorch's driver wrapper, so they must exist; calling one says NOT_SUPPORTED. */
#define UNSUPPORTED(name)                          \
    CUresult impl_##name(void)                     \
    {                                              \
        return CUDA_ERROR_NOT_SUPPORTED;           \
    }                                              \
    FAKE_EXPORT(name)

UNSUPPORTED(cuMulticastCreate)
UNSUPPORTED(cuMulticastAddDevice)
UNSUPPORTED(cuMulticastBindMem)
UNSUPPORTED(cuMulticastBindAddr)
UNSUPPORTED(cuMulticastUnbind)
UNSUPPORTED(cuMulticastGetGranularity)
UNSUPPORTED(cuGreenCtxCreate)
UNSUPPORTED(cuGreenCtxDestroy)
UNSUPPORTED(cuGreenCtxStreamCreate)
UNSUPPORTED(cuGreenCtxGetDevResource)
UNSUPPORTED(cuGreenCtxRecordEvent)
UNSUPPORTED(cuGreenCtxWaitEvent)
UNSUPPORTED(cuCtxFromGreenCtx)
UNSUPPORTED(cuDevSmResourceSplitByCount)
UNSUPPORTED(cuDeviceGetDevResource)
UNSUPPORTED(cuCtxGetDevResource)
UNSUPPORTED(cuDevResourceGenerateDesc)
UNSUPPORTED(cuLogsRegisterCallback)
UNSUPPORTED(cuLogsUnregisterCallback)
UNSUPPORTED(cuLogsCurrent)
UNSUPPORTED(cuLogsDumpToFile)
UNSUPPORTED(cuLogsDumpToMemory)
UNSUPPORTED(cuDeviceGetLuid)
UNSUPPORTED(cuDeviceGetNvSciSyncAttributes)
UNSUPPORTED(cuMemMapArrayAsync)
UNSUPPORTED(cuGraphNodeGetType)
UNSUPPORTED(cuGraphKernelNodeGetParams_v2)
UNSUPPORTED(cuGraphExecKernelNodeSetParams_v2)
UNSUPPORTED(cuGraphInstantiate)
UNSUPPORTED(cuGraphExecUpdate_v2)
UNSUPPORTED(cuImportExternalMemory)
UNSUPPORTED(cuDestroyExternalMemory)
UNSUPPORTED(cuImportExternalSemaphore)
UNSUPPORTED(cuDestroyExternalSemaphore)
UNSUPPORTED(cuMemAdvise_v2)
UNSUPPORTED(cuMemPrefetchAsync_v2)
UNSUPPORTED(cuMemRangeGetAttribute)
UNSUPPORTED(cuTensorMapEncodeTiled)
UNSUPPORTED(cuCheckpointProcessGetState)
