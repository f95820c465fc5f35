/* Fake driver: device memory that is not a plain allocation. Arrays and mipmapped arrays (their size from the
 * descriptor, as the shim estimates it), memory shared between processes (cuIpcGetMemHandle carries address and
 * size; opening maps them under a new address and takes no memory: the exporter owns it), modules (a real image
 * takes nothing; a test image "fake-module <bytes>" takes that much for its globals), and graphs with memory nodes (the memory is taken
 * when a graph runs, which the fake never does: adding a node only hands out its address). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_export.h"
#include "fake_cuda_mem.h"

static uint64_t elem_bytes(int format, unsigned channels)
{
    uint64_t b = (format == 0x01 || format == 0x08) ? 1
                 : (format == 0x02 || format == 0x09 || format == 0x10) ? 2
                 : (format == 0x03 || format == 0x0a || format == 0x20) ? 4 : 16;
    return b * (channels ? channels : 1);
}

static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, int format, unsigned channels, unsigned flags,
                            unsigned levels)
{
    uint64_t total = 0;
    w = w ? w : 1, h = h ? h : 1, d = d ? d : 1;
    if (flags & 0x04)
        d *= 6;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += w * h * d * elem_bytes(format, channels);
        w = w > 1 ? w / 2 : 1, h = h > 1 ? h / 2 : 1;
        if (!(flags & 0x05))
            d = d > 1 ? d / 2 : 1;
    }
    return total;
}

static CUresult new_object(void **out, uint64_t bytes)
{
    int dev;
    uint64_t addr;
    CUresult rc = out ? fake_current_device(&dev) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && (rc = fake_mem_alloc(&addr, bytes, dev, 0)) == CUDA_SUCCESS)
        *out = (void *)(uintptr_t)addr;
    return rc;
}

CUresult impl_cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    if (!desc || !desc->Width)
        return CUDA_ERROR_INVALID_VALUE;
    return new_object((void **)arr, array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0, 1));
}
FAKE_EXPORT(cuArrayCreate_v2)

CUresult impl_cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    if (!desc || !desc->Width)
        return CUDA_ERROR_INVALID_VALUE;
    return new_object((void **)arr, array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                                desc->NumChannels, desc->Flags, 1));
}
FAKE_EXPORT(cuArray3DCreate_v2)

/* The CUDA 3.1 entry points (32-bit descriptors), still exported by the driver. */
CUresult impl_cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *desc)
{
    if (!desc)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY_DESCRIPTOR d = {desc->Width, desc->Height, desc->Format, desc->NumChannels};
    return impl_cuArrayCreate_v2(arr, &d);
}
FAKE_EXPORT(cuArrayCreate)

CUresult impl_cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc)
{
    if (!desc)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d = {desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels,
                                 desc->Flags};
    return impl_cuArray3DCreate_v2(arr, &d);
}
FAKE_EXPORT(cuArray3DCreate)

CUresult impl_cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels)
{
    if (!desc || !desc->Width || !levels)
        return CUDA_ERROR_INVALID_VALUE;
    return new_object((void **)arr, array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                                desc->NumChannels, desc->Flags, levels));
}
FAKE_EXPORT(cuMipmappedArrayCreate)

CUresult impl_cuArrayDestroy(CUarray arr)
{
    return fake_initialised ? fake_mem_free((uintptr_t)arr) : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuArrayDestroy)

CUresult impl_cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    return fake_initialised ? fake_mem_free((uintptr_t)arr) : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuMipmappedArrayDestroy)

/* --- IPC: the handle holds "FKIPC", the exporter's address and the size ------------------------------------ */
struct fake_ipc {
    char tag[8];
    uint64_t addr, bytes;
};

CUresult impl_cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    uint64_t bytes;
    int dev;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fake_mem_lookup(dptr, &bytes, &dev) || dev < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ipc h = {"FKIPC", dptr, bytes};
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuIpcGetMemHandle)

CUresult impl_cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{
    (void)flags;
    struct fake_ipc h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!dptr || strcmp(h.tag, "FKIPC") || !h.bytes)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = fake_current_device(&dev);
    if (rc)
        return rc;
    /* Mapped, not allocated: the entry takes no device memory (dev -1) but knows its size. */
    return fake_mem_alloc((uint64_t *)dptr, h.bytes, -1, 0);
}
FAKE_EXPORT(cuIpcOpenMemHandle_v2)

CUresult impl_cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    return fake_initialised ? fake_mem_free(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuIpcCloseMemHandle)

/* --- modules: the image's format is checked by fake_cuda_library.c ------------------------------------------ */
static CUresult load_image(CUmodule *mod, const void *image)
{
    unsigned long long bytes;
    if (!mod || !image)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = fake_image_bytes(image, &bytes);
    if (rc)
        return rc;
    if (!bytes) {
        *mod = (CUmodule)(uintptr_t)fake_mem_new_address(1);
        return CUDA_SUCCESS;
    }
    return new_object((void **)mod, bytes);
}

CUresult fake_module_from_image(CUmodule *mod, const void *image)
{
    return load_image(mod, image);
}

CUresult impl_cuModuleLoadData(CUmodule *mod, const void *image)
{
    return load_image(mod, image);
}
FAKE_EXPORT(cuModuleLoadData)

CUresult impl_cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, int *options, void **values)
{
    (void)n, (void)options, (void)values;
    return load_image(mod, image);
}
FAKE_EXPORT(cuModuleLoadDataEx)

CUresult impl_cuModuleLoad(CUmodule *mod, const char *path)
{
    char buf[256] = {0};
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return CUDA_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return load_image(mod, buf);
}
FAKE_EXPORT(cuModuleLoad)

CUresult impl_cuModuleUnload(CUmodule mod)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = fake_mem_free((uintptr_t)mod);
    return rc == CUDA_SUCCESS || mod ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; /* empty modules have no entry */
}
FAKE_EXPORT(cuModuleUnload)

/* --- graphs -------------------------------------------------------------------------------------------------- */
CUresult impl_cuGraphCreate(CUgraph *graph, unsigned int flags)
{
    (void)flags;
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = (CUgraph)calloc(1, 64);
    return *graph ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_EXPORT(cuGraphCreate)

CUresult impl_cuGraphDestroy(CUgraph graph)
{
    free(graph);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuGraphDestroy)

CUresult impl_cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                     CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    (void)deps, (void)ndeps;
    if (!node || !graph || !params || !params->bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    params->dptr = fake_mem_new_address(params->bytesize);
    *node = (CUgraphNode)(uintptr_t)params->dptr;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuGraphAddMemAllocNode)
