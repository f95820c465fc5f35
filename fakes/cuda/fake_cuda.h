/* The fake libcuda.so.1: the CUDA driver API (cuda.h, CUDA 12/13 ABI) that the isolation shim hooks, its tests
 * call, and NVIDIA's runtime, CuPy and PyTorch need to start and work, over simulated GPUs.
 *
 * Which GPUs exist comes from the fake NVML's config ($FAKE_NVML_CONFIG, fakes/fake_gpu_config.h), so both
 * fakes describe the same node (or container: a config listing only some GPUs, each at its node's state slot);
 * CUDA_VISIBLE_DEVICES (indices or UUIDs) picks and orders them among the config's GPUs as the real driver does;
 * a MIG-enabled GPU is its MIG devices, at most one per process (fake_cuda_mig.c).
 * With driver_socket= in the config, the process's identity in the shared state is its host pid
 * (fakes/fake_gpu_ident.h); the runtime's integrity check keeps using getpid(), as the runtime does. Memory is
 * accounted across processes in the shared state file (mem_used_bytes), so NVML and cuMemGetInfo agree. Settings of the simulation (env):
 *   FAKE_CUDA_CONTEXT_MIB       device memory a process's first context on a GPU takes (default 0)
 *   FAKE_CUDA_NS_PER_BLOCK      simulated kernel time per thread block (default 0: kernels take no time)
 *   FAKE_CUDA_QUEUE_US          work a stream may queue before a launch blocks (default 1000)
 *   FAKE_CUDA_CONTEXT_DELAY_MS  how long creating a process's first context on a GPU takes (default 0)
 *   FAKE_CUDA_HOST_BACKED       1: device memory is real memory, copies round-trip (fake_cuda_memory.c)
 *   FAKE_CUDA_PRIMARY_CTX_VIA_EXPORT  1: the runtime's private table gets the primary context through the
 *                               exported cuDevicePrimaryCtxRetain (default: inside the driver, fake_cuda_export.c)
 *   FAKE_CUDA_TRACE             1: print lookups the fake cannot answer, export tables and integrity checks
 * Kernels of every process run on one shared timeline per GPU in the state file (fake_gpu_timeline.h), from
 * which the fake NVML reports the GPU's and each process context's utilisation; a context registers the
 * process there (NVML lists it under its host pid with a driver socket, else under pid + host_pid_offset).
 *
 * Exported functions are aliases of hidden implementations, and cuGetProcAddress hands out the hidden
 * addresses, as the real driver does: an LD_PRELOAD library can interpose the exported names but not the
 * entry points the driver returns.
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "fake_gpu_config.h"
#include "cuda/fake_cuda_counters.h"

#pragma GCC visibility push(hidden)

/* --- cuda.h types: the shim's declaration (shim/gs_cuda_types.h), so the two cannot disagree on a layout -- */
#pragma GCC visibility pop
#include "gs_cuda_types.h"
#pragma GCC visibility push(hidden)

/* --- internals shared by the fake's files ---------------------------------------------------------------- */
#define FAKE_CUDA_MAX_DEVICES FAKE_GPU_MAX_GPUS

struct fake_ctx {
    int device;   /* CUDA ordinal */
    int primary;  /* 1 for the device's primary context */
    int refcount; /* primary: retains; others: 1 */
    unsigned long long id; /* unique in the process, never reused (cuCtxGetId, the context table's slot 4) */
};

/* A new context id: 1, 2, ... in the order contexts are made, as the driver numbers them. */
unsigned long long fake_ctx_next_id(void);

struct fake_device {
    int slot; /* the GPU's entry in the state file (its config line's slot=, by default its line index) */
    struct fake_gpu_info info;
};

extern struct fake_gpu_state *fake_state;       /* shared live state; NULL before cuInit */
extern int fake_initialised;
extern int fake_device_count;
extern struct fake_device fake_devices[FAKE_CUDA_MAX_DEVICES];
extern struct fake_cuda_counters fake_counters;
extern __thread struct fake_ctx *fake_current;

#define FAKE_COUNT(name) __atomic_fetch_add(&fake_counters.name, 1, __ATOMIC_RELAXED)

/* Fill fake_devices from the config and CUDA_VISIBLE_DEVICES, MIG devices as CUDA enumerates them
 * (fake_cuda_mig.c). */
void fake_cuda_pick_devices(const struct fake_gpu_config *cfg);
/* The current context's device, or an error (not initialised / no current context). */
CUresult fake_current_device(int *dev);
/* Charge or refund device memory on a CUDA ordinal (shared with other processes). */
CUresult fake_mem_take(int dev, uint64_t bytes);
void fake_mem_give(int dev, uint64_t bytes);
uint64_t fake_env_u64(const char *name, uint64_t dflt);
/* Look a driver entry point up the way cuGetProcAddress does. NULL when there is none. */
void *fake_proc_lookup(const char *symbol, int version, cuuint64_t flags, int *version_too_low);
/* 1 while work this process queued on dev has not finished on the simulated GPU. */
int fake_sim_busy(int dev);
/* Wait until the simulated GPU has finished the work this process queued on dev. */
void fake_sim_drain(int dev);
/* Count bytes (negative: given back) as this process's device memory on dev, which NVML lists per process. */
void fake_sim_mem(int dev, int64_t bytes);
/* Register this process's context on dev with the simulated GPU (NVML lists it from then on). */
void fake_sim_attach(int dev);

#pragma GCC visibility pop

/* Export `name` as an alias of the hidden implementation impl_<name>. */
#define FAKE_EXPORT(name) \
    extern __typeof__(impl_##name) name __attribute__((alias("impl_" #name), visibility("default")));

/* What a forked child must reset, registered at load time by the file that keeps that state:
 *     FAKE_ON_FORK_CHILD(child_after_fork) */
#define FAKE_ON_FORK_CHILD(fn)                                            \
    __attribute__((constructor)) static void fake_register_##fn(void) \
    {                                                                     \
        pthread_atfork(NULL, NULL, fn);                                   \
    }


#endif /* FAKE_CUDA_H */
