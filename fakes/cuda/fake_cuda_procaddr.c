/* Fake driver: cuGetProcAddress. Callers ask for a base name ("cuMemAlloc", "cuLaunchKernel") with the CUDA
 * version they were built for and stream flags; the driver answers with the matching versioned entry point and,
 * with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, the per-thread-stream (_ptsz) variant. The addresses are
 * those of the hidden implementations, not of the exported (interposable) names. */
#include <stdio.h>
#include <string.h>

#include "fake_cuda_api.h"

/* One row per (base name, since-version): the legacy-stream and per-thread-stream entry points. Rows of one
 * name are ordered newest first. */
struct proc {
    const char *name;
    int since;
    void *legacy;
    void *ptsz;
};

#define P(name, since, fn) {name, since, (void *)&impl_##fn, (void *)&impl_##fn}
#define S(name, since, fn) {name, since, (void *)&impl_##fn, (void *)&impl_##fn##_ptsz}

static const struct proc procs[] = {
    P("cuInit", 2000, cuInit),
    P("cuDriverGetVersion", 2020, cuDriverGetVersion),
    P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    P("cuGetProcAddress", 11030, cuGetProcAddress),
    P("cuDeviceGetCount", 2000, cuDeviceGetCount),
    P("cuDeviceGet", 2000, cuDeviceGet),
    P("cuDeviceGetName", 2000, cuDeviceGetName),
    P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
    P("cuDeviceGetUuid", 9020, cuDeviceGetUuid),
    P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    P("cuCtxCreate", 12050, cuCtxCreate_v4),
    P("cuCtxCreate", 11040, cuCtxCreate_v3),
    P("cuCtxCreate", 3020, cuCtxCreate_v2),
    P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    P("cuCtxGetDevice", 2000, cuCtxGetDevice),
    P("cuCtxSynchronize", 2000, cuCtxSynchronize),
    P("cuModuleGetFunction", 2000, cuModuleGetFunction),
    P("cuGetExportTable", 3000, cuGetExportTable),
    P("cuMemAlloc", 3020, cuMemAlloc_v2),
    P("cuMemAlloc", 2000, cuMemAlloc),
    P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    P("cuMemAllocPitch", 2000, cuMemAllocPitch),
    P("cuMemAllocManaged", 6000, cuMemAllocManaged),
    P("cuMemFree", 3020, cuMemFree_v2),
    P("cuMemFree", 2000, cuMemFree),
    P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    P("cuArrayCreate", 3020, cuArrayCreate_v2),
    P("cuArrayCreate", 2000, cuArrayCreate),
    P("cuArray3DCreate", 3020, cuArray3DCreate_v2),
    P("cuArray3DCreate", 2000, cuArray3DCreate),
    P("cuArrayDestroy", 2000, cuArrayDestroy),
    P("cuMipmappedArrayCreate", 5000, cuMipmappedArrayCreate),
    P("cuMipmappedArrayDestroy", 5000, cuMipmappedArrayDestroy),
    P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
    P("cuIpcOpenMemHandle", 11000, cuIpcOpenMemHandle_v2),
    P("cuIpcCloseMemHandle", 4010, cuIpcCloseMemHandle),
    P("cuModuleLoad", 2000, cuModuleLoad),
    P("cuModuleLoadData", 2000, cuModuleLoadData),
    P("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
    P("cuModuleUnload", 2000, cuModuleUnload),
    P("cuGraphCreate", 10000, cuGraphCreate),
    P("cuGraphDestroy", 10000, cuGraphDestroy),
    P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
    S("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
    S("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    S("cuMemAllocAsync", 11020, cuMemAllocAsync),
    S("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    S("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemPoolCreate", 11020, cuMemPoolCreate),
    P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    P("cuMemCreate", 10020, cuMemCreate),
    P("cuMemRelease", 10020, cuMemRelease),
    P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    S("cuLaunchKernel", 4000, cuLaunchKernel),
    S("cuLaunchKernelEx", 11060, cuLaunchKernelEx),
    S("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel),
    S("cuGraphLaunch", 10000, cuGraphLaunch),
    S("cuStreamSynchronize", 2000, cuStreamSynchronize),
};

/* With FAKE_CUDA_DISTINCT_ENTRY_POINTS=1 these names are answered with entry points of their own, at other
 * addresses than the exported symbols (a real driver may do that): the shim must then match by name. */
#define DISTINCT(ret, fn, params, args)           \
    static ret distinct_##fn params               \
    {                                             \
        return impl_##fn args;                    \
    }
DISTINCT(CUresult, cuMemAlloc_v2, (CUdeviceptr *d, size_t b), (d, b))
DISTINCT(CUresult, cuMemFree_v2, (CUdeviceptr d), (d))
DISTINCT(CUresult, cuMemAllocAsync, (CUdeviceptr *d, size_t b, CUstream s), (d, b, s))
DISTINCT(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *d, size_t b, CUstream s), (d, b, s))
DISTINCT(CUresult, cuMemFreeAsync, (CUdeviceptr d, CUstream s), (d, s))
DISTINCT(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr d, CUstream s), (d, s))

static const struct proc distinct[] = {
    {"cuMemAlloc", 3020, (void *)&distinct_cuMemAlloc_v2, (void *)&distinct_cuMemAlloc_v2},
    {"cuMemFree", 3020, (void *)&distinct_cuMemFree_v2, (void *)&distinct_cuMemFree_v2},
    {"cuMemAllocAsync", 11020, (void *)&distinct_cuMemAllocAsync, (void *)&distinct_cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", 11020, (void *)&distinct_cuMemFreeAsync, (void *)&distinct_cuMemFreeAsync_ptsz},
};

static void *distinct_lookup(const char *symbol, int version, cuuint64_t flags)
{
    static int on = -1;
    if (on < 0)
        on = fake_env_u64("FAKE_CUDA_DISTINCT_ENTRY_POINTS", 0) != 0;
    for (size_t i = 0; on && i < sizeof distinct / sizeof distinct[0]; i++)
        if (!strcmp(distinct[i].name, symbol) && version >= distinct[i].since)
            return (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? distinct[i].ptsz : distinct[i].legacy;
    return NULL;
}

void *fake_proc_lookup_more(const char *symbol, int version, int *version_too_low); /* fake_cuda_procs.c */

void *fake_proc_lookup(const char *symbol, int version, cuuint64_t flags, int *version_too_low)
{
    *version_too_low = 0;
    if (!symbol)
        return NULL;
    void *own = distinct_lookup(symbol, version, flags);
    if (own)
        return own;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, symbol))
            continue;
        if (version < procs[i].since) {
            *version_too_low = 1;
            continue;
        }
        *version_too_low = 0;
        return (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? procs[i].ptsz : procs[i].legacy;
    }
    if (*version_too_low)
        return NULL;
    return fake_proc_lookup_more(symbol, version, version_too_low);
}

CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status)
{
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    int too_low;
    void *p = fake_proc_lookup(symbol, version, flags, &too_low);
    *pfn = p;
    static int trace = -1;
    if (trace < 0)
        trace = fake_env_u64("FAKE_CUDA_TRACE", 0) != 0;
    if (trace && !p) /* FAKE_CUDA_TRACE=1: the names a client asked for that the fake does not have */
        fprintf(stderr, "fake libcuda: cuGetProcAddress(%s, %d, %llu): %s\n", symbol, version,
                (unsigned long long)flags, too_low ? "version too low" : "not found");
    if (status)
        *status = p ? CU_GET_PROC_ADDRESS_SUCCESS
                    : too_low ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
FAKE_EXPORT(cuGetProcAddress_v2)

CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    return impl_cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
FAKE_EXPORT(cuGetProcAddress)
