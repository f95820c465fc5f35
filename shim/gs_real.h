/* The real driver: libcuda.so.1 and libnvidia-ml.so.1 loaded with dlopen (paths overridable in the test build) and
 * their entry points as typed function pointers. GS_CUDA_HOOKED lists what the shim intercepts (each has an
 * exported hook of the same name), GS_CUDA_USED what it only calls. */
#ifndef GS_REAL_H
#define GS_REAL_H

#include "gs_cuda_types.h"

#define GS_LAUNCH_PARAMS                                                                                      \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, \
     CUstream stream, void **params, void **extra)
#define GS_COOP_PARAMS                                                                                        \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, \
     CUstream stream, void **params)

/* X(name, parameter list) */
#define GS_CUDA_HOOKED(X)                                                                                       \
    X(cuInit, (unsigned int flags))                                                                             \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int version, cuuint64_t flags))                       \
    X(cuGetProcAddress_v2,                                                                                      \
      (const char *symbol, void **pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *status)) \
    X(cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev))                                               \
    X(cuGetExportTable, (const void **table, const CUuuid *id))                                                 \
    X(cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev))                                     \
    X(cuCtxCreate_v3, (CUcontext * pctx, CUexecAffinityParam * params, int n, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v4, (CUcontext * pctx, CUctxCreateParams * params, unsigned int flags, CUdevice dev))         \
    X(cuMemAlloc_v2, (CUdeviceptr * dptr, size_t bytesize))                                                     \
    X(cuMemAllocPitch_v2, (CUdeviceptr * dptr, size_t *pitch, size_t width, size_t height, unsigned int elem))  \
    X(cuMemAllocManaged, (CUdeviceptr * dptr, size_t bytesize, unsigned int flags))                             \
    X(cuMemFree_v2, (CUdeviceptr dptr))                                                                         \
    X(cuMemAlloc, (CUdeviceptr_v1 * dptr, unsigned int bytesize))                                              \
    X(cuMemAllocPitch, (CUdeviceptr_v1 * dptr, unsigned int *pitch, unsigned int width, unsigned int height,    \
                        unsigned int elem))                                                                     \
    X(cuMemFree, (CUdeviceptr_v1 dptr))                                                                         \
    X(cuArrayCreate_v2, (CUarray * arr, const CUDA_ARRAY_DESCRIPTOR *desc))                                     \
    X(cuArray3DCreate_v2, (CUarray * arr, const CUDA_ARRAY3D_DESCRIPTOR *desc))                                 \
    X(cuArrayCreate, (CUarray * arr, const CUDA_ARRAY_DESCRIPTOR_v1 *desc))                                     \
    X(cuArray3DCreate, (CUarray * arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc))                                 \
    X(cuArrayDestroy, (CUarray arr))                                                                            \
    X(cuMipmappedArrayCreate, (CUmipmappedArray * arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray arr))                                                          \
    X(cuIpcOpenMemHandle, (CUdeviceptr * dptr, CUipcMemHandle handle, unsigned int flags))                      \
    X(cuIpcOpenMemHandle_v2, (CUdeviceptr * dptr, CUipcMemHandle handle, unsigned int flags))                   \
    X(cuIpcCloseMemHandle, (CUdeviceptr dptr))                                                                  \
    X(cuModuleLoad, (CUmodule * mod, const char *path))                                                         \
    X(cuModuleLoadData, (CUmodule * mod, const void *image))                                                    \
    X(cuModuleLoadDataEx, (CUmodule * mod, const void *image, unsigned int n, int *options, void **values))     \
    X(cuModuleLoadFatBinary, (CUmodule * mod, const void *fatbin))                                              \
    X(cuModuleUnload, (CUmodule mod))                                                                           \
    X(cuLibraryLoadData, (CUlibrary * lib, const void *code, void *jit_options, void **jit_values,              \
                          unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib))                \
    X(cuLibraryLoadFromFile, (CUlibrary * lib, const char *path, void *jit_options, void **jit_values,          \
                              unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib))            \
    X(cuLibraryUnload, (CUlibrary lib))                                                                         \
    X(cuGraphAddMemAllocNode, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,        \
                               CUDA_MEM_ALLOC_NODE_PARAMS *params))                                             \
    X(cuGraphAddNode, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,                \
                       CUgraphNodeParams *params))                                                              \
    X(cuGraphAddNode_v2, (CUgraphNode * node, CUgraph graph, const CUgraphNode *deps, const void *edges,        \
                          size_t ndeps, CUgraphNodeParams *params))                                             \
    X(cuMemAllocAsync, (CUdeviceptr * dptr, size_t bytesize, CUstream stream))                                  \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUstream stream))                             \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream))       \
    X(cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr * dptr, size_t bytesize, CUmemoryPool pool, CUstream stream))  \
    X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream))                                                      \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream))                                                 \
    X(cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps *props))                                      \
    X(cuMemPoolDestroy, (CUmemoryPool pool))                                                                    \
    X(cuMemCreate, (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp *prop,        \
                    unsigned long long flags))                                                                  \
    X(cuMemRelease, (CUmemGenericAllocationHandle handle))                                                      \
    X(cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,              \
                 unsigned long long flags))                                                                     \
    X(cuMemUnmap, (CUdeviceptr ptr, size_t size))                                                               \
    X(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle * handle, void *addr))                         \
    X(cuMemExportToShareableHandle, (void *shareable, CUmemGenericAllocationHandle handle, int type,            \
                                     unsigned long long flags))                                                 \
    X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle * handle, void *shareable, int type))       \
    X(cuMemPoolSetAttribute, (CUmemoryPool pool, int attr, void *value))                                        \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep))                                                        \
    X(cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool))                                                    \
    X(cuCtxSetLimit, (int limit, size_t value))                                                                 \
    X(cuMemGetInfo_v2, (size_t * free_bytes, size_t *total_bytes))                                              \
    X(cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev))                                                      \
    X(cuLaunchKernel, GS_LAUNCH_PARAMS)                                                                         \
    X(cuLaunchKernel_ptsz, GS_LAUNCH_PARAMS)                                                                    \
    X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra))              \
    X(cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra))         \
    X(cuLaunchCooperativeKernel, GS_COOP_PARAMS)                                                                \
    X(cuLaunchCooperativeKernel_ptsz, GS_COOP_PARAMS)                                                           \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream))                                                       \
    X(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream))

