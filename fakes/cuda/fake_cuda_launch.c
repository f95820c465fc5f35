/* Fake driver: kernel launches and the simulated GPU's busy time.
 *
 * With FAKE_CUDA_NS_PER_BLOCK set, each launch queues blocks * ns_per_block of work on its GPU; work runs back
 * to back, a launch blocks while more than FAKE_CUDA_QUEUE_US of work is queued (as a full launch queue does),
 * and a thread publishes the busy share of the last 100 ms as util_percent. Without it launches only count. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "fake_cuda_api.h"

#define UTIL_TICK_NS 20000000ULL /* 20 ms */
#define UTIL_SAMPLES 6           /* window = 5 ticks = 100 ms */

struct sim_gpu {
    pthread_mutex_t lock;
    uint64_t busy_until; /* monotonic ns when the queued work ends */
    uint64_t work_total; /* ns of work ever queued */
    int active;
    uint64_t sample_t[UTIL_SAMPLES], sample_busy[UTIL_SAMPLES];
    int samples;
};

static struct sim_gpu sim[FAKE_CUDA_MAX_DEVICES];
static pthread_once_t sim_once = PTHREAD_ONCE_INIT;
static uint64_t ns_per_block, queue_ns;
static int util_thread_started;
static pthread_mutex_t util_thread_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static void read_settings(void)
{
    ns_per_block = fake_env_u64("FAKE_CUDA_NS_PER_BLOCK", 0);
    queue_ns = fake_env_u64("FAKE_CUDA_QUEUE_US", 1000) * 1000ULL;
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++)
        pthread_mutex_init(&sim[d].lock, NULL);
}

/* Busy time up to `now`: all queued work minus what is still waiting to run. */
static uint64_t busy_at(struct sim_gpu *g, uint64_t now)
{
    uint64_t pending = g->busy_until > now ? g->busy_until - now : 0;
    return g->work_total - pending;
}

static void *util_thread(void *arg)
{
    (void)arg;
    for (;;) {
        sleep_ns(UTIL_TICK_NS);
        uint64_t now = now_ns();
        for (int d = 0; d < fake_device_count; d++) {
            struct sim_gpu *g = &sim[d];
            pthread_mutex_lock(&g->lock);
            if (!g->active) {
                pthread_mutex_unlock(&g->lock);
                continue;
            }
            int n = g->samples < UTIL_SAMPLES ? g->samples : UTIL_SAMPLES - 1;
            for (int i = n; i > 0; i--) {
                g->sample_t[i] = g->sample_t[i - 1];
                g->sample_busy[i] = g->sample_busy[i - 1];
            }
            g->sample_t[0] = now;
            g->sample_busy[0] = busy_at(g, now);
            if (g->samples < UTIL_SAMPLES)
                g->samples++;
            int old = g->samples - 1;
            uint64_t span = now - g->sample_t[old];
            uint64_t busy = g->sample_busy[0] - g->sample_busy[old];
            unsigned util = span ? (unsigned)((busy * 100 + span / 2) / span) : 0;
            pthread_mutex_unlock(&g->lock);
            __atomic_store_n(&fake_state->gpus[fake_devices[d].config_index].util_percent, util > 100 ? 100 : util,
                             __ATOMIC_RELAXED);
        }
    }
    return NULL;
}

static void start_util_thread(void)
{
    pthread_mutex_lock(&util_thread_lock);
    if (!util_thread_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, util_thread, NULL) == 0) {
            pthread_detach(t);
            util_thread_started = 1;
        }
    }
    pthread_mutex_unlock(&util_thread_lock);
}

/* Queue the work of one launch on the current GPU; blocks while the queue is full. */
static CUresult run_kernel(uint64_t blocks)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct fake_ctx *ctx = fake_current;
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_once(&sim_once, read_settings);
    if (!ns_per_block)
        return CUDA_SUCCESS;
    if (!__atomic_load_n(&util_thread_started, __ATOMIC_ACQUIRE))
        start_util_thread();
    struct sim_gpu *g = &sim[ctx->device];
    uint64_t now = now_ns();
    pthread_mutex_lock(&g->lock);
    g->active = 1;
    uint64_t start = g->busy_until > now ? g->busy_until : now;
    g->busy_until = start + blocks * ns_per_block;
    g->work_total += blocks * ns_per_block;
    uint64_t end = g->busy_until;
    pthread_mutex_unlock(&g->lock);
    if (end > now + queue_ns)
        sleep_ns(end - now - queue_ns);
    return CUDA_SUCCESS;
}

