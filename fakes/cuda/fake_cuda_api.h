/* Prototypes of the fake driver's hidden implementations (impl_<name>), shared so that cuGetProcAddress can hand
 * out their addresses. Signatures as in cuda.h. */
#ifndef FAKE_CUDA_API_H
#define FAKE_CUDA_API_H

#include "fake_cuda.h"

#pragma GCC visibility push(hidden)

#define LAUNCH_PARAMS                                                                                         \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, \
        CUstream stream, void **params, void **extra
#define COOP_PARAMS                                                                                           \
    CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, \
        CUstream stream, void **params

CUresult impl_cuInit(unsigned int flags);
CUresult impl_cuDriverGetVersion(int *version);
CUresult impl_cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
CUresult impl_cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult *status);
CUresult impl_cuDeviceGetCount(int *count);
CUresult impl_cuDeviceGet(CUdevice *device, int ordinal);
CUresult impl_cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult impl_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult impl_cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult impl_cuDeviceGetAttribute(int *value, int attrib, CUdevice dev);
CUresult impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult impl_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev);
CUresult impl_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev);
CUresult impl_cuCtxDestroy_v2(CUcontext ctx);
CUresult impl_cuCtxSetCurrent(CUcontext ctx);
CUresult impl_cuCtxGetCurrent(CUcontext *pctx);
CUresult impl_cuCtxGetDevice(CUdevice *device);
CUresult impl_cuCtxSynchronize(void);
CUresult impl_cuGetExportTable(const void **table, const CUuuid *id);
CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem);
CUresult impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult impl_cuMemFree_v2(CUdeviceptr dptr);
CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream);
CUresult impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream);
CUresult impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream);
CUresult impl_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult impl_cuMemPoolDestroy(CUmemoryPool pool);
CUresult impl_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags);
CUresult impl_cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult impl_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult impl_cuLaunchKernel(LAUNCH_PARAMS);
CUresult impl_cuLaunchKernel_ptsz(LAUNCH_PARAMS);
CUresult impl_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);
CUresult impl_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra);
CUresult impl_cuLaunchCooperativeKernel(COOP_PARAMS);
CUresult impl_cuLaunchCooperativeKernel_ptsz(COOP_PARAMS);
CUresult impl_cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult impl_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream);
CUresult impl_cuStreamSynchronize(CUstream stream);
CUresult impl_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult impl_cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *desc);
CUresult impl_cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc);
CUresult impl_cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                              unsigned int elem);
CUresult impl_cuMemFree(CUdeviceptr_v1 dptr);
CUresult impl_cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option);
CUresult impl_cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
CUresult impl_cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc);
CUresult impl_cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc);
CUresult impl_cuArrayDestroy(CUarray arr);
CUresult impl_cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels);
CUresult impl_cuMipmappedArrayDestroy(CUmipmappedArray arr);
CUresult impl_cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult impl_cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
CUresult impl_cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult impl_cuModuleLoad(CUmodule *mod, const char *path);
CUresult impl_cuModuleLoadData(CUmodule *mod, const void *image);
CUresult impl_cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, int *options, void **values);
CUresult impl_cuModuleUnload(CUmodule mod);
CUresult impl_cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name);
CUresult impl_cuGraphCreate(CUgraph *graph, unsigned int flags);
CUresult impl_cuGraphDestroy(CUgraph graph);
CUresult impl_cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                     CUDA_MEM_ALLOC_NODE_PARAMS *params);
CUresult impl_cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *data);
CUresult impl_cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void *data);
CUresult impl_cuStreamIsCapturing(CUstream stream, int *status);
CUresult impl_cuStreamIsCapturing_ptsz(CUstream stream, int *status);
CUresult impl_cuStreamSynchronize_ptsz(CUstream stream);

#pragma GCC visibility pop

#endif /* FAKE_CUDA_API_H */
