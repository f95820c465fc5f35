/* Loading the real driver libraries and resolving their entry points by name through libc's dlsym. */
#define _GNU_SOURCE
#include "gs_real.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "gpushare_contract.h"
#include "gs_log.h"

struct gs_real_cuda gs_cu;
struct gs_real_nvml gs_nvml;

static gs_dlsym_fn libc_dlsym;

GS_NO_SANITIZE gs_dlsym_fn gs_real_dlsym(void)
{
    gs_dlsym_fn f = __atomic_load_n(&libc_dlsym, __ATOMIC_ACQUIRE);
    if (f)
        return f;
    /* dlsym's default version differs by glibc release and architecture; try the known ones, newest first. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; versions[i] && !f; i++)
        f = (gs_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (f)
        __atomic_store_n(&libc_dlsym, f, __ATOMIC_RELEASE);
    return f;
}

/* Resolve libc's dlsym before anything else runs, so that the exported dlsym never has to. */
__attribute__((constructor(101))) static void resolve_dlsym(void)
{
    gs_real_dlsym();
}

/* GPUSHARE_REAL_LIBCUDA and GPUSHARE_REAL_LIBNVML name the fake drivers the tests run on. Only the shim's test build
 * (GS_TEST_BUILD: make's build/shim/test/libgpushare.so) honours them: in the shipped library a process could point
 * the shim at a library of its choosing, such as an NVML that reports no use (and so a compute share never held). */
static void *open_library(const char *env, const char *fallback)
{
    const char *path = fallback, *set = getenv(env);
#ifdef GS_TEST_BUILD
    if (set && *set)
        path = set;
#else
    if (set && *set)
        GS_WARN("%s is honoured only by the shim's test build; ignored, the driver is loaded as %s", env, fallback);
#endif
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        GS_WARN("cannot load %s: %s", path, dlerror());
    return h;
}

int gs_real_load_cuda(void)
{
    gs_dlsym_fn sym = gs_real_dlsym();
    if (!sym) {
        GS_ERROR("cannot find libc's dlsym; the shim cannot reach the driver");
        return -1;
    }
    void *h = open_library(GS_ENV_REAL_LIBCUDA, "libcuda.so.1");
    if (!h)
        return -1;
#define GS_RESOLVE(name, params) gs_cu.name = (gs_pfn_##name)sym(h, #name);
    GS_CUDA_HOOKED(GS_RESOLVE)
    GS_CUDA_USED(GS_RESOLVE)
#undef GS_RESOLVE
    return 0;
}

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_loaded = -1;

static void load_nvml(void)
{
    gs_dlsym_fn sym = gs_real_dlsym();
    void *h = sym ? open_library(GS_ENV_REAL_LIBNVML, "libnvidia-ml.so.1") : NULL;
    if (!h)
        return;
#define GS_RESOLVE(name, params) gs_nvml.name = (gs_pfn_##name)sym(h, #name);
    GS_NVML_HOOKED(GS_RESOLVE)
    GS_NVML_USED(GS_RESOLVE)
#undef GS_RESOLVE
    nvml_loaded = 0;
}

int gs_real_load_nvml(void)
{
    pthread_once(&nvml_once, load_nvml);
    return nvml_loaded;
}