void fake_sim_drain(int dev)
{
    pthread_once(&sim_once, read_settings);
    pthread_mutex_lock(&sim[dev].lock);
    uint64_t end = sim[dev].busy_until;
    pthread_mutex_unlock(&sim[dev].lock);
    uint64_t now = now_ns();
    if (end > now)
        sleep_ns(end - now);
}

static void child_after_fork(void)
{
    util_thread_started = 0;
    pthread_mutex_init(&util_thread_lock, NULL);
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
        pthread_mutex_init(&sim[d].lock, NULL);
        sim[d].active = 0;
        sim[d].samples = 0;
    }
}

__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, child_after_fork);
}

/* A process that simulated kernels leaves its GPUs idle when it ends. */
__attribute__((destructor)) static void clear_util(void)
{
    if (!fake_state)
        return;
    for (int d = 0; d < fake_device_count; d++)
        if (sim[d].active)
            __atomic_store_n(&fake_state->gpus[fake_devices[d].config_index].util_percent, 0, __ATOMIC_RELAXED);
}

static uint64_t grid(unsigned x, unsigned y, unsigned z)
{
    return (uint64_t)x * y * z;
}

CUresult impl_cuLaunchKernel(LAUNCH_PARAMS)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shm, (void)stream, (void)params, (void)extra;
    FAKE_COUNT(launch);
    return run_kernel(grid(gx, gy, gz));
}
FAKE_EXPORT(cuLaunchKernel)

CUresult impl_cuLaunchKernel_ptsz(LAUNCH_PARAMS)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shm, (void)stream, (void)params, (void)extra;
    FAKE_COUNT(launch_ptsz);
    return run_kernel(grid(gx, gy, gz));
}
FAKE_EXPORT(cuLaunchKernel_ptsz)

CUresult impl_cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    (void)f, (void)params, (void)extra;
    FAKE_COUNT(launch_ex);
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return run_kernel(grid(config->gridDimX, config->gridDimY, config->gridDimZ));
}
FAKE_EXPORT(cuLaunchKernelEx)

CUresult impl_cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    (void)f, (void)params, (void)extra;
    FAKE_COUNT(launch_ex_ptsz);
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return run_kernel(grid(config->gridDimX, config->gridDimY, config->gridDimZ));
}
FAKE_EXPORT(cuLaunchKernelEx_ptsz)

CUresult impl_cuLaunchCooperativeKernel(COOP_PARAMS)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shm, (void)stream, (void)params;
    FAKE_COUNT(launch_coop);
    return run_kernel(grid(gx, gy, gz));
}
FAKE_EXPORT(cuLaunchCooperativeKernel)

CUresult impl_cuLaunchCooperativeKernel_ptsz(COOP_PARAMS)
{
    (void)f, (void)bx, (void)by, (void)bz, (void)shm, (void)stream, (void)params;
    FAKE_COUNT(launch_coop_ptsz);
    return run_kernel(grid(gx, gy, gz));
}
FAKE_EXPORT(cuLaunchCooperativeKernel_ptsz)

/* A graph counts as one kernel of 64 blocks. */
CUresult impl_cuGraphLaunch(CUgraphExec exec, CUstream stream)
{
    (void)exec, (void)stream;
    FAKE_COUNT(graph_launch);
    return run_kernel(64);
}
FAKE_EXPORT(cuGraphLaunch)

CUresult impl_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
{
    (void)exec, (void)stream;
    FAKE_COUNT(graph_launch_ptsz);
    return run_kernel(64);
}
FAKE_EXPORT(cuGraphLaunch_ptsz)

CUresult impl_cuStreamSynchronize(CUstream stream)
{
    (void)stream;
    return impl_cuCtxSynchronize();
}
FAKE_EXPORT(cuStreamSynchronize)

CUresult impl_cuStreamSynchronize_ptsz(CUstream stream)
{
    (void)stream;
    return impl_cuCtxSynchronize();
}
FAKE_EXPORT(cuStreamSynchronize_ptsz)
