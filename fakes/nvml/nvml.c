/* Fake libnvidia-ml.so.1: the NVML calls the daemon (through pynvml) and the shim (through dlopen) make,
 * answered from a text config ($FAKE_NVML_CONFIG, fakes/fake_gpu_config.h) and a live state file
 * ($FAKE_NVML_CONFIG.state or the config's state=, fakes/fake_gpu_state.h). Real return codes, real struct
 * layouts, real init reference counting. fakes/README.md describes the files; tests/fakes/test_nvml.py pins the
 * behaviour.
 *
 * Device handles carry the config's index (what NVML calls the index); everything read from the state file is
 * read at the GPU's slot (slot() below), which a container's config sets to the node's index of the GPU. MIG
 * device handles carry FAKE_GPU_MAX_GPUS + their `mig` line and answer as devices of their own (nvml_mig.c).
 */
#include <pthread.h>
#include <stdlib.h>
#include <strings.h>

#include "fake_gpu_config.h"
#include "fake_gpu_ident.h"
#include "fake_gpu_state.h"
#include "fake_gpu_timeline.h"
#include "nvml/fake_nvml.h"
#include "nvml/nvml_internal.h"

#define SUPPORTED_EVENTS                                                                                          \
    (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState |                     \
     nvmlEventTypeXidCriticalError | nvmlEventTypeClock)
#define EVENT_SET_MAGIC 0x45564e54u

struct nvmlDevice_st {
    unsigned index;
};

/* The mmapped state file. Never unmapped: a thread still inside an NVML call (or an event set) while another
 * shuts NVML down and re-inits it with another config must not fault. A re-init with the same file reuses the
 * mapping, so a long-running process maps each state file once. */
struct state_map {
    struct fake_gpu_state *state;
};

struct nvmlEventSet_st {
    unsigned magic;
    unsigned generation;
    struct state_map *map;
    pthread_mutex_t lock;
    uint32_t cursor;                                   /* next event number to look at */
    unsigned long long types[FAKE_GPU_MAX_GPUS];       /* registered event types per GPU index */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* init and shutdown */
static int g_refcount;                                     /* nvmlInit calls not yet matched by nvmlShutdown */
static unsigned g_generation;                              /* bumped at every 0 -> 1 init */
static struct fake_gpu_config g_cfg;                       /* written only while g_refcount == 0 */
static struct state_map *g_map; /* the current init cycle's; set before g_refcount turns 1, never NULL after */
/* GPU handles at 0..15; MIG device handles at FAKE_GPU_MAX_GPUS + k, k the config's MIG line (nvml_mig.c). */
static struct nvmlDevice_st g_devices[FAKE_GPU_MAX_GPUS + FAKE_GPU_MAX_MIGS] = {
    {0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15},
    {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31},
};

static int initialized(void)
{
    return __atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) > 0;
}

/* The state file's entry of the GPU at config index `index`. */
static unsigned slot(unsigned index)
{
    return index < FAKE_GPU_MAX_GPUS ? g_cfg.gpus[index].slot : g_cfg.migs[index - FAKE_GPU_MAX_GPUS].slot;
}

/* The config index of the GPU at state slot `s`; FAKE_GPU_MAX_GPUS when this config does not list it (another
 * container's GPU). */
static unsigned index_of_slot(unsigned s)
{
    for (unsigned i = 0; i < g_cfg.gpu_count; i++)
        if (g_cfg.gpus[i].slot == s)
            return i;
    return FAKE_GPU_MAX_GPUS;
}

static int gpu_lost(unsigned index)
{
    if (index >= FAKE_GPU_MAX_GPUS) /* a MIG device is lost with its GPU */
        index = g_cfg.migs[index - FAKE_GPU_MAX_GPUS].parent;
    return __atomic_load_n(&g_map->state->gpus[slot(index)].lost, __ATOMIC_ACQUIRE) != 0;
}

/* Validate a handle; fill *g. Lost GPUs answer GPU_IS_LOST, as a GPU that fell off the bus does. */
static nvmlReturn_t device(nvmlDevice_t d, const struct fake_gpu_info **g)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    int mig = d >= g_devices + FAKE_GPU_MAX_GPUS && d < g_devices + FAKE_GPU_MAX_GPUS + g_cfg.mig_count;
    if (!mig && (d < g_devices || d >= g_devices + g_cfg.gpu_count))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_lost(d->index))
        return NVML_ERROR_GPU_IS_LOST;
    *g = mig ? fake_nvml_mig_info(d->index - FAKE_GPU_MAX_GPUS) : &g_cfg.gpus[d->index];
    return NVML_SUCCESS;
}

