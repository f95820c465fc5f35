/* Live state of the simulated GPUs, shared by the fake libnvidia-ml.so.1, the fake libcuda.so.1 and the
 * Python test helper (devplugin/sim/fake_driver.py) through one small file that each of them mmaps.
 *
 * Path: "<$FAKE_NVML_CONFIG>.state" (FAKE_GPU_STATE_SUFFIX), or the config's state= (a container's config names
 * its node's file, which must exist). Created, zeroed and stamped with the magic by the first one that needs it
 * (fake_gpu_state_map with create=1), under flock, so concurrent creators agree. Everything per GPU (gpus[],
 * timeline[], procs[].gpu, events[].gpu_index) is indexed by the GPU's slot: its config line's slot=, by
 * default its line index, so a container's config can list only its GPUs and still use the node's entries.
 *
 * Who writes what:
 *   lost             tests (FakeDriver.set_lost); NVML queries for that GPU then fail with GPU_IS_LOST
 *   util_percent     tests and the fake libcuda (while it simulates kernels); nvmlDeviceGetUtilizationRates.gpu
 *   mem_util_percent tests; nvmlDeviceGetUtilizationRates.memory
 *   mem_used_bytes   tests and the fake libcuda (allocations: use __atomic_fetch_add/sub); NVML memory "used"
 *   events[]         fake_gpu_state_post_event only (tests raise XIDs through fakeNvml_postEvent)
 *   host_pid_offset  tests (FakeDriver.create): NVML reports pid + offset, as a host sees a pod's processes
 *   sample_period_ms tests: how often the simulated GPU takes a utilisation sample (0 = 50 ms)
 *   sample_mode      tests: what a per-process sample holds (fake_gpu_timeline.h)
 *   timeline[], procs[]  the fake libcuda and NVML, through fake_gpu_timeline.h (the simulated GPU's work)
 * Readers use __atomic_load_n; every field is naturally aligned, so plain aligned stores from Python
 * (ctypes over mmap) are single stores too.
 *
 * Events: a ring of FAKE_GPU_EVENT_RING entries. `event_seq` counts published events and is the futex word:
 * a writer (holding flock on the file) fills events[seq % RING], stores event_seq = seq + 1 and does FUTEX_WAKE;
 * a waiter keeps its own cursor and FUTEX_WAITs on event_seq (shared futex: the file is MAP_SHARED, so waiters
 * in other processes wake too). Nothing polls.
 *
 * The layout is fixed (the _Static_asserts below) and mirrored by ctypes in devplugin/sim/fake_driver.py;
 * tests/fakes/test_nvml.py compares the two through fakeNvml_stateLayout(). Bump FAKE_GPU_STATE_VERSION on any
 * change. Only static inline code lives here, so each fake library compiles its own copy.
 */
#ifndef FAKE_GPU_STATE_H
#define FAKE_GPU_STATE_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FAKE_GPU_CONFIG_ENV "FAKE_NVML_CONFIG"
#define FAKE_GPU_STATE_SUFFIX ".state"
#define FAKE_GPU_STATE_MAGIC 0x3154535550474b46ULL /* "FKGPUST1" read as little-endian bytes */
#define FAKE_GPU_STATE_VERSION 3u
#define FAKE_GPU_MAX_GPUS 16
#define FAKE_GPU_EVENT_RING 64
#define FAKE_GPU_MAX_PROCS 64      /* process contexts, across all GPUs */
#define FAKE_GPU_SEGMENTS 512      /* queued kernel spans per GPU not yet run */
#define FAKE_GPU_PROC_SAMPLES 16   /* utilisation samples kept per process context */

/* Event types travel as NVML's nvmlEventType bits (XID critical error = 0x8, eventData = the XID). This one
 * is the fake's own: "GPU <i> just fell off the bus"; waiters registered for that GPU return GPU_IS_LOST. */
#define FAKE_GPU_EVENT_GPU_LOST 0x8000000000000000ULL

