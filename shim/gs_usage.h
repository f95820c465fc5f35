/* What NVML says about a GPU's use: the processes with a context on it (under the host's pids: the driver
 * ignores PID namespaces, so inside a pod none equals getpid()), the whole GPU's utilisation, and the
 * utilisation of a set of processes (a container) from per-process samples. A leaf above gs_real. */
#ifndef GS_USAGE_H
#define GS_USAGE_H

#include <stdint.h>

#include "gs_cuda_types.h"

#define GS_USAGE_MAX_PROCS 256 /* processes on one GPU the shim looks at */

/* Whether `pid` is one of the n in pids. */
static inline int gs_usage_pid_in(const unsigned *pids, int n, unsigned pid)
{
    for (int k = 0; k < n; k++)
        if (pids[k] == pid)
            return 1;
    return 0;
}

/* NVML's handle of the GPU with this UUID (NVML initialised once per process). 0, or -1 when NVML or the GPU
 * cannot be reached. */
int gs_usage_device(const char *uuid, nvmlDevice_t *out);

/* The NVML pids of the processes with a compute context on dev: how many (at most max are written), or -1. */
int gs_usage_processes(nvmlDevice_t dev, unsigned *pids, int max);

/* The whole GPU's utilisation in percent (nvmlDeviceGetUtilizationRates), or -1. */
int gs_usage_gpu(nvmlDevice_t dev);

/* What NVML's per-process samples newer than a timestamp say. Drivers differ in what a sample is: one entry per
 * process and sample period with its share of the period (the sum over processes is the GPU's use), or, as seen
 * on an H100 with driver 580, one entry per period naming the single process resident on the GPU at that
 * moment with the whole GPU's use. Either way the container's part of the GPU's use over many samples is
 * ours / all, which is how the compute share reads them (gs_throttle.c). */
struct gs_usage_sampled {
    unsigned entries, mine; /* entries returned, and those of the given processes */
    unsigned ours, all;     /* smUtil summed over those of the given processes, and over all (each at most 100) */
};

/* The per-process samples newer than *last_seen_us (advanced to the newest seen), summed into *out for the
 * processes `pids` and for all. 0 (NVML_ERROR_NOT_FOUND, no newer sample: 0 with no entries), or -1 when the
 * driver does not report per-process utilisation. Uses nvmlDeviceGetProcessesUtilizationInfo where the driver has
 * it (R550+), else nvmlDeviceGetProcessUtilization. */
int gs_usage_samples(nvmlDevice_t dev, const unsigned *pids, int npids, uint64_t *last_seen_us,
                     struct gs_usage_sampled *out);

#endif /* GS_USAGE_H */
