/* The versioned entry points of the hooked names; see gs_variants.h. Rows of one name, newest first. */
#include "gs_variants.h"

#include <string.h>

struct variant {
    const char *base;
    int since;          /* CUDA version that introduced this variant (1000 * major + 10 * minor) */
    const char *legacy; /* the exported name */
    const char *ptsz;   /* with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM; NULL = the same as legacy */
};

static const struct variant variants[] = {
    {"cuInit", 2000, "cuInit", NULL},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2", NULL},
    {"cuGetProcAddress", 11030, "cuGetProcAddress", NULL},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain", NULL},
    {"cuGetExportTable", 3000, "cuGetExportTable", NULL},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4", NULL},
    {"cuCtxCreate", 11040, "cuCtxCreate_v3", NULL},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2", NULL},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2", NULL},
    {"cuMemAlloc", 2000, "cuMemAlloc", NULL},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2", NULL},
    {"cuMemAllocPitch", 2000, "cuMemAllocPitch", NULL},
    {"cuMemAllocManaged", 6000, "cuMemAllocManaged", NULL},
    {"cuMemFree", 3020, "cuMemFree_v2", NULL},
    {"cuMemFree", 2000, "cuMemFree", NULL},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync", "cuMemAllocAsync_ptsz"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync", "cuMemFreeAsync_ptsz"},
    {"cuMemPoolCreate", 11020, "cuMemPoolCreate", NULL},
    {"cuMemPoolDestroy", 11020, "cuMemPoolDestroy", NULL},
    {"cuMemCreate", 10020, "cuMemCreate", NULL},
    {"cuMemRelease", 10020, "cuMemRelease", NULL},
    {"cuMemMap", 10020, "cuMemMap", NULL},
    {"cuMemUnmap", 10020, "cuMemUnmap", NULL},
    {"cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle", NULL},
    {"cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle", NULL},
    {"cuMemImportFromShareableHandle", 10020, "cuMemImportFromShareableHandle", NULL},
    {"cuMemPoolSetAttribute", 11020, "cuMemPoolSetAttribute", NULL},
    {"cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo", NULL},
    {"cuDeviceSetMemPool", 11020, "cuDeviceSetMemPool", NULL},
    {"cuCtxSetLimit", 3010, "cuCtxSetLimit", NULL},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2", NULL},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2", NULL},
    {"cuArrayCreate", 3020, "cuArrayCreate_v2", NULL},
    {"cuArrayCreate", 2000, "cuArrayCreate", NULL},
    {"cuArray3DCreate", 3020, "cuArray3DCreate_v2", NULL},
    {"cuArray3DCreate", 2000, "cuArray3DCreate", NULL},
    {"cuArrayDestroy", 2000, "cuArrayDestroy", NULL},
    {"cuMipmappedArrayCreate", 5000, "cuMipmappedArrayCreate", NULL},
    {"cuMipmappedArrayDestroy", 5000, "cuMipmappedArrayDestroy", NULL},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2", NULL},
    {"cuIpcOpenMemHandle", 4010, "cuIpcOpenMemHandle", NULL},
    {"cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle", NULL},
    {"cuModuleLoad", 2000, "cuModuleLoad", NULL},
    {"cuModuleLoadData", 2000, "cuModuleLoadData", NULL},
    {"cuModuleLoadDataEx", 2010, "cuModuleLoadDataEx", NULL},
    {"cuModuleLoadFatBinary", 2000, "cuModuleLoadFatBinary", NULL},
    {"cuModuleUnload", 2000, "cuModuleUnload", NULL},
    {"cuLibraryLoadData", 12000, "cuLibraryLoadData", NULL},
    {"cuLibraryLoadFromFile", 12000, "cuLibraryLoadFromFile", NULL},
    {"cuLibraryUnload", 12000, "cuLibraryUnload", NULL},
    {"cuGraphAddMemAllocNode", 11040, "cuGraphAddMemAllocNode", NULL},
    {"cuGraphAddNode", 12030, "cuGraphAddNode_v2", NULL},
    {"cuGraphAddNode", 12020, "cuGraphAddNode", NULL},
    {"cuLaunchKernel", 4000, "cuLaunchKernel", "cuLaunchKernel_ptsz"},
    {"cuLaunchKernelEx", 11060, "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"},
    {"cuLaunchCooperativeKernel", 9000, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"},
    {"cuGraphLaunch", 10000, "cuGraphLaunch", "cuGraphLaunch_ptsz"},
};

const char *gs_variant(const char *base, int version, cuuint64_t flags)
{
    if (!base || version > GS_NEWEST_KNOWN_CUDA)
        return NULL;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        const struct variant *v = &variants[i];
        if (strcmp(v->base, base) || version < v->since)
            continue;
        return (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && v->ptsz ? v->ptsz : v->legacy;
    }
    return NULL;
}
