/* What NVML says about a GPU's use: the processes with a context on it (under the host's pids: the driver
 * ignores PID namespaces, so inside a pod none equals getpid()), the whole GPU's utilisation, and the
 * utilisation of a set of processes (a container) from per-process samples. A leaf above gs_real. */
#ifndef GS_USAGE_H
#define GS_USAGE_H

#include <stdint.h>

#include "gs_cuda_types.h"

#define GS_USAGE_MAX_PROCS 256 /* processes on one GPU the shim looks at */

/* NVML's handle of the GPU with this UUID (NVML initialised once per process). 0, or -1 when NVML or the GPU
 * cannot be reached. */
int gs_usage_device(const char *uuid, nvmlDevice_t *out);

/* The NVML pids of the processes with a compute context on dev: how many (at most max are written), or -1. */
int gs_usage_processes(nvmlDevice_t dev, unsigned *pids, int max);

/* The whole GPU's utilisation in percent (nvmlDeviceGetUtilizationRates), or -1. */
int gs_usage_gpu(nvmlDevice_t dev);

/* The summed utilisation of the processes `pids` from per-process samples newer than *last_seen_us (advanced
 * to the newest sample seen): percent of the GPU, 0 when NVML has no newer sample with utilisation
 * (NVML_ERROR_NOT_FOUND), -1 when the driver does not report per-process utilisation. *others: the same sum
 * over every other process in those samples (the neighbours), from the same samples so the two compare.
 * *fresh: 1 when newer samples came back (for any process), 0 when there were none. Uses
 * nvmlDeviceGetProcessesUtilizationInfo where the driver has it (R550+), else nvmlDeviceGetProcessUtilization. */
int gs_usage_of(nvmlDevice_t dev, const unsigned *pids, int npids, uint64_t *last_seen_us, int *fresh,
                int *others);

#endif /* GS_USAGE_H */
