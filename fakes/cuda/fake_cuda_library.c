/* Fake driver: kernel images. Modules (cuModuleLoad*) and, since CUDA 12, libraries (cuLibraryLoadData: how the
 * runtime loads every image a program registers, and how PyTorch loads its own) accept what nvcc and NVRTC
 * produce: a cubin (ELF), PTX text, a fatbin, or a runtime fatbin wrapper. Kernels are timed, not run (their
 * handles are the image's), so any name is found; globals live at the image's own device address, so copies to
 * and from a symbol round-trip in the host-backed mode. A test image "fake-module <bytes>" takes that much device
 * memory for its globals. */
#include <stdio.h>
#include <string.h>

#include "fake_cuda_export.h"
#include "fake_cuda_mem.h"

#define CUDA_ERROR_INVALID_IMAGE 200
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

static int is_ptx(const char *text)
{
    /* NVRTC and nvcc open PTX with comment lines, then .version and .target */
    const char *v = strstr(text, ".version");
    return v && (size_t)(v - text) < 4096 && strstr(text, ".target");
}

CUresult fake_image_bytes(const void *image, unsigned long long *bytes)
{
    const unsigned char *b = image;
    uint32_t magic;
    if (!image)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(&magic, b, sizeof magic);
    *bytes = 0;
    if (!memcmp(b, "\177ELF", 4) || magic == FATBIN_MAGIC)
        return CUDA_SUCCESS;
    if (magic == FATBIN_WRAPPER_MAGIC) {
        const void *data;
        memcpy(&data, b + 8, sizeof data);
        return data ? fake_image_bytes(data, bytes) : CUDA_ERROR_INVALID_IMAGE;
    }
    if (sscanf((const char *)image, "fake-module %llu", bytes) == 1)
        return CUDA_SUCCESS;
    if (is_ptx(image))
        return CUDA_SUCCESS;
    return CUDA_ERROR_INVALID_IMAGE;
}

/* --- libraries: a library is a module (the same object, the same accounting) --------------------------------- */
CUresult impl_cuLibraryLoadData(CUmodule *lib, const void *code, void *jit_options, void **jit_values,
                                unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib)
{
    (void)jit_options, (void)jit_values, (void)n_jit, (void)lib_options, (void)lib_values, (void)n_lib;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return impl_cuModuleLoadData(lib, code);
}
FAKE_EXPORT(cuLibraryLoadData)

CUresult impl_cuLibraryLoadFromFile(CUmodule *lib, const char *path, void *jit_options, void **jit_values,
                                    unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib)
{
    (void)jit_options, (void)jit_values, (void)n_jit, (void)lib_options, (void)lib_values, (void)n_lib;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return impl_cuModuleLoad(lib, path);
}
FAKE_EXPORT(cuLibraryLoadFromFile)

CUresult impl_cuLibraryUnload(CUmodule lib)
{
    return impl_cuModuleUnload(lib);
}
FAKE_EXPORT(cuLibraryUnload)

/* A library, its module, its kernels and their functions are one handle (the loaded image): each getter hands back
 * the handle it was given, into `out` (a CUmodule, CUfunction or CUkernel). */
static CUresult same_handle(void *out, const void *handle)
{
    if (!out || !handle)
        return CUDA_ERROR_INVALID_VALUE;
    memcpy(out, &handle, sizeof handle);
    return CUDA_SUCCESS;
}

CUresult impl_cuLibraryGetKernel(void **kernel, CUmodule lib, const char *name)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    return same_handle(kernel, lib);
}
FAKE_EXPORT(cuLibraryGetKernel)

CUresult impl_cuLibraryGetModule(CUmodule *mod, CUmodule lib)
{
    return same_handle(mod, lib);
}
FAKE_EXPORT(cuLibraryGetModule)

CUresult impl_cuKernelGetFunction(CUfunction *f, void *kernel)
{
    return same_handle(f, kernel);
}
FAKE_EXPORT(cuKernelGetFunction)

CUresult impl_cuKernelGetLibrary(CUmodule *lib, void *kernel)
{
    return same_handle(lib, kernel);
}
FAKE_EXPORT(cuKernelGetLibrary)

CUresult impl_cuLibraryGetKernelCount(unsigned *count, CUmodule lib)
{
    if (!count || !lib)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 0; /* kernels are found by name */
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuLibraryGetKernelCount)

/* A global is the image's own address: one granule per image, which holds every global of it. */
static CUresult global_of(CUdeviceptr *dptr, size_t *bytes, CUmodule mod, const char *name)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!mod || !name)
        return CUDA_ERROR_INVALID_VALUE;
    if (dptr)
        *dptr = (CUdeviceptr)(uintptr_t)mod;
    if (bytes)
        *bytes = 256;
    return CUDA_SUCCESS;
}

CUresult impl_cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUmodule lib, const char *name)
{
    return global_of(dptr, bytes, lib, name);
}
FAKE_EXPORT(cuLibraryGetGlobal)

CUresult impl_cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUmodule lib, const char *name)
{
    return global_of(dptr, bytes, lib, name);
}
FAKE_EXPORT(cuLibraryGetManaged)

CUresult impl_cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule mod, const char *name)
{
    return global_of(dptr, bytes, mod, name);
}
FAKE_EXPORT(cuModuleGetGlobal_v2)

