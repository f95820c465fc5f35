/* How applications reach the driver, intercepted at each door:
 *   - plain symbol interposition: the hooks are exported under the driver's names;
 *   - dlsym: a lookup of a hooked cu* / nvml* name in any handle that has it returns the hook;
 *   - cuGetProcAddress / _v2 (how the CUDA runtime gets every entry point since 11.3): the driver picks the
 *     versioned / per-thread-stream variant, and the shim swaps in the hook for exactly that variant, matched
 *     by address, so a _ptsz request reaches the driver's _ptsz entry point through its own hook.
 * cuGetExportTable is never intercepted. dlsym itself is in gs_dlsym.c. */
#include <string.h>

#include "gs_log.h"
#include "gs_shim.h"

#define GS_DECLARE(name, params) CUresult name params;
GS_CUDA_HOOKED(GS_DECLARE)
#undef GS_DECLARE
#define GS_DECLARE(name, params) nvmlReturn_t name params;
GS_NVML_HOOKED(GS_DECLARE)
#undef GS_DECLARE

struct hook {
    const char *name;
    void *hook;
    void **real;
};

#define GS_CUDA_ROW(name, params) {#name, (void *)&name, (void **)&gs_cu.name},
#define GS_NVML_ROW(name, params) {#name, (void *)&name, (void **)&gs_nvml.name},
static const struct hook cuda_hooks[] = {GS_CUDA_HOOKED(GS_CUDA_ROW)};
static const struct hook nvml_hooks[] = {GS_NVML_HOOKED(GS_NVML_ROW)};
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Base names (as passed to cuGetProcAddress) whose entry points the shim must see. */
static const char *const hooked_bases[] = {
    "cuInit", "cuGetProcAddress", "cuDevicePrimaryCtxRetain", "cuCtxCreate", "cuMemAlloc", "cuMemAllocPitch",
    "cuMemAllocManaged", "cuMemFree", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync",
    "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemCreate", "cuMemRelease", "cuMemGetInfo", "cuDeviceTotalMem",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch", NULL};

static void *hook_by_name(const char *symbol)
{
    if (symbol[0] == 'c') {
        for (size_t i = 0; i < COUNT(cuda_hooks); i++)
            if (!strcmp(cuda_hooks[i].name, symbol))
                return cuda_hooks[i].hook;
    } else {
        for (size_t i = 0; i < COUNT(nvml_hooks); i++)
            if (!strcmp(nvml_hooks[i].name, symbol))
                return nvml_hooks[i].hook;
    }
    return NULL;
}

/* The hook for the driver entry point p that cuGetProcAddress returned for symbol (or p itself). */
static void *swap_entry(const char *symbol, void *p)
{
    for (size_t i = 0; i < COUNT(cuda_hooks); i++)
        if (*cuda_hooks[i].real == p)
            return cuda_hooks[i].hook;
    for (size_t i = 0; i < COUNT(cuda_hooks); i++)
        if (cuda_hooks[i].hook == p)
            return p; /* the driver looked the name up globally and found the hook itself */
    for (int i = 0; hooked_bases[i]; i++) {
        if (!strcmp(hooked_bases[i], symbol)) {
            GS_WARN("the driver returned an entry point for %s that the shim does not know; calls through it "
                    "are not limited", symbol);
            break;
        }
    }
    return p;
}

GS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    CUresult rc = gs_enter_lookup();
    if (rc)
        return rc;
    if (!gs_cu.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_SUPPORTED;
    rc = gs_cu.cuGetProcAddress_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = swap_entry(symbol, *pfn);
    return rc;
}

GS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CUresult rc = gs_enter_lookup();
    if (rc)
        return rc;
    if (!gs_cu.cuGetProcAddress)
        return CUDA_ERROR_NOT_SUPPORTED;
    rc = gs_cu.cuGetProcAddress(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS && symbol && pfn && *pfn)
        *pfn = swap_entry(symbol, *pfn);
    return rc;
}

void *gs_dlsym_hook(const char *symbol)
{
    return hook_by_name(symbol);
}
