/* Fake NVML: MIG mode and MIG devices (the config's mig= / mig_pending= keys and `mig` lines, fake_gpu_mig.h).
 *
 * A MIG device handle answers the device queries of nvml.c as a device of its own (UUID MIG-..., its memory, its
 * SMs, "<GPU name> MIG <profile>", its own state slot: memory used, processes); its GPU's PCI location and minor.
 * Utilisation and events are not reported per MIG device (NOT_SUPPORTED), as on the real driver; a MIG device
 * is lost with its GPU. Return codes follow nvml.h's documentation of each call.
 *
 * An operator changes MIG modes and instances while the driver runs; so can a test: a config rewritten while
 * NVML is initialised is read again at the next MIG call (nvmlDeviceGetMigMode, ...GetMaxMigDeviceCount,
 * ...GetMigDeviceHandleByIndex), and its GPUs' MIG modes and MIG devices replace the old ones when it still
 * lists the same GPUs. Everything else is read at nvmlInit only.
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "fake_gpu_config.h"
#include "nvml/fake_nvml.h"
#include "nvml/nvml_internal.h"

#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1

static struct fake_gpu_info g_mig[FAKE_GPU_MAX_MIGS]; /* written at init and when the layout is read again */
static pthread_mutex_t g_refresh_lock = PTHREAD_MUTEX_INITIALIZER;
static struct timespec g_loaded_mtime;                 /* the config as last read, under g_refresh_lock */
static off_t g_loaded_size;
static ino_t g_loaded_ino;

static int config_stat(struct stat *st)
{
    const char *path = getenv(FAKE_GPU_CONFIG_ENV);
    return path && *path ? stat(path, st) : -1;
}

static void refresh(void);

void fake_nvml_mig_load(const struct fake_gpu_config *cfg)
{
    for (unsigned k = 0; k < cfg->mig_count; k++)
        fake_mig_as_gpu(cfg, k, &g_mig[k]);
    struct stat st;
    if (cfg != fake_nvml_config() || config_stat(&st) != 0)
        return;
    g_loaded_mtime = st.st_mtim, g_loaded_size = st.st_size, g_loaded_ino = st.st_ino;
}

/* Read the config again when it changed since it was read (see the top of this file). */
static void refresh(void)
{
    struct stat st;
    if (config_stat(&st) != 0)
        return;
    pthread_mutex_lock(&g_refresh_lock);
    if (st.st_mtim.tv_sec != g_loaded_mtime.tv_sec || st.st_mtim.tv_nsec != g_loaded_mtime.tv_nsec ||
        st.st_size != g_loaded_size || st.st_ino != g_loaded_ino) {
        static struct fake_gpu_config fresh; /* under g_refresh_lock */
        char err[1024];
        g_loaded_mtime = st.st_mtim, g_loaded_size = st.st_size, g_loaded_ino = st.st_ino;
        if (fake_gpu_config_load(getenv(FAKE_GPU_CONFIG_ENV), &fresh, err, sizeof err) != 0)
            fprintf(stderr, "fake NVML: the rewritten config is not read: %s\n", err);
        else if (!fake_nvml_take_mig_layout(&fresh))
            fprintf(stderr, "fake NVML: the rewritten config lists other GPUs; only its MIG layout would be read "
                            "without nvmlInit, so nothing was taken\n");
    }
    pthread_mutex_unlock(&g_refresh_lock);
}

const struct fake_gpu_info *fake_nvml_mig_info(unsigned k)
{
    return &g_mig[k];
}

/* The config index of a GPU handle's GPU, or -1 for a MIG device handle (after fake_nvml_device succeeded). */
static int gpu_index(const struct fake_gpu_info *g)
{
    const struct fake_gpu_config *cfg = fake_nvml_config();
    return g >= cfg->gpus && g < cfg->gpus + cfg->gpu_count ? (int)(g - cfg->gpus) : -1;
}

/* The MIG line of a MIG device handle, or -1 for a GPU handle (after fake_nvml_device succeeded). */
static int mig_index(const struct fake_gpu_info *g)
{
    return g >= g_mig && g < g_mig + FAKE_GPU_MAX_MIGS ? (int)(g - g_mig) : -1;
}

nvmlReturn_t fake_nvml_mig_by_uuid(const char *uuid, nvmlDevice_t *dev)
{
    refresh();
    const struct fake_gpu_config *cfg = fake_nvml_config();
    for (unsigned k = 0; k < cfg->mig_count; k++) {
        if (strcmp(cfg->migs[k].uuid, uuid))
            continue;
        const struct fake_gpu_info *g;
        nvmlReturn_t r = fake_nvml_device(fake_nvml_handle(FAKE_GPU_MAX_GPUS + k), &g);
        if (r == NVML_SUCCESS)
            *dev = fake_nvml_handle(FAKE_GPU_MAX_GPUS + k);
        return r;
    }
    return NVML_ERROR_NOT_FOUND;
}

