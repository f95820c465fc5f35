/* Accounting across the processes of one container: a small file mapped shared by all of them
 * (CUDA_DEVICE_MEMORY_SHARED_CACHE). Each process owns one slot with its bytes per GPU; a GPU's usage is the
 * sum over slots. Reservations are lock-free (atomic add, then check the sum: two racing processes may both
 * back off, neither can overshoot). The fcntl record lock, which the kernel drops when its holder dies, guards
 * only slot and GPU registration and the reaping of slots whose process is gone (pid plus start time, so a
 * reused pid is not mistaken for the old process). */
#ifndef GS_REGION_H
#define GS_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "gpushare_contract.h"
#include "gs_parse.h"

/* The layout is part of the contract (devplugin/contract.py, USAGE_*): the node daemon reads the figures. */
#define GS_REGION_MAGIC GS_USAGE_MAGIC /* "GSHREG1" + 0x31 read as little-endian */
#define GS_REGION_VERSION ((uint32_t)GS_USAGE_VERSION)
#define GS_REGION_SLOTS GS_USAGE_SLOTS
#define GS_REGION_DEVICES GS_USAGE_DEVICES

struct gs_region_device {
    char uuid[GS_UUID_LEN]; /* "" = unused */
    uint64_t limit;         /* informational: the limit the last registering process applied */
};

struct gs_slot {
    int32_t pid;            /* 0 = free; written last on registration, first cleared on reaping */
    int32_t reserved;
    uint64_t start_time;    /* field 22 of /proc/<pid>/stat */
    uint64_t used[GS_REGION_DEVICES];
    int32_t nvml_pid;       /* the pid NVML reports for this process (the host's), -1 = could not be told apart;
                             * valid only while nvml_owner == pid (a reused slot starts unmapped) */
    int32_t nvml_owner;
    uint64_t pad[5];        /* 192 bytes: slots do not share cache lines */
};

/* The compute share of one GPU, shared by every process of the container (gs_throttle.c). 128 bytes. */
struct gs_region_compute {
    int64_t pool;           /* tokens (grid blocks); negative while launches wait for the refill */
    int64_t rate;           /* tokens per second; 0 = not measured yet (launches run free) */
    int64_t capacity;       /* the most the pool holds */
    uint64_t last_refill;   /* CLOCK_MONOTONIC ns */
    uint64_t spent;         /* tokens used by launches of all processes */
    uint64_t waits;         /* token batches that had to wait */
    uint64_t next_step;     /* CLOCK_MONOTONIC ns of the next control step; a process claims it by CAS */
    uint64_t step_at;       /* when the last step ran */
    uint64_t step_spent;    /* spent and waits at the last step */
    uint64_t step_waits;
    uint64_t last_seen_us;  /* NVML lastSeenTimeStamp: newest per-process sample used so far */
    uint64_t hold_until;    /* policy default: no bursting before this (after giving compute back) */
    int32_t allowed;        /* percent of the GPU the bucket aims at (the share, or more while it is idle) */
    int32_t used_pct;       /* the container's utilisation at the last step; -1 = not measured */
    int32_t gpu_pct;        /* the whole GPU's utilisation at the last step; -1 = not measured */
    int32_t steps;          /* control steps taken */
    uint64_t unmeasured_since; /* launches spent tokens but NVML had no newer sample since then; 0 = none */
    uint64_t resumed;       /* the container was away: the next measurement sets the rate outright */
};

/* The compute controller's decayed sums (gs_throttle.c) over one horizon: at every step each is multiplied by
 * exp(-dt / tau) and the step added. ours/all: NVML's per-process samples (smUtil) of the container's processes
 * and of every process; gpu: the whole GPU's utilisation (percent) x the step's length; tokens: those spent;
 * seconds: the steps' lengths (gpu / seconds is the mean utilisation, tokens / seconds the rate). 20 bytes. */
struct gs_share_horizon {
    float ours, all, gpu, tokens, seconds;
};

/* Both horizons. 40 bytes. */
struct gs_share_sums {
    struct gs_share_horizon fast; /* what the policy reacts to (a neighbour that starts, an idle GPU), and what a
                                   * token buys while the samples name only the container */
    struct gs_share_horizon slow; /* what a token buys while they name others too: enough samples to tell the
                                   * container's part */
};

/* What the node daemon exports per container and GPU, beside the memory and compute above (and the controller's
 * sums). 64 bytes. */
