/* Fake driver: kernel launches on the simulated GPU's shared timeline (fake_gpu_timeline.h).
 *
 * With FAKE_CUDA_NS_PER_BLOCK set, each launch queues blocks * ns_per_block of work on its GPU's timeline, after
 * the work every process queued before it; a launch blocks while its own work would end more than
 * FAKE_CUDA_QUEUE_US from now (as a full launch queue does). The timeline credits run time to the GPU and to
 * this process's context, which NVML reports. Without it launches only count. */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "fake_cuda_api.h"
#include "fake_gpu_timeline.h"

#define CUDA_ERROR_OPERATING_SYSTEM 304

static pthread_once_t sim_once = PTHREAD_ONCE_INIT;
static uint64_t ns_per_block, queue_ns;
static int proc_index[FAKE_CUDA_MAX_DEVICES]; /* this process's procs[] entry per CUDA ordinal, + 1; 0 = none */
static int attached;                          /* 1 once this process has a procs[] entry */
static uint64_t last_end[FAKE_CUDA_MAX_DEVICES]; /* when this process's queued work ends, per CUDA ordinal */
static uint64_t proc_mem[FAKE_CUDA_MAX_DEVICES];  /* device memory this process holds, per CUDA ordinal */
/* A last_end already seen in the past: that work is done for good, so a query needs no clock read until a launch
 * queues more (the real driver answers cuStreamQuery from a completion counter in memory, not a clock). */
static uint64_t done_through[FAKE_CUDA_MAX_DEVICES];

static void publish_mem(int dev)
{
    int i = __atomic_load_n(&proc_index[dev], __ATOMIC_ACQUIRE) - 1;
    if (i >= 0)
        __atomic_store_n(&fake_state->procs[i].mem_used_bytes, __atomic_load_n(&proc_mem[dev], __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
}

/* What NVML lists as this process's memory on dev (usedGpuMemory). */
void fake_sim_mem(int dev, int64_t bytes)
{
    if (!fake_state || dev < 0 || dev >= fake_device_count)
        return;
    __atomic_add_fetch(&proc_mem[dev], (uint64_t)bytes, __ATOMIC_RELAXED);
    publish_mem(dev);
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

static uint64_t context_delay_ns;

static void read_settings(void)
{
    ns_per_block = fake_env_u64("FAKE_CUDA_NS_PER_BLOCK", 0);
    queue_ns = fake_env_u64("FAKE_CUDA_QUEUE_US", 1000) * 1000ULL;
    context_delay_ns = fake_env_u64("FAKE_CUDA_CONTEXT_DELAY_MS", 0) * 1000000ULL;
}

/* A process's first context on a GPU: it takes FAKE_CUDA_CONTEXT_DELAY_MS to create (real ones take 100 ms and
 * more), then NVML lists the process. */
void fake_sim_attach(int dev)
{
    if (!fake_state || dev < 0 || dev >= fake_device_count || __atomic_load_n(&proc_index[dev], __ATOMIC_ACQUIRE))
        return;
    pthread_once(&sim_once, read_settings);
    if (context_delay_ns)
        sleep_ns(context_delay_ns);
    int i = fake_tl_attach(fake_state, (unsigned)fake_devices[dev].slot);
    if (i == FAKE_TL_FULL)
        fprintf(stderr, "fake libcuda: more than %d processes have contexts; this one is not listed by NVML\n",
                FAKE_GPU_MAX_PROCS);
    if (i >= 0)
        __atomic_store_n(&attached, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&proc_index[dev], i < 0 ? 0 : i + 1, __ATOMIC_RELEASE);
    publish_mem(dev);
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
    fake_sim_attach(ctx->device);
    int32_t me = fake_ident_self();
    if (!me)
        return CUDA_ERROR_OPERATING_SYSTEM; /* the driver socket cannot say who this process is (stderr says why) */
    unsigned gpu = (unsigned)fake_devices[ctx->device].slot;
    uint64_t end;
    while (!(end = fake_tl_queue(fake_state, gpu, __atomic_load_n(&proc_index[ctx->device], __ATOMIC_ACQUIRE) - 1,
                                 me, blocks * ns_per_block)))
        sleep_ns(100000); /* the GPU's queue of spans is full */
    __atomic_store_n(&last_end[ctx->device], end, __ATOMIC_RELEASE);
    uint64_t now = fake_tl_now_ns();
    if (end > now + queue_ns)
        sleep_ns(end - now - queue_ns);
    return CUDA_SUCCESS;
}

int fake_sim_busy(int dev)
{
    if (dev < 0 || dev >= fake_device_count)
        return 0;
    uint64_t end = __atomic_load_n(&last_end[dev], __ATOMIC_ACQUIRE);
    if (end <= __atomic_load_n(&done_through[dev], __ATOMIC_ACQUIRE))
        return 0;
    if (end > fake_tl_now_ns())
        return 1;
    __atomic_store_n(&done_through[dev], end, __ATOMIC_RELEASE); /* a racing store of an older end costs a clock read */
    return 0;
}

void fake_sim_drain(int dev)
{
    uint64_t end = __atomic_load_n(&last_end[dev], __ATOMIC_ACQUIRE), now = fake_tl_now_ns();
    if (end > now)
        sleep_ns(end - now);
}

/* After fork the child is a new process to the GPU: its contexts register anew. */
static void child_after_fork(void)
{
    memset(proc_index, 0, sizeof proc_index);
    memset(last_end, 0, sizeof last_end);
    memset(done_through, 0, sizeof done_through);
    memset(proc_mem, 0, sizeof proc_mem);
    attached = 0;
}

FAKE_ON_FORK_CHILD(child_after_fork)

/* A process that ends leaves NVML's process lists. */
__attribute__((destructor)) static void detach(void)
{
    if (fake_state && __atomic_load_n(&attached, __ATOMIC_RELAXED))
        fake_tl_detach_all(fake_state);
}

/* Kernels are timed, not run: any name in a loaded module is a function. */
CUresult impl_cuModuleGetFunction(CUfunction *f, CUmodule mod, const char *name)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!f || !mod || !name)
        return CUDA_ERROR_INVALID_VALUE;
    *f = (CUfunction)mod;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuModuleGetFunction)

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