/* device(), then NVML_ERROR_INVALID_ARGUMENT when the output pointer is NULL (NVML checks in that order). */
static nvmlReturn_t device_out(nvmlDevice_t d, const struct fake_gpu_info **g, const void *out)
{
    nvmlReturn_t r = device(d, g);
    return r == NVML_SUCCESS && !out ? NVML_ERROR_INVALID_ARGUMENT : r;
}

/* For the other files of this library (nvml_topology.c): a handle checked as every call checks it, and the config.
 * Hidden: not part of NVML's ABI. */
FAKE_NVML_HIDDEN nvmlReturn_t fake_nvml_device(nvmlDevice_t d, const struct fake_gpu_info **g)
{
    return device(d, g);
}

FAKE_NVML_HIDDEN const struct fake_gpu_config *fake_nvml_config(void)
{
    return &g_cfg;
}

FAKE_NVML_HIDDEN nvmlDevice_t fake_nvml_handle(unsigned index)
{
    return &g_devices[index];
}

/* A config rewritten since nvmlInit: take its GPUs' MIG modes and MIG devices (nvml_mig.c), when it still
 * describes the same GPUs. 1 when taken. */
FAKE_NVML_HIDDEN int fake_nvml_take_mig_layout(const struct fake_gpu_config *fresh)
{
    pthread_mutex_lock(&g_lock);
    int same = g_refcount > 0 && fresh->gpu_count == g_cfg.gpu_count;
    for (unsigned i = 0; same && i < g_cfg.gpu_count; i++)
        same = !strcmp(fresh->gpus[i].uuid, g_cfg.gpus[i].uuid);
    if (same) {
        for (unsigned i = 0; i < g_cfg.gpu_count; i++) {
            g_cfg.gpus[i].mig_current = fresh->gpus[i].mig_current;
            g_cfg.gpus[i].mig_pending = fresh->gpus[i].mig_pending;
        }
        memcpy(g_cfg.migs, fresh->migs, sizeof g_cfg.migs);
        fake_nvml_mig_load(fresh);
        __atomic_store_n(&g_cfg.mig_count, fresh->mig_count, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return same;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- init and shutdown ----------------------------------------------------------------------------------- */

static nvmlReturn_t init_locked(void)
{
    if (g_refcount > 0) {
        __atomic_store_n(&g_refcount, g_refcount + 1, __ATOMIC_RELEASE);
        return NVML_SUCCESS;
    }
    const char *path = getenv(FAKE_GPU_CONFIG_ENV);
    if (!path || !*path) {
        fprintf(stderr, "fake NVML: %s is not set, so this process sees a node without the NVIDIA driver "
                        "(nvmlInit: NVML_ERROR_DRIVER_NOT_LOADED); point it at a config (fakes/README.md)\n",
                FAKE_GPU_CONFIG_ENV);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    static struct fake_gpu_config cfg; /* under g_lock */
    char err[1024];
    if (fake_gpu_config_load(path, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "fake NVML: bad config %s\n", err);
        return NVML_ERROR_UNKNOWN;
    }
    char state_path[FAKE_GPU_PATH_LEN];
    int create = fake_gpu_config_state_path(&cfg, path, state_path, sizeof state_path);
    if (create < 0) {
        fprintf(stderr, "fake NVML: config path %s is too long\n", path);
        return NVML_ERROR_UNKNOWN;
    }
    if (fake_ident_configure("fake NVML", cfg.driver_socket, err, sizeof err) != 0) {
        fprintf(stderr, "fake NVML: %s (driver_socket= in %s): the node's driver is not running here "
                        "(nvmlInit: NVML_ERROR_DRIVER_NOT_LOADED)\n", err, path);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    uint64_t instance = fake_gpu_state_instance(state_path);
    if (!g_map || !instance || instance != __atomic_load_n(&g_map->state->instance, __ATOMIC_RELAXED)) {
        struct state_map *m = calloc(1, sizeof *m);
        if (!m)
            return NVML_ERROR_MEMORY;
        m->state = fake_gpu_state_map(state_path, create, err, sizeof err);
        if (!m->state) {
            fprintf(stderr, "fake NVML: %s\n", err);
            free(m);
            return NVML_ERROR_UNKNOWN;
        }
        g_map = m; /* the previous one stays mapped (see struct state_map) */
    }
    g_cfg = cfg;
    fake_nvml_mig_load(&g_cfg);
    g_generation++;
    __atomic_store_n(&g_refcount, 1, __ATOMIC_RELEASE);
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = init_locked();
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

FAKE_NVML_API nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

FAKE_NVML_API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = NVML_SUCCESS;
    if (g_refcount == 0) {
        r = NVML_ERROR_UNINITIALIZED;
    } else {
        __atomic_store_n(&g_refcount, g_refcount - 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_lock);
    return r;
}

FAKE_NVML_API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* ---- system ---------------------------------------------------------------------------------------------- */

FAKE_NVML_API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string(version, length, g_cfg.driver_version);
}

FAKE_NVML_API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    char buf[128];
    snprintf(buf, sizeof buf, "%d.%s", g_cfg.cuda_version / 1000, g_cfg.driver_version);
    return copy_string(version, length, buf);
}

FAKE_NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    *cudaDriverVersion = g_cfg.cuda_version;
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- device handles -------------------------------------------------------------------------------------- */

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    *deviceCount = g_cfg.gpu_count;
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *dev)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!dev || index >= g_cfg.gpu_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_lost(index))
        return NVML_ERROR_GPU_IS_LOST;
    *dev = &g_devices[index];
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *dev)
{
    return nvmlDeviceGetHandleByIndex_v2(index, dev);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *dev)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !dev)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!strncmp(uuid, "MIG-", 4))
        return fake_nvml_mig_by_uuid(uuid, dev);
    for (unsigned i = 0; i < g_cfg.gpu_count; i++) {
        if (!strcmp(g_cfg.gpus[i].uuid, uuid)) {
            if (gpu_lost(i))
                return NVML_ERROR_GPU_IS_LOST;
            *dev = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *dev)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !dev)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned dom, bus, d, fn;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &dom, &bus, &d, &fn) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_cfg.gpu_count; i++) {
        const struct fake_gpu_info *g = &g_cfg.gpus[i];
        if (g->pci_domain == dom && g->pci_bus == bus && g->pci_device == d && g->pci_function == fn) {
            if (gpu_lost(i))
                return NVML_ERROR_GPU_IS_LOST;
            *dev = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *dev)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, dev);
}

