/* The simulated GPU's work, shared by every process on the node through the state file (fake_gpu_state.h).
 *
 * Each GPU has one timeline: a launch queues `blocks * ns_per_block` of work after whatever is queued already
 * (by any process), so kernels of several processes run one after another, as on a GPU time-sliced between
 * contexts. Queued work is kept as spans (process, start, end); "settling" at time t credits the part of each
 * span that ran before t to the GPU's and the owning process's busy time. Every `sample_period_ms` (lazily: at
 * the next launch or query after the period) a sample is taken: the busy share of the span since the last
 * sample for the GPU (nvmlDeviceGetUtilizationRates) and for each process context on it
 * (nvmlDeviceGetProcessUtilization).
 *
 * Identities: a process appears in procs[], spans and lock words under its identity (fake_gpu_ident.h): its host
 * pid when the config names a driver socket, else its getpid(); liveness is asked the same way.
 *
 * Locks: one word per GPU timeline and one for procs[] registration, holding the holder's identity; a waiter
 * takes over the lock of a holder that no longer exists. Critical sections are a few hundred nanoseconds.
 * Only static inline code lives here, so each fake library compiles its own copy.
 */
#ifndef FAKE_GPU_TIMELINE_H
#define FAKE_GPU_TIMELINE_H

#include <sched.h>

#include "fake_gpu_ident.h"
#include "fake_gpu_state.h"

#define FAKE_GPU_SAMPLE_MS_DEFAULT 50
#define FAKE_GPU_RECENT_WORK_NS 2000000000ULL /* kernels within this long: NVML reports the timeline's load */

static inline uint64_t fake_tl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline uint64_t fake_tl_realtime_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

static inline int fake_tl_alive(int32_t pid)
{
    return fake_ident_alive(pid);
}

/* Take the lock as process `me` (the caller's identity, fake_ident_self()). */
static inline void fake_tl_lock_as(uint32_t *word, uint32_t me)
{
    for (unsigned spins = 0;; spins++) {
        uint32_t cur = 0;
        if (__atomic_compare_exchange_n(word, &cur, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return;
        if (spins < 64)
            continue;
        if (spins % 256 == 0 && cur && !fake_tl_alive((int32_t)cur) &&
            __atomic_compare_exchange_n(word, &cur, me, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return; /* the holder died inside its critical section */
        sched_yield();
    }
}

/* Take the lock as this process. -1 when this process has no identity (fake_ident_self() said why). */
static inline int fake_tl_lock(uint32_t *word)
{
    int32_t me = fake_ident_self();
    if (!me)
        return -1;
    fake_tl_lock_as(word, (uint32_t)me);
    return 0;
}

static inline void fake_tl_unlock(uint32_t *word)
{
    __atomic_store_n(word, 0, __ATOMIC_RELEASE);
}

/* Credit the work that ran before `now`. Timeline lock held. */
static inline void fake_tl_settle(struct fake_gpu_state *s, unsigned gpu, uint64_t now)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    if (now <= t->settled_at)
        return;
    while (t->nseg) {
        struct fake_gpu_segment *g = &t->seg[t->head];
        if (g->start >= now)
            break;
        uint64_t done = (g->end < now ? g->end : now) - g->start;
        t->busy_ns += done;
        if (g->proc < FAKE_GPU_MAX_PROCS) {
            struct fake_gpu_proc *p = &s->procs[g->proc];
            if (__atomic_load_n(&p->pid, __ATOMIC_RELAXED) == g->pid)
                p->busy_ns += done;
        }
        g->start += done;
        if (g->start < g->end)
            break;
        t->head = (t->head + 1) % FAKE_GPU_SEGMENTS;
        t->nseg--;
    }
    t->settled_at = now;
}

/* Take a utilisation sample when the period has passed. Timeline lock held, settled to now. */
static inline void fake_tl_sample(struct fake_gpu_state *s, unsigned gpu, uint64_t now)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    uint32_t ms = __atomic_load_n(&s->sample_period_ms, __ATOMIC_RELAXED);
    uint64_t period = (uint64_t)(ms ? ms : FAKE_GPU_SAMPLE_MS_DEFAULT) * 1000000ULL;
    if (t->last_sample_ns && now - t->last_sample_ns < period)
        return;
    uint64_t span = t->last_sample_ns ? now - t->last_sample_ns : 0;
    if (span) {
        uint64_t util = ((t->busy_ns - t->sampled_busy_ns) * 100 + span / 2) / span;
        __atomic_store_n(&t->util_percent, (uint32_t)(util > 100 ? 100 : util), __ATOMIC_RELAXED);
    }
    uint64_t ts = fake_tl_realtime_us();
    for (unsigned i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        struct fake_gpu_proc *p = &s->procs[i];
        if (!__atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) || p->gpu != gpu)
            continue;
        if (span) {
            uint64_t util = ((p->busy_ns - p->sampled_busy_ns) * 100 + span / 2) / span;
            struct fake_gpu_sample *smp = &s->procs[i].samples[p->nsamples % FAKE_GPU_PROC_SAMPLES];
            smp->ts_us = ts;
            smp->sm_util = (uint32_t)(util > 100 ? 100 : util);
            smp->span_us = (uint32_t)(span / 1000 > 0xffffffffULL ? 0xffffffffULL : span / 1000);
            __atomic_store_n(&p->nsamples, p->nsamples + 1, __ATOMIC_RELEASE);
        }
        p->sampled_busy_ns = p->busy_ns;
    }
    t->sampled_busy_ns = t->busy_ns;
    t->last_sample_ns = now;
}

/* Settle and sample GPU `gpu` (a state slot) at the current time (for readers: NVML queries, tests). 0, or -1
 * when this process has no identity. */
static inline int fake_tl_update(struct fake_gpu_state *s, unsigned gpu)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    if (fake_tl_lock(&t->lock) != 0)
        return -1;
    uint64_t now = fake_tl_now_ns();
    fake_tl_settle(s, gpu, now);
    fake_tl_sample(s, gpu, now);
    fake_tl_unlock(&t->lock);
    return 0;
}

