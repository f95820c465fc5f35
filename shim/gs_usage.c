/* NVML readings for the compute share; see gs_usage.h. */
#include "gs_usage.h"

#include <pthread.h>

#include "gs_log.h"
#include "gs_real.h"

/* nvml.h layouts of what is read here. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} gs_nvml_process_t; /* nvmlProcessInfo_t (_v2 and _v3 calls) */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} gs_nvml_process_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} gs_nvml_proc_sample_t; /* nvmlProcessUtilizationSample_t */

typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} gs_nvml_proc_util_t; /* nvmlProcessUtilizationInfo_v1_t */

typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    gs_nvml_proc_util_t *procUtilArray;
} gs_nvml_procs_util_t; /* nvmlProcessesUtilizationInfo_v1_t */
#define GS_NVML_PROCS_UTIL_V1 ((unsigned int)(sizeof(gs_nvml_procs_util_t) | (1u << 24)))

#define NVML_ERROR_INSUFFICIENT_SIZE 7

_Static_assert(sizeof(gs_nvml_process_t) == 24, "nvmlProcessInfo_t layout");
_Static_assert(sizeof(gs_nvml_proc_sample_t) == 32, "nvmlProcessUtilizationSample_t layout");
_Static_assert(sizeof(gs_nvml_proc_util_t) == 40, "nvmlProcessUtilizationInfo_v1_t layout");
_Static_assert(GS_NVML_PROCS_UTIL_V1 == 0x01000018u, "nvmlProcessesUtilizationInfo_v1 version");

static struct {
    int ok;
    gs_pfn_nvmlDeviceGetComputeRunningProcesses_v3 list; /* _v3, else _v2 (same struct) */
    gs_pfn_nvmlDeviceGetComputeRunningProcesses list_v1;  /* when neither exists */
} nv;
static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void load(void)
{
    if (gs_real_load_nvml() != 0 || !gs_nvml.nvmlInit_v2 || !gs_nvml.nvmlDeviceGetHandleByUUID ||
        gs_nvml.nvmlInit_v2() != NVML_SUCCESS)
        return;
    nv.list = gs_nvml.nvmlDeviceGetComputeRunningProcesses_v3;
    if (!nv.list)
        nv.list = gs_nvml.nvmlDeviceGetComputeRunningProcesses_v2;
    if (!nv.list)
        nv.list_v1 = gs_nvml.nvmlDeviceGetComputeRunningProcesses;
    nv.ok = 1;
}

int gs_usage_device(const char *uuid, nvmlDevice_t *out)
{
    pthread_once(&nv_once, load);
    if (!nv.ok || gs_nvml.nvmlDeviceGetHandleByUUID(uuid, out) != NVML_SUCCESS)
        return -1;
    return 0;
}

int gs_usage_processes(nvmlDevice_t dev, unsigned *pids, int max)
{
    union {
        gs_nvml_process_t v3[GS_USAGE_MAX_PROCS];
        gs_nvml_process_v1_t v1[GS_USAGE_MAX_PROCS];
    } buf; /* 6 KiB of stack: called from context creation and the controller thread only */
    unsigned int n = GS_USAGE_MAX_PROCS;
    nvmlReturn_t rc;
    if (nv.list)
        rc = nv.list(dev, &n, buf.v3);
    else if (nv.list_v1)
        rc = nv.list_v1(dev, &n, buf.v1);
    else
        return -1;
    if (rc != NVML_SUCCESS)
        return -1;
    int count = 0;
    for (unsigned i = 0; i < n && count < max; i++)
        pids[count++] = nv.list ? buf.v3[i].pid : buf.v1[i].pid;
    return count;
}

int gs_usage_gpu(nvmlDevice_t dev)
{
    nvmlUtilization_t u;
    if (!gs_nvml.nvmlDeviceGetUtilizationRates || gs_nvml.nvmlDeviceGetUtilizationRates(dev, &u) != NVML_SUCCESS)
        return -1;
    return u.gpu > 100 ? 100 : (int)u.gpu;
}

int gs_usage_samples(nvmlDevice_t dev, const unsigned *pids, int npids, uint64_t *last_seen_us,
                     struct gs_usage_sampled *out)
{
    union {
        gs_nvml_proc_util_t info[GS_USAGE_MAX_PROCS];
        gs_nvml_proc_sample_t samples[GS_USAGE_MAX_PROCS];
    } buf; /* 10 KiB of stack: the controller thread only */
    gs_nvml_proc_util_t *info_buf = buf.info;
    gs_nvml_proc_sample_t *sample_buf = buf.samples;
    unsigned spid[GS_USAGE_MAX_PROCS], sm[GS_USAGE_MAX_PROCS];
    unsigned n = 0;
    unsigned long long newest = *last_seen_us;
    nvmlReturn_t rc;
    *out = (struct gs_usage_sampled){0};
    if (gs_nvml.nvmlDeviceGetProcessesUtilizationInfo) {
        gs_nvml_procs_util_t info = {GS_NVML_PROCS_UTIL_V1, GS_USAGE_MAX_PROCS, *last_seen_us, info_buf};
        rc = gs_nvml.nvmlDeviceGetProcessesUtilizationInfo(dev, &info);
        if (rc == NVML_SUCCESS) {
            n = info.processSamplesCount < GS_USAGE_MAX_PROCS ? info.processSamplesCount : GS_USAGE_MAX_PROCS;
            for (unsigned i = 0; i < n; i++) {
                spid[i] = info_buf[i].pid;
                sm[i] = info_buf[i].smUtil;
                newest = info_buf[i].timeStamp > newest ? info_buf[i].timeStamp : newest;
            }
        }
    } else if (gs_nvml.nvmlDeviceGetProcessUtilization) {
        unsigned int count = GS_USAGE_MAX_PROCS;
        rc = gs_nvml.nvmlDeviceGetProcessUtilization(dev, sample_buf, &count, *last_seen_us);
        if (rc == NVML_SUCCESS) {
            n = count < GS_USAGE_MAX_PROCS ? count : GS_USAGE_MAX_PROCS;
            for (unsigned i = 0; i < n; i++) {
                spid[i] = sample_buf[i].pid;
                sm[i] = sample_buf[i].smUtil;
                newest = sample_buf[i].timeStamp > newest ? sample_buf[i].timeStamp : newest;
            }
        }
    } else {
        return -1;
    }
    if (rc == NVML_ERROR_NOT_FOUND)
        return 0; /* no process had utilisation in a newer sample: normal, not a failure */
    if (rc != NVML_SUCCESS) {
        GS_DEBUG("per-process utilisation: NVML error %d", rc);
        return rc == NVML_ERROR_INSUFFICIENT_SIZE ? 0 : -1;
    }
    *last_seen_us = newest;
    for (unsigned i = 0; i < n; i++) {
        out->entries++;
        out->all += sm[i] > 100 ? 100 : sm[i];
        if (gs_usage_pid_in(pids, npids, spid[i])) {
            out->mine++;
            out->ours += sm[i] > 100 ? 100 : sm[i];
        }
    }
    return 0;
}
