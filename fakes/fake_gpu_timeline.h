/* The simulated GPU's work, shared by every process on the node through the state file (fake_gpu_state.h).
 *
 * Each GPU has one timeline: a launch queues `blocks * ns_per_block` of work after whatever is queued already
 * (by any process), so kernels of several processes run one after another, as on a GPU time-sliced between
 * contexts. Queued work is kept as spans (process, start, end); "settling" at time t credits the part of each
 * span that ran before t to the GPU's and the owning process's busy time. Every `sample_period_ms` a sample is
 * taken (lazily: at the next launch or query, one for each period boundary passed): the busy share of the span
 * since the last sample for the GPU (nvmlDeviceGetUtilizationRates) and, per process
 * (nvmlDeviceGetProcessUtilization), as the state's sample_mode says:
 *   FAKE_GPU_SAMPLES_SHARE     each process context on it gets its busy share of the span (the sum over processes
 *                              is the GPU's);
 *   FAKE_GPU_SAMPLES_RESIDENT  one process gets the GPU's whole share of the span: the one running at the
 *                              sample's instant (with the GPU idle then, the busiest in the span). This is
 *                              what an H100 with driver 580 was seen to report: an entry every 200 ms naming one
 *                              process, so a process's part shows only as its part of the entries over time.
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
#define FAKE_GPU_SAMPLES_SHARE 0u
#define FAKE_GPU_SAMPLES_RESIDENT 1u
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

/* Take the sample due at `at` (a period boundary, or now after a long quiet stretch), stamped ts (realtime, us).
 * Timeline lock held, settled to `at`. */
static inline void fake_tl_sample_at(struct fake_gpu_state *s, unsigned gpu, uint64_t at, uint64_t ts)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    uint64_t span = t->last_sample_ns ? at - t->last_sample_ns : 0;
    if (span) {
        uint64_t util = ((t->busy_ns - t->sampled_busy_ns) * 100 + span / 2) / span;
        __atomic_store_n(&t->util_percent, (uint32_t)(util > 100 ? 100 : util), __ATOMIC_RELAXED);
    }
    int resident = __atomic_load_n(&s->sample_mode, __ATOMIC_RELAXED) == FAKE_GPU_SAMPLES_RESIDENT;
    /* resident: the procs[] entry the sample names: the one running at the sample's instant (settled to it, the
     * head span is the one running), or with the GPU idle then, the busiest in the span */
    int named = -1;
    if (resident && t->nseg && t->seg[t->head].start <= at && t->seg[t->head].proc < FAKE_GPU_MAX_PROCS &&
        s->procs[t->seg[t->head].proc].pid == t->seg[t->head].pid)
        named = (int)t->seg[t->head].proc;
    uint64_t most = 0;
    for (unsigned i = 0; resident && named < 0 && i < FAKE_GPU_MAX_PROCS; i++) {
        const struct fake_gpu_proc *p = &s->procs[i];
        uint64_t ran = p->busy_ns - p->sampled_busy_ns;
        if (__atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) && p->gpu == gpu && ran > most) {
            most = ran;
            named = (int)i;
        }
    }
    for (unsigned i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        struct fake_gpu_proc *p = &s->procs[i];
        if (!__atomic_load_n(&p->pid, __ATOMIC_ACQUIRE) || p->gpu != gpu)
            continue;
        if (span && (!resident || (int)i == named)) {
            uint64_t busy = resident ? t->busy_ns - t->sampled_busy_ns : p->busy_ns - p->sampled_busy_ns;
            uint64_t util = (busy * 100 + span / 2) / span;
            struct fake_gpu_sample *smp = &s->procs[i].samples[p->nsamples % FAKE_GPU_PROC_SAMPLES];
            smp->ts_us = ts;
            smp->sm_util = (uint32_t)(util > 100 ? 100 : util);
            smp->span_us = (uint32_t)(span / 1000 > 0xffffffffULL ? 0xffffffffULL : span / 1000);
            __atomic_store_n(&p->nsamples, p->nsamples + 1, __ATOMIC_RELEASE);
        }
        p->sampled_busy_ns = p->busy_ns;
    }
    t->sampled_busy_ns = t->busy_ns;
    t->last_sample_ns = at;
}

#define FAKE_TL_CATCH_UP 64 /* periods passed without a launch or query: more are taken as one sample */

/* Settle to now, taking the samples due on the way: one at each period boundary passed, as a driver's timer
 * does (samples taken lazily at whichever launch or query came next would favour some processes over others).
 * Timeline lock held. */
static inline void fake_tl_advance(struct fake_gpu_state *s, unsigned gpu, uint64_t now)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    uint32_t ms = __atomic_load_n(&s->sample_period_ms, __ATOMIC_RELAXED);
    uint64_t period = (uint64_t)(ms ? ms : FAKE_GPU_SAMPLE_MS_DEFAULT) * 1000000ULL;
    uint64_t ts_now = fake_tl_realtime_us();
    if (!t->last_sample_ns || now - t->last_sample_ns > FAKE_TL_CATCH_UP * period) {
        fake_tl_settle(s, gpu, now);
        fake_tl_sample_at(s, gpu, now, ts_now);
        return;
    }
    for (uint64_t due = t->last_sample_ns + period; due <= now; due += period) {
        fake_tl_settle(s, gpu, due);
        fake_tl_sample_at(s, gpu, due, ts_now - (now - due) / 1000);
    }
    fake_tl_settle(s, gpu, now);
}

/* Settle and sample GPU `gpu` (a state slot) at the current time (for readers: NVML queries, tests). 0, or -1
 * when this process has no identity. */
static inline int fake_tl_update(struct fake_gpu_state *s, unsigned gpu)
{
    struct fake_gpu_timeline *t = &s->timeline[gpu];
    if (fake_tl_lock(&t->lock) != 0)
        return -1;
    uint64_t now = fake_tl_now_ns();
    fake_tl_advance(s, gpu, now);
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
    fake_tl_advance(s, gpu, now);
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
