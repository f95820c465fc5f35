/* nvidia-smi: loading libnvidia-ml.so.1 and reading what the tool prints. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "smi/smi.h"

struct smi_nvml nvml;

int smi_load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        printf("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA "
               "Display Driver is properly installed and present in your system.\n"
               "Please also try adding directory that contains libnvidia-ml.so to your system PATH.\n");
        return SMI_LIBRARY_NOT_FOUND;
    }
#define SMI_RESOLVE(name, ret, params, required)                                                             \
    nvml.name = (ret(*) params)dlsym(lib, #name);                                                            \
    if (!nvml.name && (required)) {                                                                          \
        printf("NVIDIA-SMI couldn't find %s in libnvidia-ml.so.1: the library is too old or not NVML.\n", #name); \
        return SMI_LIBRARY_NOT_FOUND;                                                                        \
    }
    SMI_NVML(SMI_RESOLVE)
#undef SMI_RESOLVE
    return SMI_OK;
}

/* Does `gpu` match one entry of the comma-separated list of indices, UUIDs and PCI bus ids? */
static int selected(const struct smi_gpu *gpu, const char *select)
{
    if (!select)
        return 1;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", select);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        unsigned long idx = strtoul(tok, &end, 10);
        if (*tok && !*end && idx == gpu->index)
            return 1;
        if (!strcmp(tok, gpu->uuid) || (strlen(tok) >= 5 && !strncmp(gpu->uuid, tok, strlen(tok))) ||
            !strcasecmp(tok, gpu->bus_id))
            return 1;
    }
    return 0;
}

static void read_gpu(struct smi_gpu *g)
{
    snprintf(g->name, sizeof g->name, SMI_NA);
    snprintf(g->uuid, sizeof g->uuid, SMI_NA);
    snprintf(g->bus_id, sizeof g->bus_id, SMI_NA);
    if (nvml.nvmlDeviceGetName)
        nvml.nvmlDeviceGetName(g->handle, g->name, sizeof g->name);
    if (nvml.nvmlDeviceGetUUID)
        nvml.nvmlDeviceGetUUID(g->handle, g->uuid, sizeof g->uuid);
    nvmlPciInfo_t pci;
    if (nvml.nvmlDeviceGetPciInfo_v3 && nvml.nvmlDeviceGetPciInfo_v3(g->handle, &pci) == NVML_SUCCESS)
        snprintf(g->bus_id, sizeof g->bus_id, "%s", pci.busId);
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    nvmlMemory_t m1;
    if (nvml.nvmlDeviceGetMemoryInfo_v2 && nvml.nvmlDeviceGetMemoryInfo_v2(g->handle, &m2) == NVML_SUCCESS) {
        g->total = m2.total, g->used = m2.used, g->free = m2.free, g->reserved = m2.reserved;
        g->have_mem = g->have_reserved = 1;
    } else if (nvml.nvmlDeviceGetMemoryInfo && nvml.nvmlDeviceGetMemoryInfo(g->handle, &m1) == NVML_SUCCESS) {
        g->total = m1.total, g->used = m1.used, g->free = m1.free;
        g->have_mem = 1;
    }
    nvmlUtilization_t u;
    if (nvml.nvmlDeviceGetUtilizationRates && nvml.nvmlDeviceGetUtilizationRates(g->handle, &u) == NVML_SUCCESS) {
        g->util_gpu = u.gpu, g->util_mem = u.memory;
        g->have_util = 1;
    }
    if (nvml.nvmlDeviceGetCudaComputeCapability &&
        nvml.nvmlDeviceGetCudaComputeCapability(g->handle, &g->cc_major, &g->cc_minor) == NVML_SUCCESS)
        g->have_cc = 1;
}

int smi_read_node(struct smi_node *node, const char *select)
{
    memset(node, 0, sizeof *node);
    nvmlReturn_t rc = nvml.nvmlInit_v2();
    if (rc != NVML_SUCCESS) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.\n\n");
        return SMI_DRIVER_NOT_LOADED;
    }
    char version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int cuda;
    snprintf(node->driver_version, sizeof node->driver_version, SMI_NA);
    if (nvml.nvmlSystemGetDriverVersion && nvml.nvmlSystemGetDriverVersion(version, sizeof version) == NVML_SUCCESS)
        snprintf(node->driver_version, sizeof node->driver_version, "%s", version);
    snprintf(node->cuda_version, sizeof node->cuda_version, SMI_NA);
    if (nvml.nvmlSystemGetCudaDriverVersion && nvml.nvmlSystemGetCudaDriverVersion(&cuda) == NVML_SUCCESS)
        snprintf(node->cuda_version, sizeof node->cuda_version, "%d.%d", cuda / 1000, cuda % 1000 / 10);
    unsigned count = 0;
    if (nvml.nvmlDeviceGetCount_v2(&count) != NVML_SUCCESS)
        count = 0;
    int result = SMI_OK;
    for (unsigned i = 0; i < count && node->count < SMI_MAX_GPUS; i++) {
        struct smi_gpu *g = &node->gpus[node->count];
        memset(g, 0, sizeof *g);
        g->index = i;
        rc = nvml.nvmlDeviceGetHandleByIndex_v2(i, &g->handle);
        if (rc != NVML_SUCCESS) {
            printf("Unable to determine the device handle for GPU %u: %s\n", i, nvml.nvmlErrorString(rc));
            result = rc == NVML_ERROR_GPU_IS_LOST ? SMI_GPU_LOST : SMI_OTHER;
            continue;
        }
        read_gpu(g);
        if (selected(g, select))
            node->count++;
    }
    if (node->count == 0 && result == SMI_OK) {
        printf("No devices were found\n");
        result = SMI_NOT_FOUND;
    }
    return result;
}

/* The process's command as /proc shows it (its first word), or N/A when this namespace cannot see it. */
static void process_name(unsigned pid, char *out, size_t len)
{
    char path[64];
    snprintf(out, len, SMI_NA);
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return;
    size_t n = fread(out, 1, len - 1, f);
    fclose(f);
    out[n] = '\0';
    if (!n)
        snprintf(out, len, SMI_NA);
}

void smi_read_processes(struct smi_node *node)
{
    node->nprocs = 0;
    if (!nvml.nvmlDeviceGetComputeRunningProcesses_v3)
        return;
    for (unsigned i = 0; i < node->count; i++) {
        nvmlProcessInfo_t infos[SMI_MAX_PROCS];
        unsigned n = SMI_MAX_PROCS;
        if (nvml.nvmlDeviceGetComputeRunningProcesses_v3(node->gpus[i].handle, &n, infos) != NVML_SUCCESS)
            continue;
        for (unsigned k = 0; k < n && node->nprocs < SMI_MAX_PROCS; k++) {
            struct smi_proc *p = &node->procs[node->nprocs++];
            p->gpu = i;
            p->pid = infos[k].pid;
            p->used = infos[k].usedGpuMemory;
            process_name(p->pid, p->name, sizeof p->name);
        }
    }
}