#define FAKE_TL_FULL (-1)   /* procs[] is full */
#define FAKE_TL_NO_ID (-2)  /* this process has no identity (fake_ident_self() said why) */

/* The procs[] entry of this process on GPU `gpu` (a state slot), registered when missing (a context was
 * created). Entries of processes that are gone are freed on the way. FAKE_TL_FULL or FAKE_TL_NO_ID on failure.
 * NVML lists the entry under host_pid: the identity itself with a driver socket (a host pid already), else
 * getpid() + host_pid_offset (a host's view of a pod's processes, without real PID namespaces). */
static inline int fake_tl_attach(struct fake_gpu_state *s, unsigned gpu)
{
    int32_t me = fake_ident_self();
    if (!me)
        return FAKE_TL_NO_ID;
    int found = FAKE_TL_FULL, free_slot = -1;
    fake_tl_lock_as(&s->proc_lock, (uint32_t)me);
    for (int i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        struct fake_gpu_proc *p = &s->procs[i];
        int32_t pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (pid == me && p->gpu == gpu) {
            found = i;
            break;
        }
        if (pid && pid != me && !fake_tl_alive(pid)) {
            __atomic_store_n(&p->pid, 0, __ATOMIC_RELEASE);
            pid = 0;
        }
        if (!pid && free_slot < 0)
            free_slot = i;
    }
    if (found < 0 && free_slot >= 0) {
        struct fake_gpu_proc *p = &s->procs[free_slot];
        memset((char *)p + offsetof(struct fake_gpu_proc, host_pid), 0,
               sizeof *p - offsetof(struct fake_gpu_proc, host_pid));
        p->host_pid = (uint32_t)me + (fake_ident_uses_socket() ? 0 : __atomic_load_n(&s->host_pid_offset,
                                                                                        __ATOMIC_RELAXED));
        p->gpu = gpu;
        __atomic_store_n(&p->pid, me, __ATOMIC_RELEASE);
        found = free_slot;
    }
    fake_tl_unlock(&s->proc_lock);
    return found;
}

/* This process's contexts end (it exits). */
static inline void fake_tl_detach_all(struct fake_gpu_state *s)
{
    int32_t me = fake_ident_self();
    for (int i = 0; me && i < FAKE_GPU_MAX_PROCS; i++)
        if (__atomic_load_n(&s->procs[i].pid, __ATOMIC_ACQUIRE) == me)
            __atomic_store_n(&s->procs[i].pid, 0, __ATOMIC_RELEASE);
}

/* Queue work_ns of kernel time for procs[proc] on GPU `gpu` (a state slot), as process `me` (its identity).
 * Returns when the work will end (monotonic ns), or 0 when the GPU's span ring is full (the caller waits and
 * retries, as with a full hardware queue). */
static inline uint64_t fake_tl_queue(struct fake_gpu_state *s, unsigned gpu, int proc, int32_t me, uint64_t work_ns)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    fake_tl_lock_as(&t->lock, (uint32_t)me);
    uint64_t now = fake_tl_now_ns();
    fake_tl_settle(s, gpu, now);
    fake_tl_sample(s, gpu, now);
    uint64_t start = t->busy_until > now ? t->busy_until : now, end = 0;
    struct fake_gpu_segment *last = t->nseg ? &t->seg[(t->head + t->nseg - 1) % FAKE_GPU_SEGMENTS] : NULL;
    if (last && last->proc == (uint32_t)proc && last->pid == me && last->end == start) {
        last->end = end = start + work_ns;
    } else if (t->nseg < FAKE_GPU_SEGMENTS) {
        struct fake_gpu_segment *g = &t->seg[(t->head + t->nseg) % FAKE_GPU_SEGMENTS];
        g->proc = (uint32_t)proc;
        g->pid = me;
        g->start = start;
        g->end = end = start + work_ns;
        t->nseg++;
    }
    if (end) {
        t->busy_until = end;
        t->last_work_ns = now;
        if (proc >= 0 && proc < FAKE_GPU_MAX_PROCS)
            s->procs[proc].queued_ns += work_ns;
    }
    fake_tl_unlock(&t->lock);
    return end;
}

#endif /* FAKE_GPU_TIMELINE_H */
