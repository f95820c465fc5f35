/* The virtual view through NVML (nvidia-smi, pynvml, frameworks): the memory of each GPU as this container
 * sees it. GPUs are matched by UUID: to the limits file, or (env mode) to what CUDA processes of the container
 * registered, falling back to the NVML index for CUDA_DEVICE_MEMORY_LIMIT_<i>. */
#include <string.h>
#include <strings.h>

#include "gs_region.h"
#include "gs_shim.h"

/* The limit for this NVML device and its index in the accounting file (-1: nothing accounted yet).
 * 0 when no limit applies. */
static uint64_t view_of(nvmlDevice_t device, int *rd)
{
    char uuid[GS_UUID_LEN];
    *rd = -1;
    if (!gs_nvml.nvmlDeviceGetUUID || gs_nvml.nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return 0;
    uint64_t limit = 0;
    if (gs_cfg.from_file) {
        for (int i = 0; i < gs_cfg.file.ndevices; i++)
            if (!strcasecmp(gs_cfg.file.dev[i].uuid, uuid))
                limit = gs_cfg.file.dev[i].memory_limit;
    }
    if (gs_region_open_existing(gs_cfg.cache_path) == 0)
        *rd = gs_region_device(uuid, 0, 0);
    if (!gs_cfg.from_file) {
        unsigned int index;
        if (*rd >= 0)
            limit = gs_region_device_limit(*rd);
        else if (gs_nvml.nvmlDeviceGetIndex && gs_nvml.nvmlDeviceGetIndex(device, &index) == NVML_SUCCESS &&
                 index < GS_MAX_DEVICES)
            limit = gs_cfg.env_memory[index];
    }
    if (limit)
        gs_region_reap_lazily();
    return limit;
}

/* total = min(limit, physical); used = the container's usage; free never negative nor above the real free. */
static void apply(uint64_t limit, int rd, unsigned long long *total, unsigned long long *free_b,
                  unsigned long long *used)
{
    uint64_t t = limit < *total ? limit : *total;
    uint64_t u = rd >= 0 ? gs_region_usage(rd) : 0;
    uint64_t f = u < t ? t - u : 0;
    if (f > *free_b)
        f = *free_b;
    *total = t;
    *used = u;
    *free_b = f;
}

static nvmlReturn_t enter(void)
{
    gs_config_once();
    if (gs_real_load_nvml() != 0)
        return NVML_ERROR_LIBRARY_NOT_FOUND;
    return gs_cfg.refused ? NVML_ERROR_NO_PERMISSION : NVML_SUCCESS;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t rc = enter();
    if (rc == NVML_SUCCESS && !gs_nvml.nvmlDeviceGetMemoryInfo)
        rc = NVML_ERROR_FUNCTION_NOT_FOUND;
    if (rc != NVML_SUCCESS || (rc = gs_nvml.nvmlDeviceGetMemoryInfo(device, memory)) != NVML_SUCCESS || !memory)
        return rc;
    int rd;
    uint64_t limit = view_of(device, &rd);
    if (limit)
        apply(limit, rd, &memory->total, &memory->free, &memory->used);
    return rc;
}

GS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t rc = enter();
    if (rc == NVML_SUCCESS && !gs_nvml.nvmlDeviceGetMemoryInfo_v2)
        rc = NVML_ERROR_FUNCTION_NOT_FOUND;
    if (rc != NVML_SUCCESS || (rc = gs_nvml.nvmlDeviceGetMemoryInfo_v2(device, memory)) != NVML_SUCCESS || !memory)
        return rc;
    int rd;
    uint64_t limit = view_of(device, &rd);
    if (limit) {
        apply(limit, rd, &memory->total, &memory->free, &memory->used);
        memory->reserved = 0;
    }
    return rc;
}
