/* Initialisation at the first intercepted call (never at load time: the library is preloaded into every
 * process of the container, most of which never touch a GPU), fork handling and exit. */
#include <pthread.h>
#include <stdio.h>

#include "gs_log.h"
#include "gs_region.h"
#include "gs_shim.h"
#include "gs_throttle.h"

int gs_state = GS_STATE_NEW;

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;

static void child_after_fork(void)
{
    gs_region_after_fork_child();
    gs_devices_after_fork_child();
    gs_memory_after_fork_child();
    gs_throttle_after_fork_child();
}

static void load_config(void)
{
    gs_log_init();
    gs_config_load();
    pthread_atfork(NULL, NULL, child_after_fork);
}

void gs_config_once(void)
{
    pthread_once(&config_once, load_config);
}

static int driver_loaded;

static void load_cuda(void)
{
    gs_config_once();
    driver_loaded = gs_real_load_cuda() == 0;
    int state = gs_cfg.refused ? GS_STATE_REFUSED : driver_loaded ? GS_STATE_READY : GS_STATE_NO_DRIVER;
    __atomic_store_n(&gs_state, state, __ATOMIC_RELEASE);
}

CUresult gs_enter_lookup(void)
{
    pthread_once(&cuda_once, load_cuda);
    return driver_loaded ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult gs_enter_slow(void)
{
    pthread_once(&cuda_once, load_cuda);
    switch (__atomic_load_n(&gs_state, __ATOMIC_ACQUIRE)) {
    case GS_STATE_READY:
        return CUDA_SUCCESS;
    case GS_STATE_REFUSED:
        return CUDA_ERROR_NOT_PERMITTED;
    default:
        return CUDA_ERROR_NOT_INITIALIZED;
    }
}

void gs_refuse(const char *why)
{
    GS_ERROR("refusing CUDA in this process: %s", why);
    __atomic_store_n(&gs_state, GS_STATE_REFUSED, __ATOMIC_RELEASE);
}

/* A process that ends normally gives its slot back at once; one that is killed is reaped by the others. */
__attribute__((destructor)) static void at_exit(void)
{
    gs_region_detach();
}