/* ---- device queries -------------------------------------------------------------------------------------- */

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, index);
    if (r == NVML_SUCCESS && dev->index >= FAKE_GPU_MAX_GPUS)
        r = NVML_ERROR_NOT_SUPPORTED; /* the fake's answer for a MIG device handle */
    if (r == NVML_SUCCESS)
        *index = dev->index;
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device(dev, &g);
    return r != NVML_SUCCESS ? r : copy_string(name, length, g->name);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device(dev, &g);
    return r != NVML_SUCCESS ? r : copy_string(uuid, length, g->uuid);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minorNumber)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, minorNumber);
    if (r == NVML_SUCCESS)
        *minorNumber = g->minor;
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, pci);
    if (r != NVML_SUCCESS)
        return r;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", g->pci_domain & 0xFFFF, g->pci_bus,
             g->pci_device, g->pci_function);
    snprintf(pci->busId, sizeof pci->busId, "%s", g->bus_id);
    pci->domain = g->pci_domain;
    pci->bus = g->pci_bus;
    pci->device = g->pci_device;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = 0x121210DE;
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(dev, pci);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t dev, unsigned int *node)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, node);
    if (r == NVML_SUCCESS && g->numa_node < 0)
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r == NVML_SUCCESS)
        *node = (unsigned)g->numa_node;
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device(dev, &g);
    if (r == NVML_SUCCESS && (!major || !minor))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *major = (int)g->cc_major, *minor = (int)g->cc_minor;
    return r;
}