struct gs_region_stats {
    uint64_t refused;       /* allocations refused at the memory cap */
    uint64_t refused_bytes; /* the bytes they asked for */
    uint64_t throttled_ns;  /* time launches waited for the compute share (summed over the processes' threads) */
    struct gs_share_sums sums; /* the compute controller's, not exported: in the file so that whichever process of
                                * the container takes a step goes on from the last one's */
};

struct gs_region {
    uint64_t magic;
    uint32_t version;
    uint32_t ndevices;      /* entries of dev[] in use */
    uint32_t nslots;        /* slots in use are below this */
    uint32_t reserved[11];
    struct gs_region_device dev[GS_REGION_DEVICES];
    struct gs_slot slots[GS_REGION_SLOTS];
    struct gs_region_compute compute[GS_REGION_DEVICES]; /* by region device */
    struct gs_region_stats stats[GS_REGION_DEVICES];     /* by region device */
};

_Static_assert(sizeof(struct gs_slot) == 192, "gs_slot layout");
_Static_assert(sizeof(struct gs_region_compute) == GS_USAGE_COMPUTE_SIZE, "gs_region_compute layout");
_Static_assert(sizeof(struct gs_region_stats) == GS_USAGE_STATS_SIZE, "gs_region_stats layout");
_Static_assert(sizeof(struct gs_region_device) == GS_USAGE_DEVICE_SIZE && GS_UUID_LEN == GS_USAGE_UUID_LEN,
               "gs_region_device layout");
_Static_assert(sizeof(struct gs_slot) == GS_USAGE_SLOT_SIZE && offsetof(struct gs_slot, used) == GS_USAGE_SLOT_USED,
               "gs_slot layout (contract)");
_Static_assert(offsetof(struct gs_region_compute, used_pct) == GS_USAGE_COMPUTE_USED_PCT &&
               offsetof(struct gs_region_compute, steps) == GS_USAGE_COMPUTE_STEPS &&
               offsetof(struct gs_region_compute, spent) == GS_USAGE_COMPUTE_SPENT, "gs_region_compute (contract)");
_Static_assert(offsetof(struct gs_region, dev) == GS_USAGE_OFF_DEVICES && offsetof(struct gs_region, slots) ==
               GS_USAGE_OFF_SLOTS && offsetof(struct gs_region, compute) == GS_USAGE_OFF_COMPUTE &&
               offsetof(struct gs_region, stats) == GS_USAGE_OFF_STATS &&
               sizeof(struct gs_region) == GS_USAGE_FILE_SIZE, "usage file layout: devplugin/contract.py USAGE_*");

/* Map the file at path (created when missing). 0, or -1 with the reason logged. */
int gs_region_open(const char *path);
/* Map an existing file only (for processes that only read usage). 0, or -1. */
int gs_region_open_existing(const char *path);
int gs_region_ready(void);

/* The region's index for the GPU with this UUID, registering it when `create`. -1 when absent or full. */
int gs_region_device(const char *uuid, int create, uint64_t limit);
/* Limit recorded for a region device (0 when none). */
uint64_t gs_region_device_limit(int rd);

/* Reserve bytes on region device rd for this process, keeping the container's total within limit (0 = none).
 * 0 on success, -1 when it does not fit (dead processes' slots are reaped and the check retried first). */
int gs_region_reserve(int rd, uint64_t bytes, uint64_t limit);
void gs_region_release(int rd, uint64_t bytes);
/* Bytes the container uses on rd. */
uint64_t gs_region_usage(int rd);
/* Free the slots of processes that are gone. Returns how many. */
int gs_region_reap(void);
/* Reap at most once a second (for views that are read often). */
void gs_region_reap_lazily(void);

/* Count an allocation of `bytes` refused at the cap on rd, and time launches waited on rd (the daemon's figures). */
void gs_region_count_refusal(int rd, uint64_t bytes);
void gs_region_count_throttled(int rd, uint64_t ns);

/* This process's slot, registered when missing (NULL when the file is not open or full). */
struct gs_slot *gs_region_own_slot(void);

/* This process's slot goes back (process exit). */
void gs_region_detach(void);
/* In a forked child: forget the parent's slot and locks. */
void gs_region_after_fork_child(void);

/* The cross-process lock (exposed for tests that kill a holder). */
void gs_region_lock(void);
void gs_region_unlock(void);
struct gs_region *gs_region_map(void);

#endif /* GS_REGION_H */
