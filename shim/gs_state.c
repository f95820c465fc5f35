/* Initialisation at the first intercepted call (never at load time: the library is preloaded into every
 * process of the container, most of which never touch a GPU), and refusal. */
#include "gs_state.h"

#include "gs_config.h"
#include "gs_log.h"
#include "gs_real.h"

int gs_state = GS_STATE_NEW;

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static int driver_loaded;

static void load_config(void)
{
    gs_log_init();
    gs_config_load();
}

void gs_config_once(void)
{
    pthread_once(&config_once, load_config);
}

static void load_cuda(void)
{
    gs_config_once();
    driver_loaded = gs_real_load_cuda() == 0;
    int state = gs_cfg.refused ? GS_STATE_REFUSED : driver_loaded ? GS_STATE_READY : GS_STATE_NO_DRIVER;
    /* A refusal that came first (another thread) stands. */
    int expected = GS_STATE_NEW;
    __atomic_compare_exchange_n(&gs_state, &expected, state, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
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
