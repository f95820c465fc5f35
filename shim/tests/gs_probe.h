/* The driver entry points the probe uses, and how it finds them:
 *   gpa       dlopen + dlsym("cuGetProcAddress_v2"), then everything through cuGetProcAddress (the CUDA runtime's way)
 *   gpa-ptsz  the same with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (per-thread default stream builds)
 *   dlsym     dlopen + dlsym of each versioned name
 *   linked    plain calls bound by the dynamic linker (gs_probe_linked only)
 * A base name "name@V" is looked up through cuGetProcAddress with CUDA version V (an old entry point). */
#ifndef GS_PROBE_H
#define GS_PROBE_H

#include "gs_cuda_types.h"

/* X(field, name for dlsym, base name for cuGetProcAddress, return type, parameters) */
#define PROBE_CUDA(X)                                                                                           \
    X(init, cuInit, "cuInit", CUresult, (unsigned int))                                                        \
    X(device_count, cuDeviceGetCount, "cuDeviceGetCount", CUresult, (int *))                                   \
    X(ctx_retain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice))     \
    X(ctx_set, cuCtxSetCurrent, "cuCtxSetCurrent", CUresult, (CUcontext))                                      \
    X(mem_alloc, cuMemAlloc_v2, "cuMemAlloc", CUresult, (CUdeviceptr *, size_t))                               \
    X(mem_alloc_pitch, cuMemAllocPitch_v2, "cuMemAllocPitch", CUresult,                                         \
      (CUdeviceptr *, size_t *, size_t, size_t, unsigned int))                                                  \
    X(mem_alloc_managed, cuMemAllocManaged, "cuMemAllocManaged", CUresult, (CUdeviceptr *, size_t, unsigned int)) \
    X(mem_free, cuMemFree_v2, "cuMemFree", CUresult, (CUdeviceptr))                                            \
    X(mem_alloc_async, cuMemAllocAsync, "cuMemAllocAsync", CUresult, (CUdeviceptr *, size_t, CUstream))        \
    X(mem_alloc_pool, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", CUresult,                             \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                                          \
    X(mem_free_async, cuMemFreeAsync, "cuMemFreeAsync", CUresult, (CUdeviceptr, CUstream))                     \
    X(pool_create, cuMemPoolCreate, "cuMemPoolCreate", CUresult, (CUmemoryPool *, const CUmemPoolProps *))     \
    X(mem_create, cuMemCreate, "cuMemCreate", CUresult,                                                         \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long))               \
    X(mem_release, cuMemRelease, "cuMemRelease", CUresult, (CUmemGenericAllocationHandle))                     \
    X(mem_get_info, cuMemGetInfo_v2, "cuMemGetInfo", CUresult, (size_t *, size_t *))                           \
    X(total_mem, cuDeviceTotalMem_v2, "cuDeviceTotalMem", CUresult, (size_t *, CUdevice))                      \
    X(launch, cuLaunchKernel, "cuLaunchKernel", CUresult,                                                       \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **,    \
       void **))                                                                                                \
    X(launch_ex, cuLaunchKernelEx, "cuLaunchKernelEx", CUresult,                                                \
      (const CUlaunchConfig *, CUfunction, void **, void **))                                                   \
    X(launch_coop, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", CUresult,                            \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **))   \
    X(graph_launch, cuGraphLaunch, "cuGraphLaunch", CUresult, (CUgraphExec, CUstream))                        \
    X(sync, cuCtxSynchronize, "cuCtxSynchronize", CUresult, (void))                                            \
    X(mem_alloc_v1, cuMemAlloc, "cuMemAlloc@2000", CUresult, (CUdeviceptr_v1 *, unsigned int))                 \
    X(mem_free_v1, cuMemFree, "cuMemFree@2000", CUresult, (CUdeviceptr_v1))                                    \
    X(mem_alloc_pitch_v1, cuMemAllocPitch, "cuMemAllocPitch@2000", CUresult,                                   \
      (CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int, unsigned int))                            \
    X(array_create_v1, cuArrayCreate, "cuArrayCreate@2000", CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *)) \
    X(array3d_create_v1, cuArray3DCreate, "cuArray3DCreate@2000", CUresult,                                    \
      (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *))                                                         \
    X(array_create, cuArrayCreate_v2, "cuArrayCreate", CUresult, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *))   \
    X(array3d_create, cuArray3DCreate_v2, "cuArray3DCreate", CUresult,                                          \
      (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))                                                             \
    X(array_destroy, cuArrayDestroy, "cuArrayDestroy", CUresult, (CUarray))                                    \
    X(mipmap_create, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", CUresult,                                \
      (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int))                                      \
    X(mipmap_destroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", CUresult, (CUmipmappedArray))        \
    X(module_load_data, cuModuleLoadData, "cuModuleLoadData", CUresult, (CUmodule *, const void *))            \
    X(module_unload, cuModuleUnload, "cuModuleUnload", CUresult, (CUmodule))                                   \
    X(graph_create, cuGraphCreate, "cuGraphCreate", CUresult, (CUgraph *, unsigned int))                       \
    X(graph_add_alloc, cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", CUresult,                              \
      (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *))                      \
    X(ipc_get, cuIpcGetMemHandle, "cuIpcGetMemHandle", CUresult, (CUipcMemHandle *, CUdeviceptr))              \
    X(ipc_open, cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", CUresult, (CUdeviceptr *, CUipcMemHandle, unsigned)) \
    X(ipc_close, cuIpcCloseMemHandle, "cuIpcCloseMemHandle", CUresult, (CUdeviceptr))                          \
    X(launch_host, cuLaunchHostFunc, "cuLaunchHostFunc", CUresult, (CUstream, CUhostFn, void *))

#endif /* GS_PROBE_H */