void fake_nvml_mig_attributes(unsigned index, nvmlDeviceAttributes_t *attrs)
{
    if (index < FAKE_GPU_MAX_GPUS)
        return;
    unsigned gi, ci;
    fake_mig_slices(fake_nvml_config()->migs[index - FAKE_GPU_MAX_GPUS].profile, &gi, &ci);
    attrs->gpuInstanceSliceCount = gi;
    attrs->computeInstanceSliceCount = ci;
    attrs->sharedCopyEngineCount = gi;
    attrs->sharedDecoderCount = gi;
    attrs->sharedJpegCount = gi;
}

unsigned long long fake_nvml_mig_used(unsigned index, const struct fake_gpu_state *st)
{
    const struct fake_gpu_config *cfg = fake_nvml_config();
    unsigned long long used = 0;
    if (index >= FAKE_GPU_MAX_GPUS)
        return 0;
    for (unsigned k = 0; k < cfg->mig_count; k++)
        if (cfg->migs[k].parent == index)
            used += __atomic_load_n(&st->gpus[cfg->migs[k].slot].mem_used_bytes, __ATOMIC_RELAXED);
    return used;
}

/* ---- NVML's MIG calls ------------------------------------------------------------------------------------ */

/* A GPU (not MIG device) handle that supports MIG: its config entry and index. */
static nvmlReturn_t mig_capable(nvmlDevice_t dev, const struct fake_gpu_info **g, int *index)
{
    refresh();
    nvmlReturn_t r = fake_nvml_device(dev, g);
    if (r != NVML_SUCCESS)
        return r;
    if ((*index = gpu_index(*g)) < 0)
        return NVML_ERROR_INVALID_ARGUMENT; /* a MIG device handle has no MIG mode of its own */
    return (*g)->mig_current < 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *currentMode, unsigned int *pendingMode)
{
    const struct fake_gpu_info *g;
    int index;
    nvmlReturn_t r = mig_capable(dev, &g, &index);
    if (r == NVML_SUCCESS && (!currentMode || !pendingMode))
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    *currentMode = g->mig_current ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    *pendingMode = g->mig_pending ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

/* "The maximum number of MIG devices that can exist under a given parent NVML device": 0 while MIG is disabled. */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count)
{
    const struct fake_gpu_info *g;
    int index;
    nvmlReturn_t r = mig_capable(dev, &g, &index);
    if (r == NVML_SUCCESS && !count)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *count = g->mig_current == 1 ? FAKE_GPU_MIG_PER_GPU : 0;
    return r;
}

/* Index 0.. of the GPU's MIG devices (its `mig` lines in order): INVALID_ARGUMENT past the most there can be,
 * NOT_FOUND for an index with no MIG device. */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index,
                                                               nvmlDevice_t *migDevice)
{
    const struct fake_gpu_info *g;
    int parent;
    nvmlReturn_t r = mig_capable(dev, &g, &parent);
    if (r != NVML_SUCCESS)
        return r;
    if (!migDevice || g->mig_current != 1 || index >= FAKE_GPU_MIG_PER_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct fake_gpu_config *cfg = fake_nvml_config();
    unsigned seen = 0;
    for (unsigned k = 0; k < cfg->mig_count; k++) {
        if (cfg->migs[k].parent != (unsigned)parent)
            continue;
        if (seen++ == index) {
            *migDevice = fake_nvml_handle(FAKE_GPU_MAX_GPUS + k);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *isMigDevice)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = fake_nvml_device(dev, &g);
    if (r == NVML_SUCCESS && !isMigDevice)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *isMigDevice = mig_index(g) >= 0;
    return r;
}

/* The MIG line of a MIG device handle; INVALID_ARGUMENT for a GPU handle or a NULL output. */
static nvmlReturn_t mig_of(nvmlDevice_t dev, const void *out, const struct fake_mig_info **m)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = fake_nvml_device(dev, &g);
    if (r != NVML_SUCCESS)
        return r;
    int k = mig_index(g);
    if (k < 0 || !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *m = &fake_nvml_config()->migs[k];
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    const struct fake_mig_info *m;
    nvmlReturn_t r = mig_of(migDevice, device, &m);
    if (r == NVML_SUCCESS)
        *device = fake_nvml_handle(m->parent);
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id)
{
    const struct fake_mig_info *m;
    nvmlReturn_t r = mig_of(dev, id, &m);
    if (r == NVML_SUCCESS)
        *id = m->gi;
    return r;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id)
{
    const struct fake_mig_info *m;
    nvmlReturn_t r = mig_of(dev, id, &m);
    if (r == NVML_SUCCESS)
        *id = m->ci;
    return r;
}
