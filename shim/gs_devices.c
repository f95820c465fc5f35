/* The devices this process sees, matched to their limits by UUID, and the memory accounting around each
 * allocation: reserve first, allocate, then keep or roll back. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gs_log.h"
#include "gs_region.h"
#include "gs_shim.h"
#include "gs_throttle.h"

struct gs_dev gs_devs[GS_MAX_DEVICES];
int gs_ndevs;
int gs_any_limit;
struct gs_ptrmap gs_pointers = GS_PTRMAP_INIT;
struct gs_ptrmap gs_handles = GS_PTRMAP_INIT;

static pthread_mutex_t setup_lock = PTHREAD_MUTEX_INITIALIZER;

void gs_devices_after_fork_child(void)
{
    pthread_mutex_init(&setup_lock, NULL);
    for (int d = 0; d < GS_MAX_DEVICES; d++)
        gs_devs[d].ctx_charged = 0;
    gs_ptrmap_reset(&gs_pointers);
    gs_ptrmap_reset(&gs_handles);
}

static void format_uuid(const CUuuid *u, char *out, size_t len)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
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
    gs_throttle_setup(count);
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

static void report_oom(int d, uint64_t bytes)
{
    struct gs_dev *dev = &gs_devs[d];
    GS_INFO("out of memory on CUDA device %d: %llu bytes requested, %llu of the limit %llu in use", d,
            (unsigned long long)bytes, (unsigned long long)gs_region_usage(dev->rd), (unsigned long long)dev->limit);
}

CUresult gs_ctx_charge(int d, int *charged_now)
{
    *charged_now = 0;
    if (d < 0 || d >= gs_ndevs)
        return gs_any_limit ? CUDA_ERROR_NOT_PERMITTED : CUDA_SUCCESS;
    struct gs_dev *dev = &gs_devs[d];
    if (dev->blocked)
        return CUDA_ERROR_NOT_PERMITTED;
    if (!dev->limit || !gs_cfg.context_reserve)
        return CUDA_SUCCESS;
    int expected = 0;
    if (__atomic_load_n(&dev->ctx_charged, __ATOMIC_ACQUIRE) ||
        !__atomic_compare_exchange_n(&dev->ctx_charged, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    if (gs_region_reserve(dev->rd, gs_cfg.context_reserve, dev->limit) != 0) {
        __atomic_store_n(&dev->ctx_charged, 0, __ATOMIC_RELEASE);
        report_oom(d, gs_cfg.context_reserve);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *charged_now = 1;
    return CUDA_SUCCESS;
}

void gs_ctx_uncharge(int d)
{
    struct gs_dev *dev = &gs_devs[d];
    gs_region_release(dev->rd, gs_cfg.context_reserve);
    __atomic_store_n(&dev->ctx_charged, 0, __ATOMIC_RELEASE);
}

CUresult gs_alloc_begin(int d, uint64_t bytes, int *tracked)
{
    *tracked = 0;
    if (!gs_any_limit)
        return CUDA_SUCCESS;
    if (d < 0 || d >= gs_ndevs)
        return CUDA_ERROR_NOT_PERMITTED;
    struct gs_dev *dev = &gs_devs[d];
    if (dev->blocked)
        return CUDA_ERROR_NOT_PERMITTED;
    if (!dev->limit)
        return CUDA_SUCCESS;
    int charged_now;
    CUresult rc = gs_ctx_charge(d, &charged_now);
    if (rc)
        return rc;
    if (gs_region_reserve(dev->rd, bytes, dev->limit) != 0) {
        report_oom(d, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *tracked = 1;
    return CUDA_SUCCESS;
}

void gs_alloc_end(CUresult rc, int tracked, int d, uint64_t bytes, struct gs_ptrmap *map, uint64_t key)
{
    if (!tracked)
        return;
    if (rc != CUDA_SUCCESS) {
        gs_region_release(gs_devs[d].rd, bytes);
        return;
    }
    if (gs_ptrmap_put(map, key, bytes, d) != 0)
        GS_WARN("out of host memory: %llu bytes on CUDA device %d stay charged until the process ends",
                (unsigned long long)bytes, d);
}

void gs_alloc_undo(int d, uint64_t bytes)
{
    gs_region_release(gs_devs[d].rd, bytes);
}

int gs_free_begin(struct gs_ptrmap *map, uint64_t key, struct gs_ptr_entry *e)
{
    return gs_any_limit ? gs_ptrmap_take(map, key, e) : 0;
}

void gs_free_end(CUresult rc, int had, struct gs_ptrmap *map, const struct gs_ptr_entry *e)
{
    if (!had)
        return;
    if (rc == CUDA_SUCCESS)
        gs_region_release(gs_devs[e->dev].rd, e->bytes);
    else
        gs_ptrmap_put(map, e->key, e->bytes, e->dev);
}
