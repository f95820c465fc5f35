/* What tests read back from the fake libcuda: per-process call counters of each entry point, and the bytes this
 * process holds. Programs get them with dlsym(libcuda, "fakeCuda_getCounters"). */
#ifndef FAKE_CUDA_COUNTERS_H
#define FAKE_CUDA_COUNTERS_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_CUDA_COUNTERS(X)                                                                                    \
    X(ctx_created) X(mem_alloc) X(mem_alloc_pitch) X(mem_alloc_managed) X(mem_alloc_async)                     \
    X(mem_alloc_async_ptsz) X(mem_alloc_pool) X(mem_alloc_pool_ptsz) X(mem_create) X(mem_free)                  \
    X(mem_free_async) X(mem_free_async_ptsz) X(mem_release) X(launch) X(launch_ptsz) X(launch_ex)               \
    X(launch_ex_ptsz) X(launch_coop) X(launch_coop_ptsz) X(graph_launch) X(graph_launch_ptsz) X(live_bytes)    \
    X(mem_oom)

struct fake_cuda_counters {
#define FAKE_CUDA_FIELD(name) uint64_t name;
    FAKE_CUDA_COUNTERS(FAKE_CUDA_FIELD)
#undef FAKE_CUDA_FIELD
};

/* Test API, exported: this process's counters (size = sizeof(struct fake_cuda_counters)). */
__attribute__((visibility("default"))) int fakeCuda_getCounters(struct fake_cuda_counters *out, size_t size);

#endif /* FAKE_CUDA_COUNTERS_H */
