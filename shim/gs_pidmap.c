/* Mapping processes to their NVML pids; see gs_pidmap.h. */
#define _GNU_SOURCE
#include "gs_pidmap.h"

#include "gs_config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "gs_log.h"
#include "gs_region.h"
#include "gs_state.h"

#define GS_GPU_LOCK_WAIT_MS 2000 /* a neighbour that holds the GPU's lock longer is not waited for */

#define GS_PIDMAP_TRIES 8 /* context steps that may look for this process's NVML pid before it is given up */

static int mapped_here; /* this process's NVML pid is settled: found, ambiguous, or given up (not inherited) */
static int tries_left = GS_PIDMAP_TRIES; /* context steps that may still look for it while none found it */

static void child_after_fork(void)
{
    mapped_here = 0;
    tries_left = GS_PIDMAP_TRIES;
}
GS_ON_FORK_CHILD(child_after_fork)

static int slot_live(const struct gs_slot *s, int32_t *pid)
{
    *pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    return *pid > 0 && (kill(*pid, 0) == 0 || errno != ESRCH);
}

/* The NVML pid a live slot has recorded: > 0, -1 when unmapped, 0 when it has none. */
static int32_t slot_nvml_pid(const struct gs_slot *s)
{
    int32_t pid;
    if (!slot_live(s, &pid) || __atomic_load_n(&s->nvml_owner, __ATOMIC_ACQUIRE) != pid)
        return 0;
    return __atomic_load_n(&s->nvml_pid, __ATOMIC_ACQUIRE);
}

int gs_pidmap_container(unsigned *pids, int max, int *unmapped)
{
    struct gs_region *r = gs_region_map();
    int n = 0;
    *unmapped = 0;
    if (!r)
        return 0;
    uint32_t nslots = __atomic_load_n(&r->nslots, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < nslots && i < GS_REGION_SLOTS; i++) {
        int32_t p = slot_nvml_pid(&r->slots[i]);
        if (p > 0 && n < max)
            pids[n++] = (unsigned)p;
        else if (p < 0)
            (*unmapped)++;
    }
    return n;
}

static int claimed_by_other(const struct gs_region *r, const struct gs_slot *mine, unsigned pid)
{
    uint32_t nslots = __atomic_load_n(&r->nslots, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < nslots && i < GS_REGION_SLOTS; i++)
        if (&r->slots[i] != mine && slot_nvml_pid(&r->slots[i]) == (int32_t)pid)
            return 1;
    return 0;
}

/* The node-wide lock of this GPU, when the containers share a lock directory. -1 when there is none. */
static int gpu_lock(const char *uuid)
{
    const char *dir = gs_cfg.from_file && !strcmp(gs_cfg.limits_path, GS_CONTAINER_LIMITS_PATH)
                          ? GS_CONTAINER_GPU_LOCK_DIR /* the daemon's: a process cannot opt out of it */
                          : getenv(GS_ENV_GPU_LOCK_DIR);
    if (!dir || !*dir)
        return -1;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s.lock", dir, uuid);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0444);
    if (fd < 0) {
        GS_WARN("cannot open the GPU lock %s: %s; telling this process's NVML pid apart from a neighbour "
                "starting at the same moment is not guaranteed", path, strerror(errno));
        return -1;
    }
    for (int waited = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; waited++) {
        if (waited >= GS_GPU_LOCK_WAIT_MS) {
            GS_WARN("the GPU lock %s is held for more than %d ms; going on without it", path, GS_GPU_LOCK_WAIT_MS);
            close(fd);
            return -1;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return fd;
}

void gs_pidmap_check(void)
{
    if (__atomic_load_n(&mapped_here, __ATOMIC_ACQUIRE) || __atomic_load_n(&tries_left, __ATOMIC_ACQUIRE) <
        GS_PIDMAP_TRIES || !gs_region_ready())
        return; /* settled, or looked for already and marked unmapped until a later context step finds it */
    struct gs_slot *mine = gs_region_own_slot();
    if (!mine)
        return;
    gs_region_lock();
    if (!mapped_here) {
        __atomic_store_n(&mine->nvml_pid, -1, __ATOMIC_RELEASE);
        __atomic_store_n(&mine->nvml_owner, (int32_t)getpid(), __ATOMIC_RELEASE);
        __atomic_store_n(&mapped_here, 1, __ATOMIC_RELEASE);
        GS_WARN("this process launches kernels on a GPU with a compute share but its NVML pid is unknown (its "
                "context was not created through the shim); its container's GPU use is measured as the whole GPU's");
    }
    gs_region_unlock();
}

void gs_pidmap_begin(struct gs_pidmap_scope *s, const char *uuid)
{
    s->active = 0;
    s->lock_fd = -1;
    if (__atomic_load_n(&mapped_here, __ATOMIC_ACQUIRE) || !gs_region_ready())
        return;
    if (gs_usage_device(uuid, &s->dev) != 0) {
        GS_WARN("NVML cannot see %s: this process's own GPU use cannot be measured", uuid);
        return;
    }
    if (!(s->slot = gs_region_own_slot()))
        return;
    s->lock_fd = gpu_lock(uuid);
    gs_region_lock();
    s->nbefore = gs_usage_processes(s->dev, s->before, GS_USAGE_MAX_PROCS);
    if (s->nbefore < 0) {
        gs_region_unlock();
        if (s->lock_fd >= 0)
            close(s->lock_fd);
        GS_WARN("NVML does not list the processes on %s: this process's own GPU use cannot be measured", uuid);
        return;
    }
    s->active = 1;
}

void gs_pidmap_end(struct gs_pidmap_scope *s, CUresult rc)
{
    if (!s->active)
        return;
    unsigned after[GS_USAGE_MAX_PROCS], found = 0;
    int nafter = rc == CUDA_SUCCESS ? gs_usage_processes(s->dev, after, GS_USAGE_MAX_PROCS) : -1;
    struct gs_region *r = gs_region_map();
    struct gs_slot *mine = s->slot;
    int candidates = 0;
    for (int i = 0; i < nafter; i++) {
        int was = 0;
        for (int k = 0; k < s->nbefore && !was; k++)
            was = s->before[k] == after[i];
        if (!was && !claimed_by_other(r, mine, after[i])) {
            found = after[i];
            candidates++;
        }
    }
    if (nafter >= 0) {
        /* None new: this call did not create the context NVML lists (the runtime's first call may only look
         * the primary context up, and create it in a later one). Marked unmapped meanwhile, so that the
         * container is not undercounted, and looked for again at the next context step. */
        int settled = candidates != 0 || --tries_left <= 0;
        int32_t nvml_pid = candidates == 1 ? (int32_t)found : -1;
        __atomic_store_n(&mine->nvml_pid, nvml_pid, __ATOMIC_RELEASE);
        __atomic_store_n(&mine->nvml_owner, (int32_t)getpid(), __ATOMIC_RELEASE);
        __atomic_store_n(&mapped_here, settled, __ATOMIC_RELEASE);
        if (candidates == 1)
            GS_DEBUG("NVML knows this process as pid %u", found);
        else if (settled)
            GS_WARN("cannot tell this process's NVML pid (%d new processes appeared on the GPU while it created "
                    "its context%s); its container's GPU use is measured as the whole GPU's", candidates,
                    candidates ? "" : ", in any of its context steps");
        else
            GS_DEBUG("no new process appeared in NVML's list during this context step; looking again at the next");
    }
    gs_region_unlock();
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    s->active = 0;
}
