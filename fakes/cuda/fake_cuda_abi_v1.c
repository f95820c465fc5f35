/* Fake driver: entry points under the names of their first ABI. cuda.h maps each of these names to a newer
 * version (`#define cuCtxPushCurrent cuCtxPushCurrent_v2`), so programs built against it never ask for them, but
 * the real libcuda still exports them, and clients that look the driver up by name with dlsym find them: cuBLASLt
 * reads all of the names below at its first handle and fails its initialisation ("Driver API initialization
 * failed", CUBLAS_STATUS_INTERNAL_ERROR) when one is missing. Where the first ABI has the same parameters as the
 * current one (the context stack, the primary context, the stream memory operations) the call is the current
 * one; where the parameters differ the old layout is honoured. */
#include "fake_cuda_api.h"

#pragma GCC visibility push(hidden)
CUresult impl_cuCtxPushCurrent_v2(CUcontext ctx);
CUresult impl_cuCtxPopCurrent_v2(CUcontext *out);
CUresult impl_cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult impl_cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags);
CUresult impl_cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, unsigned long long value, unsigned flags);
CUresult impl_cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags);
CUresult impl_cuStreamWaitValue64_v2(CUstream s, CUdeviceptr addr, unsigned long long value, unsigned flags);
CUresult impl_cuStreamBatchMemOp_v2(CUstream s, unsigned count, void *ops, unsigned flags);
CUresult impl_cuGraphKernelNodeGetParams_v2(void);
CUresult impl_cuGraphExecKernelNodeSetParams_v2(void);
CUresult impl_cuMemPrefetchAsync_v2(void);
#pragma GCC visibility pop

/* --- the context stack (CUDA 3.x names; since 4.0 the _v2 ones) --------------------------------------------- */
CUresult impl_cuCtxPushCurrent(CUcontext ctx)
{
    return impl_cuCtxPushCurrent_v2(ctx);
}
FAKE_EXPORT(cuCtxPushCurrent)

CUresult impl_cuCtxPopCurrent(CUcontext *out)
{
    return impl_cuCtxPopCurrent_v2(out);
}
FAKE_EXPORT(cuCtxPopCurrent)

/* --- the primary context (before 11.0) ----------------------------------------------------------------------- */
CUresult impl_cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return impl_cuDevicePrimaryCtxRelease_v2(dev);
}
FAKE_EXPORT(cuDevicePrimaryCtxRelease)

CUresult impl_cuDevicePrimaryCtxReset(CUdevice dev)
{
    return impl_cuDevicePrimaryCtxReset_v2(dev);
}
FAKE_EXPORT(cuDevicePrimaryCtxReset)

/* --- stream memory operations (CUDA 8; the _v2 names since 11.7 take the same parameters) -------------------- */
CUresult impl_cuStreamWriteValue32(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags)
{
    return impl_cuStreamWriteValue32_v2(s, addr, value, flags);
}
FAKE_EXPORT(cuStreamWriteValue32)

CUresult impl_cuStreamWriteValue64(CUstream s, CUdeviceptr addr, unsigned long long value, unsigned flags)
{
    return impl_cuStreamWriteValue64_v2(s, addr, value, flags);
}
FAKE_EXPORT(cuStreamWriteValue64)

CUresult impl_cuStreamWaitValue32(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags)
{
    return impl_cuStreamWaitValue32_v2(s, addr, value, flags);
}
FAKE_EXPORT(cuStreamWaitValue32)

CUresult impl_cuStreamWaitValue64(CUstream s, CUdeviceptr addr, unsigned long long value, unsigned flags)
{
    return impl_cuStreamWaitValue64_v2(s, addr, value, flags);
}
FAKE_EXPORT(cuStreamWaitValue64)

CUresult impl_cuStreamBatchMemOp(CUstream s, unsigned count, void *ops, unsigned flags)
{
    return impl_cuStreamBatchMemOp_v2(s, count, ops, flags);
}
FAKE_EXPORT(cuStreamBatchMemOp)

/* --- kernel nodes (before 12.0: CUDA_KERNEL_NODE_PARAMS without its kern and ctx fields). The fake's graphs
 * hold no kernel nodes, so these answer as their _v2 names do. -------------------------------------------------- */
CUresult impl_cuGraphKernelNodeGetParams(CUgraphNode node, void *params)
{
    (void)node, (void)params;
    return impl_cuGraphKernelNodeGetParams_v2();
}
FAKE_EXPORT(cuGraphKernelNodeGetParams)

CUresult impl_cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node, const void *params)
{
    (void)exec, (void)node, (void)params;
    return impl_cuGraphExecKernelNodeSetParams_v2();
}
FAKE_EXPORT(cuGraphExecKernelNodeSetParams)

/* --- prefetching managed memory (before 12.2: to a device ordinal, not a CUmemLocation): not modelled, as
 * cuMemPrefetchAsync_v2 -------------------------------------------------------------------------------------------- */
CUresult impl_cuMemPrefetchAsync(CUdeviceptr addr, size_t bytes, CUdevice dev, CUstream s)
{
    (void)addr, (void)bytes, (void)dev, (void)s;
    return impl_cuMemPrefetchAsync_v2();
}
FAKE_EXPORT(cuMemPrefetchAsync)