/* Real NVML answers this for MIG device handles; the fake answers it for whole GPUs too, so tests can read
 * the SM count. Daemon code must not depend on it for whole GPUs. */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t dev, nvmlDeviceAttributes_t *attrs)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, attrs);
    if (r != NVML_SUCCESS)
        return r;
    memset(attrs, 0, sizeof *attrs);
    attrs->multiprocessorCount = g->sms;
    attrs->sharedCopyEngineCount = 8;
    attrs->gpuInstanceSliceCount = 1;
    attrs->computeInstanceSliceCount = 1;
    attrs->memorySizeMB = g->memory_bytes >> 20;
    fake_nvml_mig_attributes(dev->index, attrs);
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t dev, nvmlDeviceAttributes_t *attrs)
{
    return nvmlDeviceGetAttributes_v2(dev, attrs);
}

/* used = what the fake libcuda or the tests wrote, capped so that free never goes negative. */
static void memory_of(nvmlDevice_t dev, const struct fake_gpu_info *g, unsigned long long *total,
                      unsigned long long *reserved, unsigned long long *used)
{
    unsigned long long u = __atomic_load_n(&g_map->state->gpus[slot(dev->index)].mem_used_bytes, __ATOMIC_RELAXED);
    u += fake_nvml_mig_used(dev->index, g_map->state); /* a MIG-enabled GPU: its MIG devices' memory too */
    *total = g->memory_bytes;
    *reserved = g->reserved_bytes;
    if (u > g->memory_bytes - g->reserved_bytes)
        u = g->memory_bytes - g->reserved_bytes;
    *used = u;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, memory);
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long total, reserved, used;
    memory_of(dev, g, &total, &reserved, &used);
    memory->total = total;
    memory->used = used + reserved;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, memory);
    if (r == NVML_SUCCESS && memory->version != nvmlMemory_v2)
        r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (r != NVML_SUCCESS)
        return r;
    unsigned long long total, reserved, used;
    memory_of(dev, g, &total, &reserved, &used);
    memory->total = total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = total - used - reserved;
    return NVML_SUCCESS;
}

static unsigned percent(const uint32_t *p)
{
    unsigned v = __atomic_load_n(p, __ATOMIC_RELAXED);
    return v > 100 ? 100 : v;
}

/* While kernels run on the GPU's simulated timeline (fake_gpu_timeline.h), the busy share of its last sample
 * span; otherwise what a test wrote into util_percent. `gpu` is a state slot. -1 when this process has no
 * identity to take the timeline's lock with (fake_gpu_ident.h). */
static int gpu_utilisation(struct fake_gpu_state *st, unsigned gpu)
{
    struct fake_gpu_timeline *t = &st->timeline[gpu];
    uint64_t last = __atomic_load_n(&t->last_work_ns, __ATOMIC_RELAXED);
    if (last && fake_tl_now_ns() - last < FAKE_GPU_RECENT_WORK_NS) {
        if (fake_tl_update(st, gpu) != 0)
            return -1;
        return (int)percent(&t->util_percent);
    }
    return (int)percent(&st->gpus[gpu].util_percent);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *utilization)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, utilization);
    if (r == NVML_SUCCESS && dev->index >= FAKE_GPU_MAX_GPUS)
        r = NVML_ERROR_NOT_SUPPORTED; /* no utilisation per MIG device */
    if (r != NVML_SUCCESS)
        return r;
    int gpu = gpu_utilisation(g_map->state, slot(dev->index));
    if (gpu < 0)
        return NVML_ERROR_UNKNOWN;
    utilization->gpu = (unsigned)gpu;
    utilization->memory = percent(&g_map->state->gpus[slot(dev->index)].mem_util_percent);
    return NVML_SUCCESS;
}

/* One entry per process context on the GPU whose kernels ran in samples newer than lastSeen: the time-weighted
 * mean of those samples, stamped with the newest; with resident samples (fake_gpu_timeline.h), one entry per
 * sample. */
#define FAKE_TL_MAX_ENTRIES (FAKE_GPU_MAX_PROCS * FAKE_GPU_PROC_SAMPLES)
struct proc_util {
    unsigned pid;
    unsigned long long ts;
    unsigned sm;
};

/* `gpu` is a state slot. How many entries it wrote, or -1 when this process has no identity to take the
 * timeline's lock with. Liveness is asked after the lock is released (it may be a request to the driver
 * socket). */
