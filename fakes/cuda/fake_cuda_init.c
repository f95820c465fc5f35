/* Fake driver: cuInit, device queries and contexts. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>

#include "fake_cuda_export.h"
#include "fake_cuda_mem.h"
#include "fake_gpu_ident.h"

struct fake_gpu_state *fake_state;
int fake_initialised;
int fake_device_count;
struct fake_device fake_devices[FAKE_CUDA_MAX_DEVICES];
struct fake_cuda_counters fake_counters;
__thread struct fake_ctx *fake_current;

static struct fake_ctx primary_ctx[FAKE_CUDA_MAX_DEVICES];
static int context_charged[FAKE_CUDA_MAX_DEVICES];
static int primary_flags[FAKE_CUDA_MAX_DEVICES];
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long last_ctx_id;

unsigned long long fake_ctx_next_id(void)
{
    return __atomic_add_fetch(&last_ctx_id, 1, __ATOMIC_RELAXED);
}
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;

uint64_t fake_env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end) {
        fprintf(stderr, "fake libcuda: %s=%s is not a number; using %llu\n", name, v, (unsigned long long)dflt);
        return dflt;
    }
    return x;
}

static void do_init(void)
{
    const char *path = getenv(FAKE_GPU_CONFIG_ENV);
    if (!path || !*path) {
        fprintf(stderr, "fake libcuda: %s is not set; no GPUs\n", FAKE_GPU_CONFIG_ENV);
        init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    static struct fake_gpu_config cfg;
    char err[8192];
    if (fake_gpu_config_load(path, &cfg, err, sizeof err)) {
        fprintf(stderr, "fake libcuda: %s\n", err);
        init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    char state_path[FAKE_GPU_PATH_LEN];
    int create = fake_gpu_config_state_path(&cfg, path, state_path, sizeof state_path);
    if (create < 0) {
        fprintf(stderr, "fake libcuda: config path %s is too long\n", path);
        init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    if (fake_ident_configure("fake libcuda", cfg.driver_socket, err, sizeof err) != 0) {
        fprintf(stderr, "fake libcuda: %s (driver_socket= in %s): the node's driver is not running here "
                        "(cuInit: CUDA_ERROR_NO_DEVICE)\n", err, path);
        init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    fake_state = fake_gpu_state_map(state_path, create, err, sizeof err);
    if (!fake_state) {
        fprintf(stderr, "fake libcuda: %s\n", err);
        init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    fake_cuda_pick_devices(&cfg); /* fake_cuda_mig.c */
    if (fake_device_count == 0) {
        init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    for (int d = 0; d < fake_device_count; d++)
        primary_ctx[d] = (struct fake_ctx){.device = d, .primary = 1, .refcount = 0, .id = fake_ctx_next_id()};
    fake_initialised = 1;
    init_result = CUDA_SUCCESS;
}

/* After fork the child is a new process to the (simulated) GPU: no contexts, no memory of its own. */
static void child_after_fork(void)
{
    pthread_mutex_init(&ctx_lock, NULL);
    memset(context_charged, 0, sizeof context_charged);
    for (int d = 0; d < fake_device_count; d++)
        primary_ctx[d].refcount = 0;
    fake_current = NULL;
}

FAKE_ON_FORK_CHILD(child_after_fork)

__attribute__((destructor)) static void release_contexts(void)
{
    if (!fake_state)
        return;
    uint64_t bytes = fake_env_u64("FAKE_CUDA_CONTEXT_MIB", 0) << 20;
    for (int d = 0; d < fake_device_count; d++)
        if (context_charged[d] && bytes)
            fake_mem_give(d, bytes);
}

CUresult impl_cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&init_once, do_init);
    return init_result;
}
FAKE_EXPORT(cuInit)

CUresult impl_cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDriverGetVersion)

#define NEED_INIT()                      \
    do {                                 \
        if (!fake_initialised)           \
            return CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)
#define NEED_DEVICE(d)                                   \
    do {                                                 \
        NEED_INIT();                                     \
        if ((d) < 0 || (d) >= fake_device_count)         \
            return CUDA_ERROR_INVALID_DEVICE;            \
    } while (0)

CUresult impl_cuDeviceGetCount(int *count)
{
    NEED_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fake_device_count;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetCount)

CUresult impl_cuDeviceGet(CUdevice *device, int ordinal)
{
    NEED_DEVICE(ordinal);
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = ordinal;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGet)

CUresult impl_cuDeviceGetName(char *name, int len, CUdevice dev)
{
    NEED_DEVICE(dev);
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", fake_devices[dev].info.name);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetName)

/* "GPU-0b6a1c2d-..." -> 16 bytes; hex digits are read in order, dashes skipped, missing digits are zero. */
static void uuid_bytes(const char *text, CUuuid *out)
{
    memset(out, 0, sizeof *out);
    int nibble = 0;
    for (const char *p = text + 4; *p && nibble < 32; p++) {
        int v = isdigit((unsigned char)*p) ? *p - '0'
                : isxdigit((unsigned char)*p) ? tolower((unsigned char)*p) - 'a' + 10 : -1;
        if (v < 0)
            continue;
        out->bytes[nibble / 2] = (char)(out->bytes[nibble / 2] | (nibble % 2 ? v : v << 4));
        nibble++;
    }
}

CUresult impl_cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    NEED_DEVICE(dev);
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    uuid_bytes(fake_devices[dev].info.uuid, uuid);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetUuid_v2)

CUresult impl_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return impl_cuDeviceGetUuid_v2(uuid, dev);
}
FAKE_EXPORT(cuDeviceGetUuid)