struct fake_gpu_slot {              /* 64 bytes, one per GPU index */
    uint32_t lost;                  /* 0 = answers, 1 = lost (GPU_IS_LOST) */
    uint32_t util_percent;          /* 0..100 */
    uint64_t mem_used_bytes;        /* allocated device memory */
    uint32_t mem_util_percent;      /* 0..100 */
    uint32_t reserved32[3];
    uint64_t reserved64[4];         /* spare, zero */
};

struct fake_gpu_event {             /* 32 bytes */
    uint64_t seq;                   /* 1 + its position in the stream; 0 while being written */
    uint32_t gpu_index;
    uint32_t pad;
    uint64_t event_type;
    uint64_t event_data;
};

/* One span of queued kernel work of one process on a GPU's timeline (consecutive kernels merge). */
struct fake_gpu_segment {           /* 24 bytes */
    uint32_t proc;                  /* index in procs[] */
    int32_t pid;                    /* its pid when queued: work of a process gone since is credited to no one */
    uint64_t start, end;            /* CLOCK_MONOTONIC ns */
};

struct fake_gpu_sample {            /* 16 bytes */
    uint64_t ts_us;                 /* CLOCK_REALTIME us when taken (NVML's timeStamp) */
    uint32_t sm_util;               /* percent of the span the process's kernels ran */
    uint32_t span_us;
};

/* A process's context on one GPU: what NVML lists and samples. */
struct fake_gpu_proc {              /* 64 + 16 * FAKE_GPU_PROC_SAMPLES bytes */
    int32_t pid;                    /* the process's identity (fake_gpu_ident.h: host pid or getpid()); 0 = free */
    uint32_t host_pid;              /* the pid NVML reports (the host pid; without a socket pid + offset) */
    uint32_t gpu;                   /* the GPU's slot */
    uint32_t nsamples;              /* samples taken; the newest is samples[(nsamples - 1) % RING] */
    uint64_t queued_ns;             /* kernel time queued */
    uint64_t busy_ns;               /* kernel time run so far (up to the GPU's settled_at) */
    uint64_t sampled_busy_ns;       /* busy_ns at the last sample */
    uint64_t mem_used_bytes;        /* device memory the process holds on this GPU (NVML's usedGpuMemory) */
    uint64_t reserved[2];
    struct fake_gpu_sample samples[FAKE_GPU_PROC_SAMPLES];
};

/* A GPU's shared timeline: kernels of every process run one after another in the order they were queued. */
struct fake_gpu_timeline {
    uint32_t lock;                  /* 0 = free, else the holder's pid (taken over when the holder is gone) */
    uint32_t nseg;                  /* spans queued and not fully run */
    uint32_t head;                  /* seg[] index of the oldest */
    uint32_t util_percent;          /* busy share of the last sample span */
    uint64_t busy_until;            /* CLOCK_MONOTONIC ns when the queued work ends */
    uint64_t settled_at;            /* work before this instant is credited to busy_ns and the processes */
    uint64_t busy_ns;               /* kernel time run so far */
    uint64_t last_sample_ns;        /* CLOCK_MONOTONIC ns of the last sample */
    uint64_t sampled_busy_ns;       /* busy_ns at the last sample */
    uint64_t last_work_ns;          /* when work was last queued; 0 = never */
    uint64_t reserved[2];
    struct fake_gpu_segment seg[FAKE_GPU_SEGMENTS];
};

struct fake_gpu_state {
    uint64_t magic;                 /* FAKE_GPU_STATE_MAGIC */
    uint32_t version;               /* FAKE_GPU_STATE_VERSION */
    uint32_t gpu_count;             /* informational: GPUs in the config when the file was created */
    uint32_t event_seq;             /* events published so far; futex word */
    uint32_t reserved0;
    uint64_t instance;              /* random, set when the file is stamped: tells a recreated file from the old */
    uint32_t host_pid_offset;       /* NVML pid = getpid() + this, for processes without a driver socket */
    uint32_t sample_period_ms;      /* utilisation sample period; 0 = FAKE_GPU_SAMPLE_MS_DEFAULT */
    uint32_t proc_lock;             /* guards procs[] registration; same protocol as fake_gpu_timeline.lock */
    uint32_t sample_mode;           /* FAKE_GPU_SAMPLES_SHARE or FAKE_GPU_SAMPLES_RESIDENT (fake_gpu_timeline.h) */
    uint32_t reserved[4];
    struct fake_gpu_slot gpus[FAKE_GPU_MAX_GPUS];
    struct fake_gpu_event events[FAKE_GPU_EVENT_RING];
    struct fake_gpu_timeline timeline[FAKE_GPU_MAX_GPUS];
    struct fake_gpu_proc procs[FAKE_GPU_MAX_PROCS];
};

