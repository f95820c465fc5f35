/* Module loads (cuModuleLoad, cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary): a module's global
 * variables, constant banks and code take device memory the driver allocates itself. The shim cannot list a
 * module's globals, so it charges what the load really took: the GPU's free memory before the load minus after
 * (cuMemGetInfo), rounded to the granularity, measured with this process's other loads held back. A load that
 * does not fit is unloaded and answered out of memory; cuModuleUnload gives the charge back.
 * Measured across the whole GPU, the figure includes what other processes allocated or freed during the load:
 * it can err either way by that much. Libraries (cuLibraryLoadData, cuLibraryLoadFromFile: how CUDA 12/13
 * runtimes load every image a program registers, and how PyTorch loads its own) are measured the same way, and
 * cuLibraryUnload gives their charge back; but a library belongs to no context (the driver loads it into the
 * process's contexts, now or as they are created, or lazily at a kernel's first use), so its load needs none: it
 * is measured on the GPU of the calling thread's current context when there is one, and otherwise passed to the
 * driver as it is. The runtime loads every registered image that way before it makes any context current. */
#include "gs_alloc.h"

static struct gs_ptrmap gs_modules = GS_PTRMAP_INIT;
static struct gs_ptrmap gs_libraries = GS_PTRMAP_INIT;
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

static void child_after_fork(void)
{
    pthread_mutex_init(&load_lock, NULL);
    gs_ptrmap_reset(&gs_modules);
    gs_ptrmap_reset(&gs_libraries);
}
GS_ON_FORK_CHILD(child_after_fork)

static uint64_t free_now(void)
{
    size_t free_b = 0, total = 0;
    if (!gs_cu.cuMemGetInfo_v2 || gs_cu.cuMemGetInfo_v2(&free_b, &total) != CUDA_SUCCESS)
        return 0;
    return free_b;
}

/* The GPU a library load is measured on (*d), or -1: nothing to measure, the driver's answer as it is. Not the
 * one-GPU shortcut of gs_current_device: a library may be loaded while no context is current, on one GPU or on
 * several, and with several the current device cannot be told then (the driver's answer to cuCtxGetDevice is
 * CUDA_ERROR_INVALID_CONTEXT, which a library load must not return). */
static CUresult library_target(int *d)
{
    *d = -1;
    CUdevice dev;
    if (GS_UNLIKELY(!gs_devices_ready()) || !gs_any_limit || !gs_cu.cuCtxGetDevice ||
        gs_cu.cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0 || dev >= gs_ndevs)
        return CUDA_SUCCESS;
    *d = dev;
    return CUDA_SUCCESS;
}

#define GS_MODULE_LOAD(call, mod) GS_IMAGE_LOAD(gs_alloc_target, call, mod, gs_cu.cuModuleUnload, gs_modules)
#define GS_LIBRARY_LOAD(call, lib) GS_IMAGE_LOAD(library_target, call, lib, gs_cu.cuLibraryUnload, gs_libraries)

/* target: the function that finds the GPU the load is measured on (gs_alloc_target's contract). */
#define GS_IMAGE_LOAD(target, call, mod, unload, map)                                      \
    do {                                                                                   \
        int d_;                                                                            \
        CUresult t_ = target(&d_);                                                         \
        if (t_)                                                                            \
            return t_;                                                                     \
        if (d_ < 0 || !(mod))                                                              \
            return (call);                                                                 \
        int tracked_;                                                                      \
        CUresult rc_ = gs_alloc_begin(d_, 0, &tracked_);                                   \
        if (rc_ != CUDA_SUCCESS)                                                           \
            return rc_; /* a blocked GPU, or the context does not fit */                   \
        if (!tracked_)                                                                     \
            return (call);                                                                 \
        pthread_mutex_lock(&load_lock);                                                    \
        uint64_t before_ = free_now();                                                     \
        rc_ = (call);                                                                      \
        uint64_t after_ = free_now();                                                      \
        pthread_mutex_unlock(&load_lock);                                                  \
        if (rc_ != CUDA_SUCCESS)                                                           \
            return rc_;                                                                    \
        uint64_t charge_ = before_ > after_ ? gs_charge_size(d_, before_ - after_) : 0;    \
        if (!charge_)                                                                      \
            return rc_;                                                                    \
        rc_ = gs_alloc_begin(d_, charge_, &tracked_);                                      \
        if (rc_ == CUDA_SUCCESS)                                                           \
            rc_ = gs_alloc_end(CUDA_SUCCESS, tracked_, d_, charge_, &(map),                \
                               (uintptr_t) * (mod));                                       \
        if (rc_ != CUDA_SUCCESS) {                                                         \
            unload(*(mod));                                                                \
            *(mod) = NULL;                                                                 \
        }                                                                                  \
        return rc_;                                                                        \
    } while (0)

