/* The compute-share token bucket and its controller; see gs_throttle.h. */
#include "gs_throttle.h"

#include <math.h>
#include <pthread.h>
#include <time.h>

#include "gs_log.h"

#define GS_OPEN_BATCH 1024            /* tokens per batch before the first measurement */
#define GS_BATCH_NS 1000000LL         /* a batch is about 1 ms of budget */
#define GS_CAPACITY_NS 50000000LL     /* the pool holds at most 50 ms of budget */
#define GS_MAX_BATCH (1LL << 30)

/* The controller's view of one GPU. */
struct watch {
    nvmlDevice_t nvml;
    int warned;
    uint64_t spent, waits; /* counters at the last step */
};

int gs_throttle_on;
struct gs_bucket gs_buckets[GS_MAX_DEVICES];
__thread int64_t gs_tls_tokens[GS_MAX_DEVICES] __attribute__((tls_model("initial-exec")));
static __thread int64_t tls_batch[GS_MAX_DEVICES] __attribute__((tls_model("initial-exec")));

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

/* Add what the rate earned since the last refill, up to the capacity. */
static void refill(struct gs_bucket *b, int64_t rate)
{
    uint64_t now = now_ns(), last = __atomic_load_n(&b->last_refill, __ATOMIC_ACQUIRE);
    if (now <= last || !__atomic_compare_exchange_n(&b->last_refill, &last, now, 0, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_ACQUIRE))
        return;
    int64_t add = (int64_t)((double)rate * (double)(now - last) / 1e9);
    int64_t cap = __atomic_load_n(&b->capacity, __ATOMIC_RELAXED);
    int64_t cur = __atomic_load_n(&b->pool, __ATOMIC_RELAXED), next;
    do {
        next = cur + add > cap ? (cur > cap ? cur : cap) : cur + add;
    } while (!__atomic_compare_exchange_n(&b->pool, &cur, next, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
}

/* --- the controller ---------------------------------------------------------------------------------------- */

static int utilisation(int d, struct watch *w)
{
    if (!w->nvml) {
        if (gs_real_load_nvml() != 0 || !gs_nvml.nvmlInit_v2 || !gs_nvml.nvmlDeviceGetHandleByUUID ||
            !gs_nvml.nvmlDeviceGetUtilizationRates || gs_nvml.nvmlInit_v2() != NVML_SUCCESS ||
            gs_nvml.nvmlDeviceGetHandleByUUID(gs_devs[d].uuid, &w->nvml) != NVML_SUCCESS) {
            w->nvml = NULL;
            if (!w->warned++)
                GS_WARN("cannot read the utilisation of %s through NVML; its compute share of %d%% is not held",
                        gs_devs[d].uuid, gs_devs[d].sm_limit);
            return -1;
        }
    }
    nvmlUtilization_t u;
    if (gs_nvml.nvmlDeviceGetUtilizationRates(w->nvml, &u) != NVML_SUCCESS)
        return -1;
    return u.gpu > 100 ? 100 : (int)u.gpu;
}

/* One control step for GPU d over the last dt seconds. */
static void control(int d, struct watch *w, double dt)
{
    struct gs_bucket *b = &gs_buckets[d];
    uint64_t spent = __atomic_load_n(&b->spent, __ATOMIC_RELAXED);
    uint64_t waits = __atomic_load_n(&b->waits, __ATOMIC_RELAXED);
    double used = (double)(spent - w->spent);
    int waited = waits != w->waits;
    w->spent = spent;
    w->waits = waits;
    int u = utilisation(d, w);
    int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED), next;
    if (u < 0 || used <= 0)
        return; /* no measurement, or nothing launched: nothing to learn */
    if (u < 2) {
        if (!waited || !rate)
            return;
        next = rate * 2; /* held back while the GPU looks idle: open up */
    } else {
        double target = used / dt * gs_devs[d].sm_limit / u;
        double r = rate ? sqrt((double)rate * target) : target;
        if (rate && r > 4.0 * rate)
            r = 4.0 * rate;
        if (rate && r < rate / 4.0)
            r = rate / 4.0;
        next = r < 1 ? 1 : r > 1e15 ? (int64_t)1e15 : (int64_t)r;
    }
    int64_t cap = (int64_t)((double)next * GS_CAPACITY_NS / 1e9);
    __atomic_store_n(&b->capacity, cap < 1 ? 1 : cap, __ATOMIC_RELAXED);
    if (!rate) {
        __atomic_store_n(&b->pool, cap, __ATOMIC_RELAXED);
        __atomic_store_n(&b->last_refill, now_ns(), __ATOMIC_RELEASE);
    }
    __atomic_store_n(&b->rate, next, __ATOMIC_RELEASE);
    GS_DEBUG("CUDA device %d: utilisation %d%% (share %d%%), %.0f tokens/s -> rate %lld", d, u,
             gs_devs[d].sm_limit, used / dt, (long long)next);
}

static void *controller(void *arg)
{
    (void)arg;
    uint64_t last = now_ns();
    for (;;) {
        sleep_ns(GS_CONTROL_PERIOD_MS * 1000000LL);
        uint64_t now = now_ns();
        double dt = (double)(now - last) / 1e9;
        last = now;
        for (int d = 0; d < gs_ndevs; d++)
            if (gs_buckets[d].active)
                control(d, &watches[d], dt);
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
    struct gs_bucket *b = &gs_buckets[d];
    if (GS_UNLIKELY(!__atomic_load_n(&controller_started, __ATOMIC_ACQUIRE)))
        start_controller();
    if (cost < 1)
        cost = 1;
    /* Report what the last batch paid for; hand back what it did not use. */
    int64_t left = gs_tls_tokens[d] > 0 ? gs_tls_tokens[d] : 0;
    if (tls_batch[d] > left)
        __atomic_fetch_add(&b->spent, (uint64_t)(tls_batch[d] - left), __ATOMIC_RELAXED);
    __atomic_fetch_add(&b->draws, 1, __ATOMIC_RELAXED);
    int64_t rate = __atomic_load_n(&b->rate, __ATOMIC_ACQUIRE);
    int64_t batch;
    if (!rate) {
        batch = cost > GS_OPEN_BATCH ? cost : GS_OPEN_BATCH; /* not measured yet: run free, but count */
    } else {
        if (left)
            __atomic_fetch_add(&b->pool, left, __ATOMIC_RELAXED);
        batch = rate / (1000000000LL / GS_BATCH_NS);
        batch = batch < cost ? cost : batch > GS_MAX_BATCH ? GS_MAX_BATCH : batch;
        refill(b, rate);
        if (__atomic_sub_fetch(&b->pool, batch, __ATOMIC_ACQ_REL) < 0) {
            __atomic_fetch_add(&b->waits, 1, __ATOMIC_RELAXED);
            int64_t pool;
            while ((pool = __atomic_load_n(&b->pool, __ATOMIC_ACQUIRE)) < 0) {
                rate = __atomic_load_n(&b->rate, __ATOMIC_ACQUIRE);
                int64_t wait = (int64_t)((double)-pool * 1e9 / (double)rate);
                sleep_ns(wait < 20000 ? 20000 : wait > 5000000 ? 5000000 : wait);
                refill(b, rate);
            }
        }
    }
    tls_batch[d] = batch;
    gs_tls_tokens[d] = batch - cost;
}

void gs_throttle_setup(int ndevs)
{
    int any = 0;
    for (int d = 0; d < ndevs && d < GS_MAX_DEVICES; d++) {
        struct gs_bucket *b = &gs_buckets[d];
        b->active = !gs_devs[d].blocked && gs_devs[d].sm_limit < 100 && gs_cfg.policy != GS_POLICY_DISABLE;
        any |= b->active;
        if (gs_devs[d].sm_limit < 100 && !b->active && !gs_devs[d].blocked)
            GS_INFO("CUDA device %d: compute share %d%% not held (%s=disable)", d, gs_devs[d].sm_limit,
                    GS_ENV_CORE_POLICY);
    }
    __atomic_store_n(&gs_throttle_on, any, __ATOMIC_RELEASE);
}

void gs_throttle_after_fork_child(void)
{
    controller_started = 0;
    pthread_mutex_init(&controller_lock, NULL);
    for (int d = 0; d < GS_MAX_DEVICES; d++) {
        struct gs_bucket *b = &gs_buckets[d];
        b->rate = 0;
        b->pool = 0;
        b->spent = b->draws = b->waits = 0;
        gs_tls_tokens[d] = tls_batch[d] = 0;
        watches[d].spent = watches[d].waits = 0;
    }
}
GS_ON_FORK_CHILD(gs_throttle_after_fork_child)

GS_EXPORT int gpushare_throttle_stats(int dev, struct gpushare_throttle_stats *out)
{
    if (dev < 0 || dev >= GS_MAX_DEVICES || !out)
        return -1;
    const struct gs_bucket *b = &gs_buckets[dev];
    out->rate = __atomic_load_n(&b->rate, __ATOMIC_RELAXED);
    out->spent = __atomic_load_n(&b->spent, __ATOMIC_RELAXED);
    out->draws = __atomic_load_n(&b->draws, __ATOMIC_RELAXED);
    out->waits = __atomic_load_n(&b->waits, __ATOMIC_RELAXED);
    out->active = b->active;
    out->sm_limit = dev < gs_ndevs ? gs_devs[dev].sm_limit : 100;
    return 0;
}