_Static_assert(sizeof(struct fake_gpu_slot) == 64, "fake_gpu_slot layout");
_Static_assert(sizeof(struct fake_gpu_event) == 32, "fake_gpu_event layout");
_Static_assert(offsetof(struct fake_gpu_state, event_seq) == 16, "fake_gpu_state layout");
_Static_assert(offsetof(struct fake_gpu_state, instance) == 24, "fake_gpu_state layout");
_Static_assert(offsetof(struct fake_gpu_state, gpus) == 64, "fake_gpu_state layout");
_Static_assert(offsetof(struct fake_gpu_state, events) == 64 + 64 * FAKE_GPU_MAX_GPUS, "fake_gpu_state layout");
_Static_assert(offsetof(struct fake_gpu_state, timeline) == 64 + 64 * FAKE_GPU_MAX_GPUS + 32 * FAKE_GPU_EVENT_RING,
               "fake_gpu_state layout");
_Static_assert(sizeof(struct fake_gpu_segment) == 24, "fake_gpu_segment layout");
_Static_assert(sizeof(struct fake_gpu_sample) == 16, "fake_gpu_sample layout");
_Static_assert(sizeof(struct fake_gpu_proc) == 64 + 16 * FAKE_GPU_PROC_SAMPLES, "fake_gpu_proc layout");
_Static_assert(sizeof(struct fake_gpu_timeline) == 80 + 24 * FAKE_GPU_SEGMENTS, "fake_gpu_timeline layout");
_Static_assert(offsetof(struct fake_gpu_state, procs) ==
                   offsetof(struct fake_gpu_state, timeline) + sizeof(struct fake_gpu_timeline) * FAKE_GPU_MAX_GPUS,
               "fake_gpu_state layout");

/* Map the state file read-write. create: make and stamp it when missing. On failure: NULL and a one-line
 * reason in err. Unmap with munmap(state, sizeof *state). */
