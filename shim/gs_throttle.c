/* The container's compute-share token bucket and its controller; see gs_throttle.h. */
#include "gs_throttle.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gs_log.h"
#include "gs_usage.h"

#define GS_OPEN_BATCH 1024            /* tokens per batch before the first measurement */
#define GS_BATCH_NS 1000000LL         /* a batch is about 1 ms of budget */
#define GS_CAPACITY_NS 50000000LL     /* the pool holds at most 50 ms of budget */
#define GS_MAX_BATCH (1LL << 30)
#define GS_UNMEASURED_NS 3000000000ULL /* launching on a busy GPU with no per-process sample at all this long:
                                         * measure the whole GPU */
#define GS_UNSEEN_NS 10000000000ULL   /* launching on a busy GPU while no sample names the container this long */
#define GS_FAST_TAU_S 1.5             /* the policy's view of the GPU forgets with this time constant */
#define GS_WARM_S 1.0                 /* the slow horizon starts once the fast one holds this many seconds */
#define GS_SLOW_TAU_S 20.0            /* what a token buys is learnt over this: a driver that samples the resident
                                       * process names a 30 % container in about 3 of 10 samples, 5 a second */
#define GS_UNRESERVED_START 10000LL   /* no compute reserved: tokens per second before the first measurement */

/* What this process's controller thread keeps per GPU. */
struct watch {
    nvmlDevice_t nvml;
    int tried, warned_nvml, warned_whole;
};

int gs_throttle_on;
struct gs_gate_dev gs_gates[GS_MAX_DEVICES];
__thread int64_t gs_tls_tokens[GS_MAX_DEVICES] __attribute__((tls_model("initial-exec")));
static __thread int64_t tls_batch[GS_MAX_DEVICES] __attribute__((tls_model("initial-exec")));

static enum gs_policy policy;
static uint64_t draws[GS_MAX_DEVICES]; /* batches this process took */
static int controller_started;
static struct watch watches[GS_MAX_DEVICES];
static pthread_mutex_t controller_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    nanosleep(&ts, NULL);
}