#define GS_CUDA_USED(X)                                                                                   \
    X(cuDeviceGetCount, (int *count))                                                                     \
    X(cuDeviceGet, (CUdevice * device, int ordinal))                                                      \
    X(cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev))                                                     \
    X(cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev))                                                  \
    X(cuCtxGetDevice, (CUdevice * device))                                                                \
    X(cuMemGetAllocationGranularity, (size_t * granularity, const CUmemAllocationProp *prop, int option)) \
    X(cuLaunchHostFunc, (CUstream stream, CUhostFn fn, void *data))                                       \
    X(cuLaunchHostFunc_ptsz, (CUstream stream, CUhostFn fn, void *data))                                  \
    X(cuStreamIsCapturing, (CUstream stream, int *status))                                                \
    X(cuStreamIsCapturing_ptsz, (CUstream stream, int *status))                                           \
    X(cuStreamQuery, (CUstream stream))                                                                   \
    X(cuStreamQuery_ptsz, (CUstream stream))                                                              \
    X(cuMemGetAddressRange_v2, (CUdeviceptr * base, size_t *size, CUdeviceptr dptr))                     \
    X(cuMemGetAllocationPropertiesFromHandle, (CUmemAllocationProp * prop, CUmemGenericAllocationHandle h)) \
    X(cuDeviceGetAttribute, (int *value, int attrib, CUdevice dev))                                       \
    X(cuCtxGetLimit, (size_t * value, int limit))                                                         \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev))

#define GS_NVML_HOOKED(X)                                                            \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t * memory))         \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t * memory))

#define GS_NVML_USED(X)                                                                                 \
    X(nvmlInit_v2, (void))                                                                              \
    X(nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *device))                              \
    X(nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length))                        \
    X(nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int *index))                                   \
    X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t device, nvmlUtilization_t *utilization))             \
    /* per-process figures (gs_usage.c has their layouts) */                                            \
    X(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t device, unsigned int *count, void *infos)) \
    X(nvmlDeviceGetComputeRunningProcesses_v2, (nvmlDevice_t device, unsigned int *count, void *infos)) \
    X(nvmlDeviceGetComputeRunningProcesses, (nvmlDevice_t device, unsigned int *count, void *infos))    \
    X(nvmlDeviceGetProcessUtilization,                                                                  \
      (nvmlDevice_t device, void *samples, unsigned int *count, unsigned long long last_seen))          \
    X(nvmlDeviceGetProcessesUtilizationInfo, (nvmlDevice_t device, void *info))

#define GS_PFN_TYPEDEF(name, params) typedef CUresult(*gs_pfn_##name) params;
GS_CUDA_HOOKED(GS_PFN_TYPEDEF)
GS_CUDA_USED(GS_PFN_TYPEDEF)
#undef GS_PFN_TYPEDEF
#define GS_PFN_TYPEDEF(name, params) typedef nvmlReturn_t(*gs_pfn_##name) params;
GS_NVML_HOOKED(GS_PFN_TYPEDEF)
GS_NVML_USED(GS_PFN_TYPEDEF)
#undef GS_PFN_TYPEDEF

#define GS_PFN_FIELD(name, params) gs_pfn_##name name;
struct gs_real_cuda {
    GS_CUDA_HOOKED(GS_PFN_FIELD)
    GS_CUDA_USED(GS_PFN_FIELD)
};
struct gs_real_nvml {
    GS_NVML_HOOKED(GS_PFN_FIELD)
    GS_NVML_USED(GS_PFN_FIELD)
};
#undef GS_PFN_FIELD

extern struct gs_real_cuda gs_cu;   /* filled by gs_real_load_cuda; NULL entries: the driver lacks them */
extern struct gs_real_nvml gs_nvml; /* filled by gs_real_load_nvml */

/* Code on the path of the exported dlsym: sanitizer runtimes call dlsym while they initialise, before their
 * shadow memory exists, so this code must not be instrumented. */
#define GS_NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

typedef void *(*gs_dlsym_fn)(void *handle, const char *symbol);
/* libc's dlsym (the shim exports its own). */
GS_NO_SANITIZE gs_dlsym_fn gs_real_dlsym(void);

/* Load the real libcuda ("libcuda.so.1"; the test build: GPUSHARE_REAL_LIBCUDA). 0, or -1 when it cannot be loaded. */
int gs_real_load_cuda(void);
/* Load the real NVML ("libnvidia-ml.so.1"; the test build: GPUSHARE_REAL_LIBNVML) once. 0, or -1. */
int gs_real_load_nvml(void);

#endif /* GS_REAL_H */