static inline struct fake_gpu_state *fake_gpu_state_map(const char *path, int create, char *err, size_t errlen)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open state file %s: %s", path, strerror(errno));
        return NULL;
    }
    if (flock(fd, LOCK_EX) != 0) {
        snprintf(err, errlen, "cannot lock state file %s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    struct stat st;
    struct fake_gpu_state *state = NULL;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot stat state file %s: %s", path, strerror(errno));
        goto out;
    }
    if (st.st_size == 0 && create) {
        if (ftruncate(fd, sizeof(struct fake_gpu_state)) != 0) {
            snprintf(err, errlen, "cannot size state file %s: %s", path, strerror(errno));
            goto out;
        }
        st.st_size = sizeof(struct fake_gpu_state);
    }
    if ((size_t)st.st_size < sizeof(struct fake_gpu_state)) {
        snprintf(err, errlen, "state file %s has %lld bytes, expected %zu: delete it or recreate the fake driver",
                 path, (long long)st.st_size, sizeof(struct fake_gpu_state));
        goto out;
    }
    void *addr = mmap(NULL, sizeof(struct fake_gpu_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        snprintf(err, errlen, "cannot mmap state file %s: %s", path, strerror(errno));
        goto out;
    }
    state = addr;
    if (state->magic == 0 && state->version == 0) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        state->version = FAKE_GPU_STATE_VERSION;
        state->instance = ((uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec) ^ ((uint64_t)getpid() << 40);
        __atomic_store_n(&state->magic, FAKE_GPU_STATE_MAGIC, __ATOMIC_RELEASE);
    }
    if (state->magic != FAKE_GPU_STATE_MAGIC || state->version != FAKE_GPU_STATE_VERSION) {
        snprintf(err, errlen, "state file %s is not a version %u fake GPU state file (magic %#llx, version %u): "
                 "delete it or recreate the fake driver", path, FAKE_GPU_STATE_VERSION,
                 (unsigned long long)state->magic, state->version);
        munmap(addr, sizeof(struct fake_gpu_state));
        state = NULL;
    }
out:
    flock(fd, LOCK_UN);
    close(fd); /* the mapping outlives the descriptor */
    return state;
}

/* The instance stamp of the state file now at path (0 when it cannot be read), to tell whether a mapping made
 * earlier still shows this file or one deleted since. */
static inline uint64_t fake_gpu_state_instance(const char *path)
{
    struct fake_gpu_state head;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = pread(fd, &head, offsetof(struct fake_gpu_state, host_pid_offset), 0);
    close(fd);
    if (n != (ssize_t)offsetof(struct fake_gpu_state, host_pid_offset) || head.magic != FAKE_GPU_STATE_MAGIC)
        return 0;
    return head.instance;
}

/* Publish one event and wake every waiter, in any process. Returns 0 or -errno. */
static inline int fake_gpu_state_post_event(const char *path, uint32_t gpu_index, uint64_t event_type,
                                            uint64_t event_data)
{
    if (gpu_index >= FAKE_GPU_MAX_GPUS)
        return -EINVAL;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX) != 0) { /* one writer at a time; the lock dies with its holder */
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    struct fake_gpu_state *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED) {
        rc = -errno;
    } else if (s->magic != FAKE_GPU_STATE_MAGIC || s->version != FAKE_GPU_STATE_VERSION) {
        rc = -EPROTO;
        munmap(s, sizeof *s);
    } else {
        uint32_t seq = __atomic_load_n(&s->event_seq, __ATOMIC_ACQUIRE);
        struct fake_gpu_event *ev = &s->events[seq % FAKE_GPU_EVENT_RING];
        __atomic_store_n(&ev->seq, 0, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        __atomic_store_n(&ev->gpu_index, gpu_index, __ATOMIC_RELAXED);
        __atomic_store_n(&ev->event_type, event_type, __ATOMIC_RELAXED);
        __atomic_store_n(&ev->event_data, event_data, __ATOMIC_RELAXED);
        __atomic_store_n(&ev->seq, (uint64_t)seq + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&s->event_seq, seq + 1, __ATOMIC_RELEASE);
        syscall(SYS_futex, &s->event_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        munmap(s, sizeof *s);
    }
    flock(fd, LOCK_UN);
    close(fd);
    return rc;
}

/* Read event number `seq` (0-based) if it is still in the ring. Returns 1 and fills *out, or 0 when it was
 * overwritten by a later one (the reader fell more than FAKE_GPU_EVENT_RING behind). */
static inline int fake_gpu_state_read_event(const struct fake_gpu_state *s, uint32_t seq,
                                            struct fake_gpu_event *out)
{
    const struct fake_gpu_event *ev = &s->events[seq % FAKE_GPU_EVENT_RING];
    if (__atomic_load_n(&ev->seq, __ATOMIC_ACQUIRE) != (uint64_t)seq + 1)
        return 0;
    out->gpu_index = __atomic_load_n(&ev->gpu_index, __ATOMIC_RELAXED);
    out->event_type = __atomic_load_n(&ev->event_type, __ATOMIC_RELAXED);
    out->event_data = __atomic_load_n(&ev->event_data, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    out->seq = (uint64_t)seq + 1;
    return __atomic_load_n(&ev->seq, __ATOMIC_RELAXED) == (uint64_t)seq + 1;
}

/* Sleep until event_seq differs from `seen` or timeout_ns passes (spurious wake-ups are fine: callers loop). */
static inline void fake_gpu_state_wait(struct fake_gpu_state *s, uint32_t seen, long long timeout_ns)
{
    if (timeout_ns <= 0)
        return;
    struct timespec ts = { .tv_sec = timeout_ns / 1000000000LL, .tv_nsec = timeout_ns % 1000000000LL };
    syscall(SYS_futex, &s->event_seq, FUTEX_WAIT, seen, &ts, NULL, 0);
}

#endif /* FAKE_GPU_STATE_H */