CUresult impl_cuModuleGetLoadingMode(int *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = 1; /* CU_MODULE_EAGER_LOADING */
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuModuleGetLoadingMode)

/* --- function and kernel attributes (CUfunction_attribute) ---------------------------------------------------- */
static int function_attribute(int attrib, int *value)
{
    static const int values[] = {
        [0] = 1024,  /* MAX_THREADS_PER_BLOCK */
        [1] = 0,     /* SHARED_SIZE_BYTES */
        [2] = 0,     /* CONST_SIZE_BYTES */
        [3] = 0,     /* LOCAL_SIZE_BYTES */
        [4] = 32,    /* NUM_REGS */
        [5] = 80,    /* PTX_VERSION */
        [6] = 80,    /* BINARY_VERSION */
        [7] = 0,     /* CACHE_MODE_CA */
        [8] = 49152, /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
        [9] = -1,    /* PREFERRED_SHARED_MEMORY_CARVEOUT */
    };
    if (attrib < 0 || attrib > 20)
        return -1;
    *value = attrib < (int)(sizeof values / sizeof values[0]) ? values[attrib] : 0;
    return 0;
}

CUresult impl_cuFuncGetAttribute(int *value, int attrib, CUfunction f)
{
    if (!value || !f || function_attribute(attrib, value))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuFuncGetAttribute)

CUresult impl_cuKernelGetAttribute(int *value, int attrib, void *kernel, CUdevice dev)
{
    (void)dev;
    return impl_cuFuncGetAttribute(value, attrib, (CUfunction)kernel);
}
FAKE_EXPORT(cuKernelGetAttribute)

CUresult impl_cuFuncSetAttribute(CUfunction f, int attrib, int value)
{
    (void)attrib, (void)value;
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuFuncSetAttribute)

CUresult impl_cuKernelSetAttribute(int attrib, int value, void *kernel, CUdevice dev)
{
    (void)attrib, (void)value, (void)dev;
    return kernel ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuKernelSetAttribute)

CUresult impl_cuFuncSetCacheConfig(CUfunction f, int config)
{
    (void)config;
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuFuncSetCacheConfig)

CUresult impl_cuKernelSetCacheConfig(void *kernel, int config, CUdevice dev)
{
    (void)config, (void)dev;
    return kernel ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuKernelSetCacheConfig)

CUresult impl_cuFuncGetModule(CUmodule *mod, CUfunction f)
{
    return same_handle(mod, f);
}
FAKE_EXPORT(cuFuncGetModule)

CUresult impl_cuFuncGetName(const char **name, CUfunction f)
{
    if (!name || !f)
        return CUDA_ERROR_INVALID_VALUE;
    *name = "kernel";
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuFuncGetName)

CUresult impl_cuKernelGetName(const char **name, void *kernel)
{
    return impl_cuFuncGetName(name, (CUfunction)kernel);
}
FAKE_EXPORT(cuKernelGetName)

CUresult impl_cuFuncIsLoaded(int *state, CUfunction f)
{
    if (!state || !f)
        return CUDA_ERROR_INVALID_VALUE;
    *state = 1; /* CU_FUNCTION_LOADING_STATE_LOADED */
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuFuncIsLoaded)

CUresult impl_cuFuncLoad(CUfunction f)
{
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuFuncLoad)

/* --- occupancy: every block fits as many times as the SM's threads allow ------------------------------------- */
CUresult impl_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *blocks, CUfunction f, int block_size,
                                                                    size_t smem, unsigned flags)
{
    (void)f, (void)smem, (void)flags;
    if (!blocks || block_size <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    *blocks = 2048 / block_size > 32 ? 32 : 2048 / block_size;
    if (*blocks < 1)
        *blocks = 1;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags)

CUresult impl_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, CUfunction f, int block_size, size_t smem)
{
    return impl_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, f, block_size, smem, 0);
}
FAKE_EXPORT(cuOccupancyMaxActiveBlocksPerMultiprocessor)

CUresult impl_cuOccupancyMaxPotentialBlockSizeWithFlags(int *min_grid, int *block_size, CUfunction f, void *cb,
                                                        size_t smem, int limit, unsigned flags)
{
    (void)f, (void)cb, (void)smem, (void)flags;
    if (!min_grid || !block_size)
        return CUDA_ERROR_INVALID_VALUE;
    *block_size = limit > 0 && limit < 1024 ? limit : 1024;
    int sms = fake_device_count ? (int)fake_devices[0].info.sms : 1;
    *min_grid = sms * (2048 / *block_size);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuOccupancyMaxPotentialBlockSizeWithFlags)

CUresult impl_cuOccupancyMaxPotentialBlockSize(int *min_grid, int *block_size, CUfunction f, void *cb, size_t smem,
                                               int limit)
{
    return impl_cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid, block_size, f, cb, smem, limit, 0);
}
FAKE_EXPORT(cuOccupancyMaxPotentialBlockSize)

CUresult impl_cuOccupancyAvailableDynamicSMemPerBlock(size_t *smem, CUfunction f, int blocks, int block_size)
{
    (void)f, (void)blocks, (void)block_size;
    if (!smem)
        return CUDA_ERROR_INVALID_VALUE;
    *smem = 166912;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuOccupancyAvailableDynamicSMemPerBlock)