#define GS_MODULE_ENTER(name)                \
    do {                                     \
        GS_ENTER_OR_RETURN(name);            \
        if (!gs_cu.cuModuleUnload)           \
            return CUDA_ERROR_NOT_SUPPORTED; \
    } while (0)

GS_EXPORT CUresult cuModuleLoad(CUmodule *mod, const char *path)
{
    GS_MODULE_ENTER(cuModuleLoad);
    GS_MODULE_LOAD(gs_cu.cuModuleLoad(mod, path), mod);
}

GS_EXPORT CUresult cuModuleLoadData(CUmodule *mod, const void *image)
{
    GS_MODULE_ENTER(cuModuleLoadData);
    GS_MODULE_LOAD(gs_cu.cuModuleLoadData(mod, image), mod);
}

GS_EXPORT CUresult cuModuleLoadDataEx(CUmodule *mod, const void *image, unsigned int n, int *options, void **values)
{
    GS_MODULE_ENTER(cuModuleLoadDataEx);
    GS_MODULE_LOAD(gs_cu.cuModuleLoadDataEx(mod, image, n, options, values), mod);
}

GS_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *mod, const void *fatbin)
{
    GS_MODULE_ENTER(cuModuleLoadFatBinary);
    GS_MODULE_LOAD(gs_cu.cuModuleLoadFatBinary(mod, fatbin), mod);
}

GS_EXPORT CUresult cuModuleUnload(CUmodule mod)
{
    GS_ENTER_OR_RETURN(cuModuleUnload);
    GS_UNTRACK(&gs_modules, (uintptr_t)mod, gs_cu.cuModuleUnload(mod));
}

#define GS_LIBRARY_ENTER(name)               \
    do {                                     \
        GS_ENTER_OR_RETURN(name);            \
        if (!gs_cu.cuLibraryUnload)          \
            return CUDA_ERROR_NOT_SUPPORTED; \
    } while (0)

GS_EXPORT CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, void *jit_options, void **jit_values,
                                     unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib)
{
    GS_LIBRARY_ENTER(cuLibraryLoadData);
    GS_LIBRARY_LOAD(gs_cu.cuLibraryLoadData(lib, code, jit_options, jit_values, n_jit, lib_options, lib_values,
                                            n_lib), lib);
}

GS_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *lib, const char *path, void *jit_options, void **jit_values,
                                         unsigned n_jit, void *lib_options, void **lib_values, unsigned n_lib)
{
    GS_LIBRARY_ENTER(cuLibraryLoadFromFile);
    GS_LIBRARY_LOAD(gs_cu.cuLibraryLoadFromFile(lib, path, jit_options, jit_values, n_jit, lib_options, lib_values,
                                                n_lib), lib);
}

GS_EXPORT CUresult cuLibraryUnload(CUlibrary lib)
{
    GS_ENTER_OR_RETURN(cuLibraryUnload);
    GS_UNTRACK(&gs_libraries, (uintptr_t)lib, gs_cu.cuLibraryUnload(lib));
}
