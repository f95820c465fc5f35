/* The bottom of the shim: whether this process may use CUDA, how every hook enters, and refusal. Depends only
 * on the configuration, the real driver's loader and the log; every other unit may use it, it uses none. */
#ifndef GS_STATE_H
#define GS_STATE_H

#include <pthread.h>

#include "gs_cuda_types.h"

#define GS_EXPORT __attribute__((visibility("default")))
#define GS_LIKELY(x) __builtin_expect(!!(x), 1)
#define GS_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum gs_state { GS_STATE_NEW = 0, GS_STATE_READY, GS_STATE_REFUSED, GS_STATE_NO_DRIVER };
extern int gs_state;

CUresult gs_enter_slow(void);
/* Every CUDA hook starts here: CUDA_SUCCESS to go on, else the error to return. One load when ready. */
static inline CUresult gs_enter(void)
{
    if (GS_LIKELY(__atomic_load_n(&gs_state, __ATOMIC_ACQUIRE) == GS_STATE_READY))
        return CUDA_SUCCESS;
    return gs_enter_slow();
}
/* cuGetProcAddress answers even when CUDA is refused (the calls it hands out then fail one by one, so the
 * application reports the refusal from cuInit). CUDA_SUCCESS when the real driver is loaded. */
CUresult gs_enter_lookup(void);
/* Read the configuration once (NVML hooks need it without the CUDA driver). */
void gs_config_once(void);
/* Stop all CUDA use in this process with a message (a limit cannot be applied). */
void gs_refuse(const char *why);

/* Each unit that keeps locks or per-process state registers what a forked child must reset, itself:
 *     GS_ON_FORK_CHILD(my_child_handler)
 * (a constructor that only registers the handler; nothing else happens at load time). */
#define GS_ON_FORK_CHILD(fn)                                                     \
    __attribute__((constructor)) static void gs_register_fork_child_##fn(void) \
    {                                                                            \
        pthread_atfork(NULL, NULL, fn);                                          \
    }

#endif /* GS_STATE_H */