static int collect_process_util(unsigned gpu, unsigned long long lastSeen, struct proc_util *out)
{
    struct fake_gpu_state *st = g_map->state;
    struct fake_gpu_timeline *t = &st->timeline[gpu];
    int32_t ids[FAKE_TL_MAX_ENTRIES];
    unsigned n = 0;
    int resident = __atomic_load_n(&st->sample_mode, __ATOMIC_RELAXED) == FAKE_GPU_SAMPLES_RESIDENT;
    if (fake_tl_lock(&t->lock) != 0)
        return -1;
    uint64_t now = fake_tl_now_ns();
    fake_tl_advance(st, gpu, now);
    for (unsigned i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        const struct fake_gpu_proc *p = &st->procs[i];
        int32_t pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (!pid || p->gpu != gpu)
            continue;
        unsigned total = p->nsamples, keep = total < FAKE_GPU_PROC_SAMPLES ? total : FAKE_GPU_PROC_SAMPLES;
        unsigned long long weighted = 0, span = 0, newest = 0;
        for (unsigned k = 0; k < keep; k++) {
            const struct fake_gpu_sample *smp = &p->samples[(total - 1 - k) % FAKE_GPU_PROC_SAMPLES];
            if (smp->ts_us <= lastSeen)
                continue;
            if (resident) { /* each sample is its own entry, as the driver that samples this way returns them */
                ids[n] = pid;
                out[n++] = (struct proc_util){p->host_pid, smp->ts_us, smp->sm_util};
                continue;
            }
            weighted += (unsigned long long)smp->sm_util * smp->span_us;
            span += smp->span_us;
            newest = smp->ts_us > newest ? smp->ts_us : newest;
        }
        unsigned sm = span ? (unsigned)((weighted + span / 2) / span) : 0;
        if (sm && !resident) {
            ids[n] = pid;
            out[n++] = (struct proc_util){p->host_pid, newest, sm};
        }
    }
    fake_tl_unlock(&t->lock);
    unsigned alive = 0;
    for (unsigned i = 0; i < n; i++)
        if (fake_tl_alive(ids[i]))
            out[alive++] = out[i];
    return (int)alive;
}

/* FAKE_NVML_PROCESS_UTILIZATION=0: the driver reports no per-process utilisation (vGPU guests, old drivers). */
static int process_utilisation_supported(void)
{
    const char *v = getenv("FAKE_NVML_PROCESS_UTILIZATION");
    return !v || strcmp(v, "0") != 0;
}

/* Real semantics: NULL buffer or too small a count: INSUFFICIENT_SIZE with the count needed; no process with
 * utilisation in samples newer than lastSeenTimeStamp: NOT_FOUND. */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *u,
                                                           unsigned int *count, unsigned long long lastSeen)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, count);
    if (r == NVML_SUCCESS && (!process_utilisation_supported() || dev->index >= FAKE_GPU_MAX_GPUS))
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r != NVML_SUCCESS)
        return r;
    struct proc_util found[FAKE_TL_MAX_ENTRIES];
    int got = collect_process_util(slot(dev->index), lastSeen, found);
    if (got < 0)
        return NVML_ERROR_UNKNOWN;
    unsigned n = (unsigned)got;
    if (!u || *count < n) {
        *count = n ? n : FAKE_GPU_MAX_PROCS;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (!n)
        return NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < n; i++)
        u[i] = (nvmlProcessUtilizationSample_t){.pid = found[i].pid, .timeStamp = found[i].ts, .smUtil = found[i].sm};
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t dev,
                                                                 nvmlProcessesUtilizationInfo_t *info)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, info);
    if (r == NVML_SUCCESS && info->version != nvmlProcessesUtilizationInfo_v1)
        r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (r == NVML_SUCCESS && (!process_utilisation_supported() || dev->index >= FAKE_GPU_MAX_GPUS))
        r = NVML_ERROR_NOT_SUPPORTED;
    if (r != NVML_SUCCESS)
        return r;
    struct proc_util found[FAKE_TL_MAX_ENTRIES];
    int got = collect_process_util(slot(dev->index), info->lastSeenTimeStamp, found);
    if (got < 0)
        return NVML_ERROR_UNKNOWN;
    unsigned n = (unsigned)got;
    if (!info->procUtilArray || info->processSamplesCount < n) {
        info->processSamplesCount = n ? n : FAKE_GPU_MAX_PROCS;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    info->processSamplesCount = n;
    if (!n)
        return NVML_ERROR_NOT_FOUND;
    for (unsigned i = 0; i < n; i++)
        info->procUtilArray[i] = (nvmlProcessUtilizationInfo_v1_t){
            .timeStamp = found[i].ts, .pid = found[i].pid, .smUtil = found[i].sm};
    return NVML_SUCCESS;
}

