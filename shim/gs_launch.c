/* Launch hooks: every kernel launch entry point, in its legacy-stream and per-thread-stream (_ptsz) forms,
 * passes the compute-share gate and then calls the same entry point of the driver. */
#include "gs_shim.h"
#include "gs_throttle.h"

/* Grid size in blocks, kept well inside int64 (a grid can hold up to 2^63 blocks). */
static inline int64_t blocks(unsigned x, unsigned y, unsigned z)
{
    uint64_t n = (uint64_t)x * y;
    n = n > (1ULL << 40) ? (1ULL << 40) : n * z;
    return n > (1ULL << 40) ? (int64_t)(1ULL << 40) : (int64_t)n;
}

/* The compute-share gate of the GPU the calling thread launches on. */
static inline void gate(int64_t cost)
{
    if (GS_LIKELY(!gs_throttle_engaged()))
        return;
    int d = 0;
    if (gs_ndevs != 1 && gs_current_device(&d) != CUDA_SUCCESS)
        return;
    gs_gate(d, cost);
}

#define GS_LAUNCH_HOOK(name, cost, args)          \
    {                                             \
        CUresult rc_ = gs_enter();                \
        if (GS_UNLIKELY(rc_ != CUDA_SUCCESS))     \
            return rc_;                           \
        gs_pfn_##name real_ = gs_cu.name;         \
        if (GS_UNLIKELY(!real_))                  \
            return CUDA_ERROR_NOT_SUPPORTED;      \
        gate(cost);                               \
        return real_ args;                        \
    }

GS_EXPORT CUresult cuLaunchKernel GS_LAUNCH_PARAMS
GS_LAUNCH_HOOK(cuLaunchKernel, blocks(gx, gy, gz), (f, gx, gy, gz, bx, by, bz, shm, stream, params, extra))

GS_EXPORT CUresult cuLaunchKernel_ptsz GS_LAUNCH_PARAMS
GS_LAUNCH_HOOK(cuLaunchKernel_ptsz, blocks(gx, gy, gz), (f, gx, gy, gz, bx, by, bz, shm, stream, params, extra))

GS_EXPORT CUresult cuLaunchCooperativeKernel GS_COOP_PARAMS
GS_LAUNCH_HOOK(cuLaunchCooperativeKernel, blocks(gx, gy, gz), (f, gx, gy, gz, bx, by, bz, shm, stream, params))

GS_EXPORT CUresult cuLaunchCooperativeKernel_ptsz GS_COOP_PARAMS
GS_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, blocks(gx, gy, gz),
               (f, gx, gy, gz, bx, by, bz, shm, stream, params))

GS_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
GS_LAUNCH_HOOK(cuLaunchKernelEx, config ? blocks(config->gridDimX, config->gridDimY, config->gridDimZ) : 1,
               (config, f, params, extra))

GS_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
GS_LAUNCH_HOOK(cuLaunchKernelEx_ptsz, config ? blocks(config->gridDimX, config->gridDimY, config->gridDimZ) : 1,
               (config, f, params, extra))

GS_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream)
GS_LAUNCH_HOOK(cuGraphLaunch, GS_GRAPH_COST, (exec, stream))

GS_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream)
GS_LAUNCH_HOOK(cuGraphLaunch_ptsz, GS_GRAPH_COST, (exec, stream))
