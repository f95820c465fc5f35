/* The devices this process sees, matched to their limits by UUID; see gs_devices.h. */
#include "gs_devices.h"

#include <stdio.h>
#include <string.h>

#include "gs_log.h"
#include "gs_region.h"

#define GS_DEFAULT_GRANULARITY (2ULL << 20) /* the driver's documented granularity for device memory */

struct gs_dev gs_devs[GS_MAX_DEVICES];
int gs_ndevs;
int gs_any_limit;

static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;
static gs_devices_listener listener;

static void child_after_fork(void)
{
    pthread_mutex_init(&setup_lock, NULL);
}
GS_ON_FORK_CHILD(child_after_fork)

void gs_devices_on_ready(gs_devices_listener fn)
{
    listener = fn;
}

static void format_uuid(const CUuuid *u, char *out, size_t len)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* What the driver rounds device allocations to: its minimum granularity for cuMemCreate on this GPU (the
 * same page size cuMemAlloc and pools use), or the documented 2 MiB when it cannot say. */
static uint64_t granularity(int ordinal)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    size_t g = 0;
    if (!gs_cu.cuMemGetAllocationGranularity ||
        gs_cu.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g ||
        (g & (g - 1))) {
        GS_DEBUG("CUDA device %d: allocation granularity unknown; charging in 2 MiB steps", ordinal);
        return GS_DEFAULT_GRANULARITY;
    }
    return g;
}

static int read_device(int ordinal, struct gs_dev *dev)
{
    CUdevice handle;
    CUuuid uuid;
    size_t total = 0;
    if (!gs_cu.cuDeviceGet || gs_cu.cuDeviceGet(&handle, ordinal) != CUDA_SUCCESS)
        return -1;
    gs_pfn_cuDeviceGetUuid get_uuid = gs_cu.cuDeviceGetUuid_v2 ? gs_cu.cuDeviceGetUuid_v2 : gs_cu.cuDeviceGetUuid;
    if (!get_uuid || get_uuid(&uuid, handle) != CUDA_SUCCESS)
        return -1;
    format_uuid(&uuid, dev->uuid, sizeof dev->uuid);
    if (gs_cu.cuDeviceTotalMem_v2)
        gs_cu.cuDeviceTotalMem_v2(&total, handle);
    dev->phys_total = total;
    dev->granularity = granularity(ordinal);
    if (gs_config_device(ordinal, dev->uuid, &dev->limit, &dev->sm_limit) != 0) {
        dev->blocked = 1;
        dev->limit = 0;
        dev->sm_limit = 100;
        GS_ERROR("CUDA device %d (%s) is not in the limits file %s; this process may not use it", ordinal,
                 dev->uuid, gs_cfg.limits_path);
    }
    return 0;
}

int gs_devices_setup(void)
{
    if (__atomic_load_n(&gs_ndevs, __ATOMIC_ACQUIRE) > 0)
        return 0;
    int count = 0, rc = -1;
    pthread_mutex_lock(&setup_lock);
    if (gs_ndevs > 0) {
        pthread_mutex_unlock(&setup_lock);
        return 0;
    }
    if (!gs_cu.cuDeviceGetCount || gs_cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count <= 0)
        goto out;
    if (count > GS_MAX_DEVICES) {
        GS_WARN("this process sees %d GPUs; the shim manages the first %d and blocks the others", count,
                GS_MAX_DEVICES);
        count = GS_MAX_DEVICES;
    }
    int any = 0;
    for (int d = 0; d < count; d++) {
        memset(&gs_devs[d], 0, sizeof gs_devs[d]);
        if (read_device(d, &gs_devs[d]) != 0)
            goto out;
        any |= gs_devs[d].limit != 0 || gs_devs[d].blocked;
    }
    if (any && gs_region_open(gs_cfg.cache_path) != 0) {
        char why[PATH_MAX + 128];
        snprintf(why, sizeof why, "cannot account memory across processes in %s (see the message above)",
                 gs_cfg.cache_path);
        gs_refuse(why);
        goto out;
    }
    for (int d = 0; d < count; d++) {
        struct gs_dev *dev = &gs_devs[d];
        dev->rd = -1;
        if (dev->limit && (dev->rd = gs_region_device(dev->uuid, 1, dev->limit)) < 0) {
            gs_refuse("the accounting file has no room for another GPU");
            goto out;
        }
        if (!dev->blocked)
            GS_INFO("CUDA device %d (%s): memory limit %llu MiB of %llu MiB, compute share %d%%", d, dev->uuid,
                    (unsigned long long)(dev->limit >> 20), (unsigned long long)(dev->phys_total >> 20),
                    dev->sm_limit);
    }
    gs_any_limit = any;
    if (listener && listener(count) != 0)
        goto out;
    __atomic_store_n(&gs_ndevs, count, __ATOMIC_RELEASE);
    rc = 0;
out:
    pthread_mutex_unlock(&setup_lock);
    return rc;
}

CUresult gs_current_device(int *d)
{
    if (__atomic_load_n(&gs_ndevs, __ATOMIC_RELAXED) == 1) {
        *d = 0;
        return CUDA_SUCCESS;
    }
    CUdevice dev;
    CUresult rc = gs_cu.cuCtxGetDevice ? gs_cu.cuCtxGetDevice(&dev) : CUDA_ERROR_NOT_SUPPORTED;
    if (rc == CUDA_SUCCESS)
        *d = dev;
    return rc;
}
