/* CUDA arrays and mipmapped arrays (textures, surfaces): charged what their descriptor needs, element size
 * times extent summed over mip levels, rounded up to the GPU's allocation granularity. Formats the shim does
 * not know are charged 16 bytes per channel (the widest element), so an estimate errs high, never low. */
#include "gs_alloc.h"

#define GS_ARRAY_LAYERED 0x01 /* CUDA_ARRAY3D_LAYERED: Depth counts layers, not halved per mip level */
#define GS_ARRAY_CUBEMAP 0x04 /* CUDA_ARRAY3D_CUBEMAP: six faces (or 6 x layers) */

static struct gs_ptrmap gs_arrays = GS_PTRMAP_INIT;

static void child_after_fork(void)
{
    gs_ptrmap_reset(&gs_arrays);
}
GS_ON_FORK_CHILD(child_after_fork)

static uint64_t element_bytes(int format, unsigned channels)
{
    uint64_t b;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        b = 1;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        b = 2;
        break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        b = 4;
        break;
    default:
        b = 16;
        break;
    }
    return b * (channels ? channels : 1);
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

/* Bytes of an array of w x h x d elements (0 = that dimension is absent) over `levels` mip levels. */
static uint64_t gs_array_bytes(uint64_t w, uint64_t h, uint64_t d, int format, unsigned channels, unsigned flags,
                        unsigned levels)
{
    uint64_t total = 0, elem = element_bytes(format, channels);
    if (!levels)
        levels = 1;
    w = w ? w : 1, h = h ? h : 1, d = d ? d : 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t level = mul_sat(mul_sat(mul_sat(w, h), d), elem);
        total = total > UINT64_MAX - level ? UINT64_MAX : total + level;
        w = w > 1 ? w / 2 : 1, h = h > 1 ? h / 2 : 1;
        if (!(flags & (GS_ARRAY_LAYERED | GS_ARRAY_CUBEMAP)))
            d = d > 1 ? d / 2 : 1;
    }
    return total;
}

GS_EXPORT CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    GS_ENTER_OR_RETURN(cuArrayCreate_v2);
    if (!desc)
        return gs_cu.cuArrayCreate_v2(arr, desc);
    GS_ALLOC_CURRENT(&gs_arrays, gs_array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0, 1),
                     gs_cu.cuArrayCreate_v2(arr, desc), arr, gs_cu.cuArrayDestroy(*arr));
}

GS_EXPORT CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    GS_ENTER_OR_RETURN(cuArray3DCreate_v2);
    if (!desc)
        return gs_cu.cuArray3DCreate_v2(arr, desc);
    uint64_t depth = desc->Flags & GS_ARRAY_CUBEMAP ? mul_sat(desc->Depth ? desc->Depth : 1, 6) : desc->Depth;
    GS_ALLOC_CURRENT(&gs_arrays,
                     gs_array_bytes(desc->Width, desc->Height, depth, desc->Format, desc->NumChannels, desc->Flags, 1),
                     gs_cu.cuArray3DCreate_v2(arr, desc), arr, gs_cu.cuArrayDestroy(*arr));
}

/* The CUDA 3.1 entry points (32-bit descriptors), still exported by the driver: a program linked to libcuda that
 * declares them reaches them without any lookup, so they are charged like the current ones. */
GS_EXPORT CUresult cuArrayCreate(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR_v1 *desc)
{
    GS_ENTER_OR_RETURN(cuArrayCreate);
    if (!desc)
        return gs_cu.cuArrayCreate(arr, desc);
    GS_ALLOC_CURRENT(&gs_arrays, gs_array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 0, 1),
                     gs_cu.cuArrayCreate(arr, desc), arr, gs_cu.cuArrayDestroy(*arr));
}

GS_EXPORT CUresult cuArray3DCreate(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc)
{
    GS_ENTER_OR_RETURN(cuArray3DCreate);
    if (!desc)
        return gs_cu.cuArray3DCreate(arr, desc);
    uint64_t depth = desc->Flags & GS_ARRAY_CUBEMAP ? mul_sat(desc->Depth ? desc->Depth : 1, 6) : desc->Depth;
    GS_ALLOC_CURRENT(&gs_arrays,
                     gs_array_bytes(desc->Width, desc->Height, depth, desc->Format, desc->NumChannels, desc->Flags, 1),
                     gs_cu.cuArray3DCreate(arr, desc), arr, gs_cu.cuArrayDestroy(*arr));
}

GS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                          unsigned int levels)
{
    GS_ENTER_OR_RETURN(cuMipmappedArrayCreate);
    if (!desc)
        return gs_cu.cuMipmappedArrayCreate(arr, desc, levels);
    uint64_t depth = desc->Flags & GS_ARRAY_CUBEMAP ? mul_sat(desc->Depth ? desc->Depth : 1, 6) : desc->Depth;
    GS_ALLOC_CURRENT(&gs_arrays,
                     gs_array_bytes(desc->Width, desc->Height, depth, desc->Format, desc->NumChannels, desc->Flags,
                                    levels),
                     gs_cu.cuMipmappedArrayCreate(arr, desc, levels), arr, gs_cu.cuMipmappedArrayDestroy(*arr));
}

GS_EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    GS_ENTER_OR_RETURN(cuArrayDestroy);
    GS_UNTRACK(&gs_arrays, (uintptr_t)arr, gs_cu.cuArrayDestroy(arr));
}

GS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr)
{
    GS_ENTER_OR_RETURN(cuMipmappedArrayDestroy);
    GS_UNTRACK(&gs_arrays, (uintptr_t)arr, gs_cu.cuMipmappedArrayDestroy(arr));
}