/* Processes with a context on the GPU, under the pids the host sees (pid + host_pid_offset), with the device
 * memory each holds (the fake libcuda keeps it in the process's entry). */
static nvmlReturn_t list_processes(nvmlDevice_t dev, unsigned int *infoCount, nvmlProcessInfo_t *infos,
                                   nvmlProcessInfo_v1_t *infos_v1)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, infoCount);
    if (r != NVML_SUCCESS)
        return r;
    const struct fake_gpu_state *st = g_map->state;
    unsigned pids[FAKE_GPU_MAX_PROCS], n = 0;
    unsigned long long used[FAKE_GPU_MAX_PROCS];
    for (unsigned i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        const struct fake_gpu_proc *p = &st->procs[i];
        int32_t pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (pid && p->gpu == slot(dev->index) && fake_tl_alive(pid)) {
            used[n] = __atomic_load_n(&p->mem_used_bytes, __ATOMIC_RELAXED);
            pids[n++] = p->host_pid;
        }
    }
    if (*infoCount < n || (n && !infos && !infos_v1)) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = n;
    for (unsigned i = 0; i < n; i++) {
        if (infos)
            infos[i] = (nvmlProcessInfo_t){.pid = pids[i], .usedGpuMemory = used[i],
                                           .gpuInstanceId = 0xFFFFFFFFu, .computeInstanceId = 0xFFFFFFFFu};
        else
            infos_v1[i] = (nvmlProcessInfo_v1_t){.pid = pids[i], .usedGpuMemory = used[i]};
    }
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned int *infoCount,
                                                                nvmlProcessInfo_v1_t *infos)
{
    return list_processes(dev, infoCount, NULL, infos);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned int *infoCount,
                                                                   nvmlProcessInfo_t *infos)
{
    return list_processes(dev, infoCount, infos, NULL);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *infoCount,
                                                                   nvmlProcessInfo_t *infos)
{
    return list_processes(dev, infoCount, infos, NULL);
}

/* The simulated GPU runs no graphics. */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned int *infoCount,
                                                                    nvmlProcessInfo_t *infos)
{
    (void)infos;
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, infoCount);
    if (r == NVML_SUCCESS)
        *infoCount = 0;
    return r;
}

/* ---- events ---------------------------------------------------------------------------------------------- */

static nvmlReturn_t event_set(nvmlEventSet_t set)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVENT_SET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (set->generation != __atomic_load_n(&g_generation, __ATOMIC_RELAXED))
        return NVML_ERROR_UNINITIALIZED; /* made before the last nvmlShutdown */
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_MEMORY;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        free(s);
        return NVML_ERROR_UNINITIALIZED;
    }
    s->magic = EVENT_SET_MAGIC;
    s->generation = g_generation;
    s->map = g_map;
    s->cursor = __atomic_load_n(&g_map->state->event_seq, __ATOMIC_ACQUIRE); /* only events from now on */
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_unlock(&g_lock);
    *set = s;
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t r = event_set(set);
    if (r == NVML_ERROR_UNINITIALIZED && set && set->magic == EVENT_SET_MAGIC)
        r = NVML_SUCCESS; /* freeing a set that outlived its init cycle is fine */
    if (r != NVML_SUCCESS)
        return r;
    set->magic = 0;
    pthread_mutex_destroy(&set->lock);
    free(set);
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *eventTypes)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device_out(dev, &g, eventTypes);
    if (r == NVML_SUCCESS && dev->index >= FAKE_GPU_MAX_GPUS)
        r = NVML_ERROR_NOT_SUPPORTED; /* events are registered on the MIG device's GPU */
    if (r == NVML_SUCCESS)
        *eventTypes = g->events_supported ? SUPPORTED_EVENTS : 0;
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long eventTypes,
                                                    nvmlEventSet_t set)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = device(dev, &g);
    if (r == NVML_SUCCESS)
        r = event_set(set);
    if (r != NVML_SUCCESS)
        return r;
    if (dev->index >= FAKE_GPU_MAX_GPUS || !g->events_supported || (eventTypes & ~(unsigned long long)SUPPORTED_EVENTS))
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&set->lock);
    set->types[dev->index] |= eventTypes;
    pthread_mutex_unlock(&set->lock);
    return NVML_SUCCESS;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Blocks on the state file's futex until an event for a registered (GPU, type) arrives or the timeout passes.
 * A "GPU lost" notice for a registered GPU returns NVML_ERROR_GPU_IS_LOST once. */