CUresult impl_cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    NEED_DEVICE(dev);
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = fake_devices[dev].info.memory_bytes;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceTotalMem_v2)

/* A process's first context on a GPU takes FAKE_CUDA_CONTEXT_MIB of its memory, as a real one does. NVML lists the
 * process from its FAKE_CUDA_LISTED_AFTER-th context call on the GPU (default the first): a runtime whose first
 * call only looks the primary context up, and creates it in a later one, as PyTorch's start on a real driver was
 * seen to do. */
static CUresult charge_context(int dev)
{
    static unsigned calls[FAKE_CUDA_MAX_DEVICES];
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&ctx_lock);
    unsigned call = ++calls[dev];
    if (!context_charged[dev]) {
        uint64_t bytes = fake_env_u64("FAKE_CUDA_CONTEXT_MIB", 0) << 20;
        rc = bytes ? fake_mem_take(dev, bytes) : CUDA_SUCCESS;
        if (rc == CUDA_SUCCESS) {
            context_charged[dev] = 1;
            FAKE_COUNT(ctx_created);
        }
    }
    pthread_mutex_unlock(&ctx_lock);
    if (rc == CUDA_SUCCESS && call >= fake_env_u64("FAKE_CUDA_LISTED_AFTER", 1))
        fake_sim_attach(dev);
    return rc;
}

CUresult impl_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    NEED_DEVICE(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = charge_context(dev);
    if (rc)
        return rc;
    __atomic_fetch_add(&primary_ctx[dev].refcount, 1, __ATOMIC_RELAXED);
    *pctx = (CUcontext)&primary_ctx[dev];
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDevicePrimaryCtxRetain)

CUresult impl_cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    NEED_DEVICE(dev);
    __atomic_fetch_sub(&primary_ctx[dev].refcount, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDevicePrimaryCtxRelease_v2)

/* The runtime's private table (slot 2) asks for the primary context before it calls cuDevicePrimaryCtxRetain.
 * A real driver creates the context right there, unseen by anything interposing the exported names; so does
 * the fake by default. FAKE_CUDA_PRIMARY_CTX_VIA_EXPORT=1 routes it through the exported (interposable) name. */
CUresult fake_primary_ctx_private(CUcontext *pctx, CUdevice dev)
{
    if (fake_env_u64("FAKE_CUDA_PRIMARY_CTX_VIA_EXPORT", 0)) {
        CUresult (*retain)(CUcontext *, CUdevice) =
            (CUresult(*)(CUcontext *, CUdevice))dlsym(RTLD_DEFAULT, "cuDevicePrimaryCtxRetain");
        if (retain)
            return retain(pctx, dev);
    }
    return impl_cuDevicePrimaryCtxRetain(pctx, dev);
}

CUresult impl_cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    NEED_DEVICE(dev);
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = (unsigned)primary_flags[dev];
    *active = __atomic_load_n(&primary_ctx[dev].refcount, __ATOMIC_RELAXED) > 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDevicePrimaryCtxGetState)

CUresult impl_cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    NEED_DEVICE(dev);
    primary_flags[dev] = (int)flags;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDevicePrimaryCtxSetFlags_v2)

CUresult impl_cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    NEED_DEVICE(dev);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDevicePrimaryCtxReset_v2)

static CUresult create_context(CUcontext *pctx, CUdevice dev)
{
    NEED_DEVICE(dev);
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = charge_context(dev);
    if (rc)
        return rc;
    struct fake_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ctx = (struct fake_ctx){.device = dev, .primary = 0, .refcount = 1, .id = fake_ctx_next_id()};
    fake_current = ctx;
    *pctx = (CUcontext)ctx;
    return CUDA_SUCCESS;
}

CUresult impl_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return create_context(pctx, dev);
}
FAKE_EXPORT(cuCtxCreate_v2)

CUresult impl_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev)
{
    (void)params, (void)n, (void)flags;
    return create_context(pctx, dev);
}
FAKE_EXPORT(cuCtxCreate_v3)

CUresult impl_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    (void)params, (void)flags;
    return create_context(pctx, dev);
}
FAKE_EXPORT(cuCtxCreate_v4)

CUresult impl_cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    struct fake_ctx *c = (struct fake_ctx *)ctx;
    if (!c || c->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (fake_current == c)
        fake_current = NULL;
    free(c);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxDestroy_v2)

CUresult impl_cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    fake_current = (struct fake_ctx *)ctx;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxSetCurrent)

CUresult impl_cuCtxGetCurrent(CUcontext *pctx)
{
    NEED_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)fake_current;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetCurrent)

CUresult fake_current_device(int *dev)
{
    NEED_INIT();
    if (!fake_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *dev = fake_current->device;
    return CUDA_SUCCESS;
}

CUresult impl_cuCtxGetDevice(CUdevice *device)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_current_device(device);
}
FAKE_EXPORT(cuCtxGetDevice)

CUresult impl_cuCtxSynchronize(void)
{
    int dev;
    CUresult rc = fake_current_device(&dev);
    if (rc)
        return rc;
    fake_sim_drain(dev);
    fake_host_calls_wait();
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxSynchronize)

int fakeCuda_getCounters(struct fake_cuda_counters *out, size_t size)
{
    if (!out || size != sizeof *out)
        return -1;
#define FAKE_CUDA_COPY(name) out->name = __atomic_load_n(&fake_counters.name, __ATOMIC_RELAXED);
    FAKE_CUDA_COUNTERS(FAKE_CUDA_COPY)
#undef FAKE_CUDA_COPY
    return 0;
}
