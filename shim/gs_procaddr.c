/* How applications reach the driver, intercepted at each door:
 *   - plain symbol interposition: the hooks are exported under the driver's names;
 *   - dlsym: a lookup of a hooked cu* / nvml* name in any handle that has it returns the hook;
 *   - cuGetProcAddress / _v2 (how the CUDA runtime gets every entry point since 11.3): the driver picks the
 *     versioned / per-thread-stream variant, and the shim swaps in the hook for exactly that variant, matched
 *     by address, so a _ptsz request reaches the driver's _ptsz entry point through its own hook.
 * An allocation entry point the shim does not account (a newer version, an old one it does not hook) is refused
 * at lookup, with a message naming it: memory never escapes the limit through a door the shim does not know.
 * cuGetExportTable is hooked for one slot of one table (gs_export.c). dlsym itself is in gs_dlsym.c. */
#include <string.h>

#include "gs_hooks.h"
#include "gs_log.h"
#include "gs_shim.h"
#include "gs_variants.h"

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

/* Base names (as passed to cuGetProcAddress) of the ways to take device memory or to keep it taken (a mapping or a
 * handle reference keeps VMM memory alive; pool settings decide what a pool keeps; context limits reserve memory);
 * each is hooked in every version the shim knows. A lookup of one of these that the shim cannot answer with its
 * hook fails. "cuMemMap" also covers cuMemMapArrayAsync, whose mappings into sparse arrays the shim does not count. */
static const char *const allocation_bases[] = {
    "cuMemAlloc", "cuMemAllocPitch", "cuMemAllocManaged", "cuMemAllocAsync", "cuMemAllocFromPoolAsync",
    "cuMemCreate", "cuArrayCreate", "cuArray3DCreate", "cuMipmappedArrayCreate", "cuIpcOpenMemHandle",
    "cuGraphAddMemAllocNode", "cuGraphAddNode", "cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx",
    "cuModuleLoadFatBinary", "cuLibraryLoadData", "cuLibraryLoadFromFile", "cuMemMap", "cuMemRetainAllocationHandle",
    "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemPoolSetAttribute", "cuDeviceSetMemPool",
    "cuCtxSetLimit", NULL};
/* Other entry points the shim must see; an unknown variant of one of these is passed on with a warning. */
static const char *const hooked_bases[] = {
    "cuInit", "cuGetProcAddress", "cuGetExportTable", "cuDevicePrimaryCtxRetain", "cuCtxCreate", "cuMemFree", "cuMemFreeAsync",
    "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemPoolTrimTo", "cuMemRelease", "cuMemUnmap", "cuMemGetInfo",
    "cuDeviceTotalMem", "cuArrayDestroy", "cuMipmappedArrayDestroy", "cuIpcCloseMemHandle", "cuModuleUnload",
    "cuLibraryUnload", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch", NULL};
/* Names that start like an allocation base but take no device memory. */
static const char *const not_device_memory[] = {"cuMemAllocHost", NULL};

static int listed(const char *const *names, const char *symbol)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], symbol))
            return 1;
    return 0;
}

void *gs_hook_by_name(const char *symbol)
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

int gs_unaccounted_allocation(const char *symbol)
{
    if (gs_hook_by_name(symbol))
        return 0;
    for (int i = 0; not_device_memory[i]; i++)
        if (!strncmp(symbol, not_device_memory[i], strlen(not_device_memory[i])))
            return 0;
    for (int i = 0; allocation_bases[i]; i++)
        if (!strncmp(symbol, allocation_bases[i], strlen(allocation_bases[i])))
            return 1; /* the base itself, a versioned name (_v3) or a variant the shim does not know */
    return 0;
}

/* The hook for the driver entry point p that cuGetProcAddress returned for symbol, p itself, or NULL when the
 * lookup must fail: an allocation entry point in a version the shim does not hook. Matched by address first;
 * when the driver hands out an address that is not one of its exported symbols, by name and version (for
 * versions the shim knows: a newer one may have another signature). */
static void *swap_entry(const char *symbol, int version, cuuint64_t flags, void *p)
{
    for (size_t i = 0; i < COUNT(cuda_hooks); i++)
        if (*cuda_hooks[i].real == p)
            return cuda_hooks[i].hook;
    for (size_t i = 0; i < COUNT(cuda_hooks); i++)
        if (cuda_hooks[i].hook == p)
            return p; /* the driver looked the name up globally and found the hook itself */
    const char *variant = gs_variant(symbol, version, flags);
    for (size_t i = 0; variant && i < COUNT(cuda_hooks); i++) {
        if (!strcmp(cuda_hooks[i].name, variant) && *cuda_hooks[i].real) {
            GS_DEBUG("cuGetProcAddress(%s, version %d): matched by name to %s", symbol, version, variant);
            return cuda_hooks[i].hook;
        }
    }
    if (listed(allocation_bases, symbol) || gs_unaccounted_allocation(symbol)) {
        GS_ERROR("cuGetProcAddress(%s, version %d): the driver's entry point is not one the shim accounts "
                 "(a version it does not know); refused, so that memory taken through it cannot escape the limit",
                 symbol, version);
        return NULL;
    }
    if (listed(hooked_bases, symbol))
        GS_WARN("cuGetProcAddress(%s, version %d): an entry point the shim does not know; calls through it are "
                "not limited", symbol, version);
    return p;
}

static CUresult answer(CUresult rc, const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status)
{
    if (rc != CUDA_SUCCESS || !symbol || !pfn || !*pfn)
        return rc;
    *pfn = swap_entry(symbol, version, flags, *pfn);
    if (*pfn)
        return rc;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

GS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *status)
{
    CUresult rc = gs_enter_lookup();
    if (rc)
        return rc;
    if (!gs_cu.cuGetProcAddress_v2)
        return CUDA_ERROR_NOT_SUPPORTED;
    return answer(gs_cu.cuGetProcAddress_v2(symbol, pfn, version, flags, status), symbol, pfn, version, flags,
                  status);
}

GS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    CUresult rc = gs_enter_lookup();
    if (rc)
        return rc;
    if (!gs_cu.cuGetProcAddress)
        return CUDA_ERROR_NOT_SUPPORTED;
    return answer(gs_cu.cuGetProcAddress(symbol, pfn, version, flags), symbol, pfn, version, flags, NULL);
}