static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms, int v2)
{
    nvmlReturn_t r = event_set(set);
    if (r == NVML_SUCCESS && !data)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    struct fake_gpu_state *s = set->map->state;
    long long deadline = now_ns() + (long long)timeoutms * 1000000LL;
    for (;;) {
        pthread_mutex_lock(&set->lock);
        uint32_t published = __atomic_load_n(&s->event_seq, __ATOMIC_ACQUIRE);
        while (set->cursor != published) {
            if (published - set->cursor > FAKE_GPU_EVENT_RING) {
                fprintf(stderr, "fake NVML: an event set fell %u events behind; the oldest were dropped\n",
                        published - set->cursor - FAKE_GPU_EVENT_RING);
                set->cursor = published - FAKE_GPU_EVENT_RING;
            }
            struct fake_gpu_event ev = {0};
            int ok = fake_gpu_state_read_event(s, set->cursor, &ev);
            set->cursor++;
            unsigned index = ok ? index_of_slot(ev.gpu_index) : FAKE_GPU_MAX_GPUS; /* events carry slots */
            if (index >= g_cfg.gpu_count || !set->types[index])
                continue;
            if (ev.event_type == FAKE_GPU_EVENT_GPU_LOST) {
                pthread_mutex_unlock(&set->lock);
                return NVML_ERROR_GPU_IS_LOST;
            }
            if (!(ev.event_type & set->types[index]))
                continue;
            data->device = &g_devices[index];
            data->eventType = ev.event_type;
            data->eventData = ev.event_data;
            if (v2) {
                data->gpuInstanceId = 0xFFFFFFFFu; /* not a MIG device */
                data->computeInstanceId = 0xFFFFFFFFu;
            }
            pthread_mutex_unlock(&set->lock);
            return NVML_SUCCESS;
        }
        pthread_mutex_unlock(&set->lock);
        long long left = deadline - now_ns();
        if (left <= 0)
            return NVML_ERROR_TIMEOUT;
        fake_gpu_state_wait(s, published, left);
        if (set->generation != __atomic_load_n(&g_generation, __ATOMIC_RELAXED) || !initialized())
            return NVML_ERROR_UNINITIALIZED;
    }
}

FAKE_NVML_API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return wait_event(set, data, timeoutms, 1);
}

FAKE_NVML_API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return wait_event(set, data, timeoutms, 0);
}

/* ---- the fake's own entry points, for devplugin/sim/fake_driver.py (prefix fakeNvml_, never in real NVML) --- */

/* Create the state file (or check an existing one). 0, or -1 with the reason in err. */
FAKE_NVML_API int fakeNvml_initState(const char *statePath, unsigned int gpuCount, char *err, unsigned int errlen)
{
    char buf[1024];
    struct fake_gpu_state *s = fake_gpu_state_map(statePath, 1, buf, sizeof buf);
    if (!s) {
        if (err && errlen)
            snprintf(err, errlen, "%s", buf);
        return -1;
    }
    __atomic_store_n(&s->gpu_count, gpuCount, __ATOMIC_RELAXED);
    munmap(s, sizeof *s);
    return 0;
}

/* Publish an event (XID: eventType 0x8, eventData = XID) for GPU gpuIndex (its slot in the state file, i.e. its
 * node index) to every waiter; each process sees it under its own config's index of that GPU. 0 or -errno. */
FAKE_NVML_API int fakeNvml_postEvent(const char *statePath, unsigned int gpuIndex, unsigned long long eventType,
                                     unsigned long long eventData)
{
    return fake_gpu_state_post_event(statePath, gpuIndex, eventType, eventData);
}

