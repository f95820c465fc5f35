/* Fake driver: copies, memsets, page-locked host memory and pointer attributes. In the host-backed mode
 * (FAKE_CUDA_HOST_BACKED=1) device addresses are real memory and copies move real bytes, so data sent to the
 * device comes back; otherwise copies check their arguments and move nothing. */
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_mem.h"

#pragma GCC diagnostic ignored "-Wunused-parameter" /* entry points keep cuda.h's parameter lists */

/* In the host-backed mode, device memory (the fake's range) and host memory hold bytes; a made-up address (the
 * 32-bit range of cuMemAlloc v1) does not. Without it nothing is copied. */
static int real_bytes(uint64_t addr)
{
    return fake_mem_backed() && (fake_mem_is_device(addr) || addr >= 0x100000000ULL);
}

static CUresult copy(uint64_t dst, uint64_t src, size_t n)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (n && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    if (n && real_bytes(dst) && real_bytes(src))
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

#define U(p) ((uint64_t)(uintptr_t)(p))
#define COPY_FN(name, params, dst, src, n)      \
    CUresult impl_##name params                 \
    {                                           \
        return copy((dst), (src), (n));         \
    }                                           \
    FAKE_EXPORT(name)


COPY_FN(cuMemcpy, (CUdeviceptr d, CUdeviceptr sr, size_t n), d, sr, n)
COPY_FN(cuMemcpyHtoD_v2, (CUdeviceptr d, const void *h, size_t n), d, U(h), n)
COPY_FN(cuMemcpyDtoH_v2, (void *h, CUdeviceptr d, size_t n), U(h), d, n)
COPY_FN(cuMemcpyDtoD_v2, (CUdeviceptr d, CUdeviceptr sr, size_t n), d, sr, n)
COPY_FN(cuMemcpyPeer, (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n), d, sr, n)

#define ACOPY_FN(name, params, dst, src, n)     \
    CUresult impl_##name params                 \
    {                                           \
        (void)s;                                \
        return copy((dst), (src), (n));         \
    }                                           \
    FAKE_EXPORT(name)

ACOPY_FN(cuMemcpyAsync, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s), d, sr, n)
ACOPY_FN(cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *h, size_t n, CUstream s), d, U(h), n)
ACOPY_FN(cuMemcpyDtoHAsync_v2, (void *h, CUdeviceptr d, size_t n, CUstream s), U(h), d, n)
ACOPY_FN(cuMemcpyDtoDAsync_v2, (CUdeviceptr d, CUdeviceptr sr, size_t n, CUstream s), d, sr, n)
ACOPY_FN(cuMemcpyPeerAsync, (CUdeviceptr d, CUcontext dc, CUdeviceptr sr, CUcontext sc, size_t n, CUstream s), d,
         sr, n)

/* cuMemcpy2D / 3D (CUDA_MEMCPY2D): rows of WidthInBytes from src to dst; only plain memory is supported. */
struct memcpy2d {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
};

static CUresult copy2d(const struct memcpy2d *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t src = c->srcMemoryType == 1 ? U(c->srcHost) : c->srcDevice; /* CU_MEMORYTYPE_HOST = 1 */
    uint64_t dst = c->dstMemoryType == 1 ? U(c->dstHost) : c->dstDevice;
    if (c->srcMemoryType == 3 || c->dstMemoryType == 3) /* arrays hold no bytes in the fake */
        return CUDA_SUCCESS;
    for (size_t y = 0; y < c->Height; y++) {
        CUresult rc = copy(dst + (c->dstY + y) * c->dstPitch + c->dstXInBytes,
                           src + (c->srcY + y) * c->srcPitch + c->srcXInBytes, c->WidthInBytes);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}

CUresult impl_cuMemcpy2D_v2(const struct memcpy2d *c)
{
    return copy2d(c);
}
FAKE_EXPORT(cuMemcpy2D_v2)

CUresult impl_cuMemcpy2DUnaligned_v2(const struct memcpy2d *c)
{
    return copy2d(c);
}
FAKE_EXPORT(cuMemcpy2DUnaligned_v2)

CUresult impl_cuMemcpy2DAsync_v2(const struct memcpy2d *c, CUstream s)
{
    (void)s;
    return copy2d(c);
}
FAKE_EXPORT(cuMemcpy2DAsync_v2)

/* --- memset ------------------------------------------------------------------------------------------------- */
static CUresult fill(CUdeviceptr d, unsigned value, size_t width, size_t n)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (n && !d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!n || !real_bytes(d))
        return CUDA_SUCCESS;
    if (width == 1) {
        memset((void *)(uintptr_t)d, (int)(value & 0xff), n);
    } else if (width == 2) {
        uint16_t *p = (uint16_t *)(uintptr_t)d;
        for (size_t i = 0; i < n; i++)
            p[i] = (uint16_t)value;
    } else {
        uint32_t *p = (uint32_t *)(uintptr_t)d;
        for (size_t i = 0; i < n; i++)
            p[i] = value;
    }
    return CUDA_SUCCESS;
}

CUresult impl_cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { return fill(d, v, 1, n); }
FAKE_EXPORT(cuMemsetD8_v2)
CUresult impl_cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { return fill(d, v, 2, n); }
FAKE_EXPORT(cuMemsetD16_v2)
CUresult impl_cuMemsetD32_v2(CUdeviceptr d, unsigned v, size_t n) { return fill(d, v, 4, n); }
FAKE_EXPORT(cuMemsetD32_v2)
CUresult impl_cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)s; return fill(d, v, 1, n); }
FAKE_EXPORT(cuMemsetD8Async)
CUresult impl_cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)s; return fill(d, v, 2, n); }
FAKE_EXPORT(cuMemsetD16Async)
CUresult impl_cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { (void)s; return fill(d, v, 4, n); }
FAKE_EXPORT(cuMemsetD32Async)