/* Add what the rate earned since the last refill, up to the capacity. Any process of the container may. */
static void refill(struct gs_region_compute *c, int64_t rate)
{
    uint64_t now = now_ns(), last = __atomic_load_n(&c->last_refill, __ATOMIC_ACQUIRE);
    if (now <= last || !__atomic_compare_exchange_n(&c->last_refill, &last, now, 0, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_ACQUIRE))
        return;
    int64_t add = (int64_t)((double)rate * (double)(now - last) / 1e9);
    int64_t cap = __atomic_load_n(&c->capacity, __ATOMIC_RELAXED);
    int64_t cur = __atomic_load_n(&c->pool, __ATOMIC_RELAXED), next;
    do {
        next = cur + add > cap ? (cur > cap ? cur : cap) : cur + add;
    } while (!__atomic_compare_exchange_n(&c->pool, &cur, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
}

/* --- measuring ------------------------------------------------------------------------------------------------ */

enum measured {
    GS_UNREAD = -1, /* NVML could not be read: nothing changes, the tokens add up until it can */
    GS_SUMMED = 0,  /* the sums took the step, but nothing tells the container's part yet */
    GS_PER_PROCESS, /* the container's part from NVML's per-process samples */
    GS_WHOLE_GPU,   /* the container measured as the whole GPU (its part cannot be told) */
};

/* Decay a horizon's sums by the step's length and add the step. */
static void add_step(struct gs_share_horizon *h, double tau, double dt, int gpu, uint64_t used,
                     const struct gs_usage_sampled *s)
{
    double keep = exp(-dt / tau);
    h->ours = (float)(h->ours * keep + s->ours);
    h->all = (float)(h->all * keep + s->all);
    h->gpu = (float)(h->gpu * keep + gpu * dt);
    h->tokens = (float)(h->tokens * keep + (double)used);
    h->seconds = (float)(h->seconds * keep + dt);
}

/* The container's use of a GPU as one step measured it, in percent of the GPU. */
struct use {
    double cu, gpu, others; /* over the fast horizon: the container's, the whole GPU's, everyone else's (-1:
                             * unknown) */
    double cu_rate, per_s;  /* the container's use and its tokens spent per second over the same seconds: the fast
                             * horizon while the samples name only the container, else the slow one */
};

/* Whether the container's processes are the only ones with a context on the GPU (NVML's process list). */
static int alone_on(nvmlDevice_t dev, const unsigned *pids, int npids)
{
    unsigned listed[GS_USAGE_MAX_PROCS];
    int n = gs_usage_processes(dev, listed, GS_USAGE_MAX_PROCS);
    for (int i = 0; i < n; i++)
        if (!gs_usage_pid_in(pids, npids, listed[i]))
            return 0;
    return n > 0;
}

/* The use over horizon h when the container's part of the samples is taken as `part`. */
static void horizon_use(const struct gs_share_horizon *h, double part, struct use *out)
{
    out->cu_rate = h->gpu / h->seconds * part;
    out->per_s = h->tokens / h->seconds;
}

/* The container's use of GPU d (struct use). Its part of the GPU's use is its part of NVML's per-process samples
 * over the same seconds (ours / all: right whichever way the driver samples, gs_usage.h). Falls back to the
 * whole GPU when that cannot be had: no per-process NVML, a process of the container that could not be mapped,
 * or samples that name none of the container's processes for GS_UNSEEN_NS while they launch on a busy GPU (the
 * share is then held against the neighbours' use too, so it is never exceeded, but a container beside busy
 * neighbours gets less). */
static enum measured measure(int d, struct gs_region_compute *c, struct gs_share_sums *m, uint64_t used, double dt,
                             struct use *out)
{
    out->others = -1;
    struct watch *w = &watches[d];
    if (!w->nvml && !w->tried++) {
        if (gs_usage_device(gs_gates[d].uuid, &w->nvml) != 0) {
            w->nvml = NULL;
            GS_WARN("cannot read the utilisation of %s through NVML; its compute share of %d%% is not held",
                    gs_gates[d].uuid, gs_gates[d].share);
        }
    }
    int g = w->nvml ? gs_usage_gpu(w->nvml) : -1;
    if (g < 0)
        return GS_UNREAD;
    unsigned pids[GS_USAGE_MAX_PROCS];
    int unmapped, npids = gs_pidmap_container(pids, GS_USAGE_MAX_PROCS, &unmapped);
    struct gs_usage_sampled s = {0};
    int per_process = -1;
    if (npids > 0 && !unmapped) {
        uint64_t seen = __atomic_load_n(&c->last_seen_us, __ATOMIC_RELAXED);
        per_process = gs_usage_samples(w->nvml, pids, npids, &seen, &s);
        __atomic_store_n(&c->last_seen_us, seen, __ATOMIC_RELAXED);
    }
    add_step(&m->fast, GS_FAST_TAU_S, dt, g, used, &s);
    int warm = m->fast.seconds >= GS_WARM_S; /* the first second's samples say little of what a token buys */
    if (warm)
        add_step(&m->slow, GS_SLOW_TAU_S, dt, g, used, &s);
    out->gpu = m->fast.gpu / m->fast.seconds;
    uint64_t now = now_ns();
    const char *why = unmapped ? "a process of this container could not be told apart in NVML's process list"
                      : npids ? "NVML reports no per-process utilisation for this container's processes"
                              : "NVML reports no per-process utilisation here";
    if (per_process == 0) {
        /* Launching on a busy GPU while no sample names the container: with a driver that samples the resident
         * process, a small share is named seldom, so only a long silence means NVML does not see these
         * processes as ours; with no samples at all, a short one. */
        if (s.mine || !used || out->gpu < 2)
            c->unmeasured_since = 0;
        else if (!c->unmeasured_since)
            c->unmeasured_since = now;
        uint64_t silent = c->unmeasured_since ? now - c->unmeasured_since : 0;
        if (m->fast.all + m->slow.all > 0 && silent < GS_UNSEEN_NS) {
            out->cu = m->fast.all > 0 ? out->gpu * m->fast.ours / m->fast.all : 0;
            out->others = out->gpu - out->cu;
            const struct gs_share_horizon *h = warm ? &m->slow : &m->fast;
            if (alone_on(w->nvml, pids, npids))
                horizon_use(&m->fast, m->fast.all > 0 ? m->fast.ours / m->fast.all : 1, out); /* nothing to
                                                                                                   * average out */
            else
                horizon_use(h, h->all > 0 ? h->ours / h->all : 0, out);
            return GS_PER_PROCESS;
        }
        if (out->gpu < 2) {
            out->cu = out->others = 0; /* the GPU is idle: so is the container */
            horizon_use(&m->fast, 0, out);
            return GS_PER_PROCESS;
        }
        if (silent < GS_UNMEASURED_NS)
            return GS_SUMMED;
        why = m->slow.all > 0 ? "NVML's per-process samples have not named this container's processes for 10 s "
                                "while they launch kernels"
                              : "NVML has reported no per-process utilisation while this container launches kernels";
    }
    if (!w->warned_whole++)
        GS_WARN("%s: %s; the compute share is held against the whole GPU's utilisation", gs_gates[d].uuid, why);
    out->cu = out->gpu;
    horizon_use(&m->fast, 1, out);
    return GS_WHOLE_GPU;
}

/* --- the controller ---------------------------------------------------------------------------------------- */

/* The aim of a container that reserved no compute on the GPU (see gs_throttle.h); `cap` is its share. */
static int target_unreserved(struct gs_region_compute *c, int cap, int cu, int others, uint64_t now, int *reclaim)
{
    if (others < 0)
        return cap; /* measured against the whole GPU: held to the cap against everyone's use */
    int u = cu + others > 100 ? 100 : cu + others;
    int a;
    if (u >= GS_SATURATED && others >= GS_NEIGHBOUR_MIN) {
        *reclaim = 1;
        __atomic_store_n(&c->hold_until, now + GS_HOLD_MS * 1000000ULL, __ATOMIC_RELAXED);
        a = cu / GS_UNRESERVED_CUT;
    } else {
        int room = (GS_UNRESERVED_FILL - u) / 2;
        if (room > 0 && now < __atomic_load_n(&c->hold_until, __ATOMIC_RELAXED))
            room = 0;
        a = cu + (room > GS_UNRESERVED_STEP ? GS_UNRESERVED_STEP : room);
    }
    return a < 1 ? 1 : a > cap ? cap : a;
}

/* The share of the GPU the bucket aims at this step; *reclaim: give compute back now, without smoothing.
 * cu: the container's use, others: everyone else's (same samples; -1 unknown: no bursting). */
static int target_share(int d, struct gs_region_compute *c, int share, int cu, int others, uint64_t now,
                        int *reclaim)
{
    *reclaim = 0;
    if (gs_gates[d].unreserved)
        return target_unreserved(c, share, cu, others, now, reclaim);
    if (policy != GS_POLICY_DEFAULT || others < 0)
        return share;
    int u = cu + others > 100 ? 100 : cu + others;
    if (u >= GS_SATURATED && others >= GS_NEIGHBOUR_MIN) {
        *reclaim = __atomic_load_n(&c->allowed, __ATOMIC_RELAXED) > share;
        __atomic_store_n(&c->hold_until, now + GS_HOLD_MS * 1000000ULL, __ATOMIC_RELAXED);
        return share;
    }
    if (now < __atomic_load_n(&c->hold_until, __ATOMIC_RELAXED))
        return share;
    int a = cu + (100 - GS_HEADROOM - u) / 2;
    return a < share ? share : a > 100 ? 100 : a;
}

/* One control step of the container's bucket on GPU d, if no other process of the container took it. */
static void control(int d)
{
    struct gs_region_compute *c = gs_gates[d].c;
    struct gs_share_sums *sums = &gs_region_map()->stats[gs_gates[d].rd].sums;
    uint64_t now = now_ns(), next = __atomic_load_n(&c->next_step, __ATOMIC_ACQUIRE);
    uint64_t period = GS_CONTROL_PERIOD_MS * 1000000ULL;
    if (now < next || !__atomic_compare_exchange_n(&c->next_step, &next, now + period * 9 / 10, 0,
                                                   __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
        return;
    uint64_t prev = next ? next - period * 9 / 10 : 0; /* when the previous step was taken */
    uint64_t last = c->step_at;
    uint64_t spent = __atomic_load_n(&c->spent, __ATOMIC_RELAXED), waits = __atomic_load_n(&c->waits, __ATOMIC_RELAXED);
    if (!prev || !last || now - prev > 10 * period) {
        /* First step, or the container was away (its learnt rate may be for another workload): only take the
         * counters, and let the next measurement set the rate outright. */
        c->step_at = now;
        c->step_spent = spent;
        c->step_waits = waits;
        memset(sums, 0, sizeof *sums);
        __atomic_store_n(&c->resumed, 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t used = spent - c->step_spent;
    int waited = waits != c->step_waits;
    double dt = (double)(now - last) / 1e9;
    struct use m;
    enum measured how = measure(d, c, sums, used, dt, &m);
    if (how == GS_UNREAD)
        return;
    c->step_at = now;
    c->step_spent = spent;
    c->step_waits = waits;
    if (how == GS_SUMMED)
        return;
    int cu = (int)lround(m.cu), u = (int)lround(m.gpu), others = m.others < 0 ? -1 : (int)lround(m.others);
    int share = gs_gates[d].share, reclaim;
    int a = target_share(d, c, share, cu, others, now, &reclaim);
    int outright = reclaim || __atomic_load_n(&c->resumed, __ATOMIC_RELAXED);
    __atomic_store_n(&c->allowed, a, __ATOMIC_RELAXED);
    __atomic_store_n(&c->used_pct, cu, __ATOMIC_RELAXED);
    __atomic_store_n(&c->gpu_pct, u, __ATOMIC_RELAXED);
    __atomic_add_fetch(&c->steps, 1, __ATOMIC_RELAXED);
    int64_t rate = __atomic_load_n(&c->rate, __ATOMIC_RELAXED), rnext;
    if (!used)
        return; /* nothing launched: nothing to learn */
    if (m.cu_rate < 1) {
        if (!waited || !rate)
            return;
        rnext = rate * 2; /* held back while the container shows no use: open up */
    } else {
        /* what the container spent per percent of the GPU it used, over the same seconds, times the aim */
        double target = m.per_s * a / m.cu_rate;
        double r = target;
        /* smoothed, but not the growth of a container that reserved no compute: its aim grows a few points a step */
        if (rate && !outright && !(gs_gates[d].unreserved && a > cu)) {
            r = sqrt((double)rate * target);
            r = r > 4.0 * rate ? 4.0 * rate : r < rate / 4.0 ? rate / 4.0 : r;
        }
        rnext = r < 1 ? 1 : r > 1e15 ? (int64_t)1e15 : (int64_t)r;
    }
    int64_t cap = (int64_t)((double)rnext * GS_CAPACITY_NS / 1e9);
    __atomic_store_n(&c->capacity, cap < 1 ? 1 : cap, __ATOMIC_RELAXED);
    if (!rate || outright) {
        __atomic_store_n(&c->pool, reclaim ? 0 : cap, __ATOMIC_RELAXED);
        __atomic_store_n(&c->last_refill, now_ns(), __ATOMIC_RELEASE);
    }
    __atomic_store_n(&c->resumed, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->rate, rnext, __ATOMIC_RELEASE);
    GS_DEBUG("CUDA device %d: container %.1f%% (last second %.1f%%), GPU %.1f%% (share %d%%, aiming at %d%%), "
             "%.0f tokens/s -> rate %lld",
             d, m.cu_rate, m.cu, m.gpu, share, a, m.per_s, (long long)rnext);
}

static void *controller(void *arg)
{
    (void)arg;
    for (;;) {
        sleep_ns(GS_CONTROL_PERIOD_MS * 1000000LL);
        for (int d = 0; d < GS_MAX_DEVICES; d++)
            if (gs_gates[d].active)
                control(d);
    }
    return NULL;
}

static void start_controller(void)
{
    pthread_mutex_lock(&controller_lock);
    if (!controller_started) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, controller, NULL) == 0)
            __atomic_store_n(&controller_started, 1, __ATOMIC_RELEASE);
        else
            GS_WARN("cannot start the compute-share controller thread; launches are not throttled");
        pthread_attr_destroy(&attr);
    }
    pthread_mutex_unlock(&controller_lock);
}

/* --- launches -------------------------------------------------------------------------------------------------- */

void gs_gate_slow(int d, int64_t cost)
{
    struct gs_region_compute *c = gs_gates[d].c;
    if (GS_UNLIKELY(!__atomic_load_n(&controller_started, __ATOMIC_ACQUIRE))) {
        gs_pidmap_check();
        start_controller();
    }
    if (cost < 1)
        cost = 1;
    /* Report what the last batch paid for; hand back what it did not use. */
    int64_t left = gs_tls_tokens[d] > 0 ? gs_tls_tokens[d] : 0;
    if (tls_batch[d] > left)
        __atomic_fetch_add(&c->spent, (uint64_t)(tls_batch[d] - left), __ATOMIC_RELAXED);
    __atomic_fetch_add(&draws[d], 1, __ATOMIC_RELAXED);
    int64_t rate = __atomic_load_n(&c->rate, __ATOMIC_ACQUIRE);
    int64_t batch;
    if (!rate) {
        batch = cost > GS_OPEN_BATCH ? cost : GS_OPEN_BATCH; /* not measured yet: run free, but count */
    } else {
        if (left)
            __atomic_fetch_add(&c->pool, left, __ATOMIC_RELAXED);
        batch = rate / (1000000000LL / GS_BATCH_NS);
        batch = batch < cost ? cost : batch > GS_MAX_BATCH ? GS_MAX_BATCH : batch;
        refill(c, rate);
        if (__atomic_sub_fetch(&c->pool, batch, __ATOMIC_ACQ_REL) < 0) {
            __atomic_fetch_add(&c->waits, 1, __ATOMIC_RELAXED);
            uint64_t waited_from = now_ns();
            int64_t pool;
            while ((pool = __atomic_load_n(&c->pool, __ATOMIC_ACQUIRE)) < 0) {
                rate = __atomic_load_n(&c->rate, __ATOMIC_ACQUIRE);
                if (rate <= 0)
                    break;
                int64_t wait = (int64_t)((double)-pool * 1e9 / (double)rate);
                sleep_ns(wait < 20000 ? 20000 : wait > 5000000 ? 5000000 : wait);
                refill(c, rate);
            }
            gs_region_count_throttled(gs_gates[d].rd, now_ns() - waited_from);
        }
    }
    tls_batch[d] = batch;
    gs_tls_tokens[d] = batch - cost;
}

int gs_throttle_setup(const struct gs_share_limit *limits, int n, enum gs_policy p, const char *usage_file)
{
    int any = 0;
    policy = p;
    for (int d = 0; d < n && d < GS_MAX_DEVICES; d++) {
        struct gs_gate_dev *g = &gs_gates[d];
        memset(g, 0, sizeof *g);
        snprintf(g->uuid, sizeof g->uuid, "%s", limits[d].uuid);
        g->share = limits[d].share;
        g->unreserved = limits[d].unreserved;
        g->rd = -1;
        int wanted = !limits[d].blocked && (g->share < 100 || g->unreserved);
        g->active = wanted && p != GS_POLICY_DISABLE;
        any |= g->active;
        if (wanted && !g->active)
            GS_INFO("CUDA device %d: compute share %d%% not held (%s=disable)", d, g->share, GS_ENV_CORE_POLICY);
    }
    if (!any)
        return 0;
    if (gs_region_open(usage_file) != 0)
        return -1;
    for (int d = 0; d < n && d < GS_MAX_DEVICES; d++) {
        struct gs_gate_dev *g = &gs_gates[d];
        if (!g->active)
            continue;
        g->rd = gs_region_device(g->uuid, 0, 0);
        if (g->rd < 0)
            g->rd = gs_region_device(g->uuid, 1, 0);
        if (g->rd < 0)
            return -1;
        g->c = &gs_region_map()->compute[g->rd];
        int unset = 0;
        __atomic_compare_exchange_n(&g->c->allowed, &unset, g->share, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        if (g->unreserved) {
            /* Not run free until measured (a paid neighbour would lose half the GPU meanwhile): start from a
             * trickle, from which the aim grows at most GS_UNRESERVED_STEP a step. */
            int64_t none = 0;
            __atomic_store_n(&g->c->last_refill, now_ns(), __ATOMIC_RELAXED);
            if (__atomic_compare_exchange_n(&g->c->rate, &none, GS_UNRESERVED_START, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED))
                __atomic_store_n(&g->c->capacity, GS_UNRESERVED_START * GS_CAPACITY_NS / 1000000000LL,
                                 __ATOMIC_RELEASE);
        }
    }
    __atomic_store_n(&gs_throttle_on, 1, __ATOMIC_RELEASE);
    return 0;
}

static __thread int context_depth; /* context steps this thread is inside (gs_context.h) */

void gs_throttle_context_begin(struct gs_pidmap_scope *s, int d)
{
    s->active = 0;
    if (context_depth++ == 0 && d >= 0 && d < GS_MAX_DEVICES && gs_gates[d].active)
        gs_pidmap_begin(s, gs_gates[d].uuid);
}

void gs_throttle_context_end(struct gs_pidmap_scope *s, CUresult rc)
{
    context_depth--;
    gs_pidmap_end(s, rc);
}

static void child_after_fork(void)
{
    controller_started = 0;
    pthread_mutex_init(&controller_lock, NULL);
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        draws[d] = 0;
        gs_tls_tokens[d] = tls_batch[d] = 0;
    }
}
GS_ON_FORK_CHILD(child_after_fork)

static void fill_stats(int dev, struct gpushare_throttle_stats *out)
{
    memset(out, 0, sizeof *out);
    const struct gs_gate_dev *g = &gs_gates[dev];
    const struct gs_region_compute *c = g->c;
    out->active = g->active;
    out->sm_limit = g->share ? g->share : 100;
    out->draws = __atomic_load_n(&draws[dev], __ATOMIC_RELAXED);
    out->used_pct = out->gpu_pct = -1;
    if (c) {
        out->rate = __atomic_load_n(&c->rate, __ATOMIC_RELAXED);
        out->spent = __atomic_load_n(&c->spent, __ATOMIC_RELAXED);
        out->waits = __atomic_load_n(&c->waits, __ATOMIC_RELAXED);
        out->allowed = __atomic_load_n(&c->allowed, __ATOMIC_RELAXED);
        out->used_pct = __atomic_load_n(&c->used_pct, __ATOMIC_RELAXED);
        out->gpu_pct = __atomic_load_n(&c->gpu_pct, __ATOMIC_RELAXED);
    }
    const struct gs_region *r = gs_region_map();
    int32_t me = (int32_t)getpid();
    for (uint32_t i = 0; r && i < r->nslots && i < GS_REGION_SLOTS; i++) {
        const struct gs_slot *s = &r->slots[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == me && __atomic_load_n(&s->nvml_owner, __ATOMIC_ACQUIRE) == me)
            out->nvml_pid = __atomic_load_n(&s->nvml_pid, __ATOMIC_ACQUIRE);
    }
}

/* The original six fields (rate, spent, draws, waits, active, sm_limit). */
GS_EXPORT int gpushare_throttle_stats(int dev, struct gpushare_throttle_stats *out)
{
    if (dev < 0 || dev >= GS_MAX_DEVICES || !out)
        return -1;
    struct gpushare_throttle_stats s;
    fill_stats(dev, &s);
    memcpy(out, &s, offsetof(struct gpushare_throttle_stats, allowed));
    return 0;
}

/* Every field, up to `size` bytes of *out. */
GS_EXPORT int gpushare_share_stats(int dev, struct gpushare_throttle_stats *out, size_t size)
{
    if (dev < 0 || dev >= GS_MAX_DEVICES || !out)
        return -1;
    struct gpushare_throttle_stats s;
    fill_stats(dev, &s);
    memcpy(out, &s, size < sizeof s ? size : sizeof s);
    return 0;
}