/* Kernel time each process context on GPU gpuIndex (a state slot) has run so far (settled to now), for tests and benches that
 * measure the share each process got. Fills up to n entries; returns how many there are, or -errno. */
FAKE_NVML_API int fakeNvml_processTimes(const char *statePath, unsigned int gpuIndex, unsigned int *pids,
                                        unsigned int *hostPids, unsigned long long *busyNs, int n)
{
    if (gpuIndex >= FAKE_GPU_MAX_GPUS)
        return -EINVAL;
    char err[1024];
    struct fake_gpu_state *s = fake_gpu_state_map(statePath, 0, err, sizeof err);
    if (!s)
        return -ENOENT;
    if (fake_tl_update(s, gpuIndex) != 0) {
        munmap(s, sizeof *s);
        return -EIO;
    }
    int count = 0;
    for (unsigned i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        const struct fake_gpu_proc *p = &s->procs[i];
        int32_t pid = __atomic_load_n(&p->pid, __ATOMIC_ACQUIRE);
        if (!pid || p->gpu != gpuIndex)
            continue;
        if (count < n) {
            pids[count] = (unsigned)pid;
            hostPids[count] = p->host_pid;
            busyNs[count] = __atomic_load_n(&p->busy_ns, __ATOMIC_RELAXED);
        }
        count++;
    }
    munmap(s, sizeof *s);
    return count;
}

/* What nvmlDeviceGetUtilizationRates reports for GPU gpuIndex (a state slot) now (percent), or -errno. */
FAKE_NVML_API int fakeNvml_utilization(const char *statePath, unsigned int gpuIndex)
{
    if (gpuIndex >= FAKE_GPU_MAX_GPUS)
        return -EINVAL;
    char err[1024];
    struct fake_gpu_state *s = fake_gpu_state_map(statePath, 0, err, sizeof err);
    if (!s)
        return -ENOENT;
    int util = gpu_utilisation(s, gpuIndex);
    munmap(s, sizeof *s);
    return util < 0 ? -EIO : util;
}

/* How many nvmlInit calls are not yet matched by nvmlShutdown (tests check that code pairs them). */
FAKE_NVML_API int fakeNvml_refcount(void)
{
    return __atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE);
}

/* The state file layout as compiled, for the ctypes mirror's self-check. Returns how many values it wrote. */
FAKE_NVML_API int fakeNvml_stateLayout(unsigned long long *out, int n)
{
    const unsigned long long v[] = {
        sizeof(struct fake_gpu_state),
        offsetof(struct fake_gpu_state, event_seq),
        offsetof(struct fake_gpu_state, instance),
        offsetof(struct fake_gpu_state, gpus),
        sizeof(struct fake_gpu_slot),
        offsetof(struct fake_gpu_slot, lost),
        offsetof(struct fake_gpu_slot, util_percent),
        offsetof(struct fake_gpu_slot, mem_used_bytes),
        offsetof(struct fake_gpu_slot, mem_util_percent),
        offsetof(struct fake_gpu_state, events),
        sizeof(struct fake_gpu_event),
        FAKE_GPU_MAX_GPUS,
        FAKE_GPU_EVENT_RING,
        FAKE_GPU_STATE_MAGIC,
        FAKE_GPU_STATE_VERSION,
        offsetof(struct fake_gpu_state, host_pid_offset),
        offsetof(struct fake_gpu_state, sample_period_ms),
        offsetof(struct fake_gpu_state, timeline),
        sizeof(struct fake_gpu_timeline),
        offsetof(struct fake_gpu_state, procs),
        sizeof(struct fake_gpu_proc),
        offsetof(struct fake_gpu_proc, host_pid),
        offsetof(struct fake_gpu_proc, busy_ns),
        offsetof(struct fake_gpu_state, sample_mode),
    };
    int count = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < n && i < count; i++)
        out[i] = v[i];
    return count;
}

/* --- fabric: the fake GPUs have none (PyTorch looks this up on an out-of-memory error and with expandable
 * segments, and asserts it exists). NVLink and the PCIe topology: nvml_topology.c ----------------------------- */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, void *info)
{
    (void)dev, (void)info;
    return NVML_ERROR_NOT_SUPPORTED;
}