static CUresult fill2d(CUdeviceptr d, size_t pitch, unsigned v, size_t width, size_t w, size_t h)
{
    for (size_t y = 0; y < h; y++) {
        CUresult rc = fill(d + y * pitch, v, width, w);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}

CUresult impl_cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) { return fill2d(d, p, v, 1, w, h); }
FAKE_EXPORT(cuMemsetD2D8_v2)
CUresult impl_cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned v, size_t w, size_t h) { return fill2d(d, p, v, 4, w, h); }
FAKE_EXPORT(cuMemsetD2D32_v2)
CUresult impl_cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) { (void)s; return fill2d(d, p, v, 1, w, h); }
FAKE_EXPORT(cuMemsetD2D8Async)
CUresult impl_cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned v, size_t w, size_t h, CUstream s) { (void)s; return fill2d(d, p, v, 4, w, h); }
FAKE_EXPORT(cuMemsetD2D32Async)

/* --- page-locked host memory: ordinary host memory, remembered (dev -1, no device memory) --------------------- */
CUresult impl_cuMemHostAlloc(void **p, size_t bytes, unsigned flags)
{
    (void)flags;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (posix_memalign(p, 4096, bytes ? bytes : 1))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemHostAlloc)

CUresult impl_cuMemAllocHost_v2(void **p, size_t bytes)
{
    return impl_cuMemHostAlloc(p, bytes, 0);
}
FAKE_EXPORT(cuMemAllocHost_v2)

CUresult impl_cuMemFreeHost(void *p)
{
    free(p);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemFreeHost)

CUresult impl_cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags)
{
    (void)flags;
    return p && bytes ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuMemHostRegister_v2)

CUresult impl_cuMemHostUnregister(void *p)
{
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuMemHostUnregister)

CUresult impl_cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags)
{
    (void)flags;
    if (!d || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *d = U(p);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemHostGetDevicePointer_v2)

CUresult impl_cuMemHostGetFlags(unsigned *flags, void *p)
{
    if (!flags || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemHostGetFlags)

/* --- pointer attributes (CUpointer_attribute) --------------------------------------------------------------- */
enum {
    PA_CONTEXT = 1, PA_MEMORY_TYPE = 2, PA_DEVICE_POINTER = 3, PA_HOST_POINTER = 4, PA_SYNC_MEMOPS = 6,
    PA_BUFFER_ID = 7, PA_IS_MANAGED = 8, PA_DEVICE_ORDINAL = 9, PA_IS_LEGACY_IPC = 10, PA_RANGE_START = 11,
    PA_RANGE_SIZE = 12, PA_MAPPED = 13, PA_ALLOWED_HANDLE_TYPES = 14, PA_ACCESS_FLAGS = 16, PA_MEMPOOL = 17,
};

static CUresult pointer_attribute(void *data, int attr, CUdeviceptr p, int strict)
{
    int device = fake_mem_is_device(p);
    uint64_t bytes = 0;
    int dev = 0;
    if (device && !fake_mem_lookup(p, &bytes, &dev))
        dev = fake_current ? fake_current->device : 0;
    if (!device && strict)
        return CUDA_ERROR_INVALID_VALUE; /* not memory the driver knows */
    switch (attr) {
    case PA_CONTEXT: *(CUcontext *)data = device ? (CUcontext)fake_current : NULL; break;
    case PA_MEMORY_TYPE: *(unsigned *)data = device ? 2 : 0; break; /* CU_MEMORYTYPE_DEVICE */
    case PA_DEVICE_POINTER: *(CUdeviceptr *)data = device ? p : 0; break;
    case PA_HOST_POINTER: *(void **)data = NULL; break;
    case PA_SYNC_MEMOPS: case PA_IS_MANAGED: case PA_IS_LEGACY_IPC: *(unsigned *)data = 0; break;
    case PA_BUFFER_ID: *(uint64_t *)data = device ? p : 0; break;
    case PA_DEVICE_ORDINAL: *(int *)data = device ? dev : -2; break;
    case PA_RANGE_START: *(CUdeviceptr *)data = device ? p : 0; break;
    case PA_RANGE_SIZE: *(size_t *)data = bytes; break;
    case PA_MAPPED: *(unsigned *)data = device; break;
    case PA_ALLOWED_HANDLE_TYPES: *(uint64_t *)data = 0; break;
    case PA_ACCESS_FLAGS: *(unsigned *)data = device ? 3 : 0; break;
    case PA_MEMPOOL: *(void **)data = NULL; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult impl_cuPointerGetAttribute(void *data, int attr, CUdeviceptr p)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    return pointer_attribute(data, attr, p, 1);
}
FAKE_EXPORT(cuPointerGetAttribute)

CUresult impl_cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!attrs || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        if (!data[i])
            continue;
        CUresult rc = pointer_attribute(data[i], attrs[i], p, 0);
        if (rc)
            return rc;
    }
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuPointerGetAttributes)

CUresult impl_cuPointerSetAttribute(const void *value, int attr, CUdeviceptr p)
{
    (void)value, (void)attr;
    return fake_mem_is_device(p) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuPointerSetAttribute)
