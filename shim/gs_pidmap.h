/* Which pid NVML reports for each process of the container. The driver ignores PID namespaces, so inside a
 * pod no NVML pid equals getpid(): a process finds its own as the one pid that appears in the GPU's list of
 * processes with a context (nvmlDeviceGetComputeRunningProcesses) while it creates its context, and records it
 * in its slot of the container's usage file, where every process of the container reads the whole set.
 *
 * Race-free: the list is read before and after the context is created while holding the container's lock
 * (processes of this container) and a per-GPU lock shared by the containers on the node (flock on
 * <dir>/<uuid>.lock; read-only files do): <dir> is the daemon's mount GS_CONTAINER_GPU_LOCK_DIR when its limits
 * file is mounted, else GPUSHARE_GPU_LOCK_DIR when set. A new pid that another
 * process of the container already claimed is not ours. Only exactly one remaining new pid is taken; anything
 * else (a process outside the shim created a context at the same moment) leaves the process marked unmapped
 * (nvml_pid = -1) with a warning, and the compute share then measures that GPU as a whole. A context step in
 * which no new pid appears (the runtime may look the primary context up in one call and create it in a later
 * one) marks the process unmapped meanwhile and looks again at its next context step, up to GS_PIDMAP_TRIES. */
#ifndef GS_PIDMAP_H
#define GS_PIDMAP_H

#include "gs_cuda_types.h"
#include "gs_usage.h"

#include "gpushare_contract.h" /* GS_ENV_GPU_LOCK_DIR, GS_CONTAINER_GPU_LOCK_DIR */

struct gs_slot;

struct gs_pidmap_scope {
    int active;
    int lock_fd;
    struct gs_slot *slot; /* this process's slot in the usage file */
    nvmlDevice_t dev;
    int nbefore;
    unsigned before[GS_USAGE_MAX_PROCS];
};

/* Before creating a context on the GPU with this UUID: take the locks and the list (unless this process is
 * mapped already). */
void gs_pidmap_begin(struct gs_pidmap_scope *s, const char *uuid);
/* After: read the list again, record the pid when the context was created, release the locks. */
void gs_pidmap_end(struct gs_pidmap_scope *s, CUresult rc);

/* A process about to launch on a GPU with a share whose NVML pid was never looked for (its context was not
 * created through the shim's hooks) is marked unmapped, so its container is measured as the whole GPU rather
 * than undercounted. Cheap after the first call. */
void gs_pidmap_check(void);

/* The NVML pids of the container's live processes (at most max); *unmapped counts live processes that created
 * a context but could not be mapped. */
int gs_pidmap_container(unsigned *pids, int max, int *unmapped);

#endif /* GS_PIDMAP_H */
