/* State shared by the shim's hooks: initialisation, the per-process device table, memory accounting helpers. */
#ifndef GS_SHIM_H
#define GS_SHIM_H

#include "gs_config.h"
#include "gs_cuda_types.h"
#include "gs_ptrmap.h"
#include "gs_real.h"

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

struct gs_dev {
    char uuid[GS_UUID_LEN];
    int blocked;         /* the limits file does not list this GPU: it must not be used */
    uint64_t limit;      /* bytes, 0 = no memory limit */
    uint64_t phys_total; /* the GPU's real memory */
    int sm_limit;        /* 1..100 */
    int rd;              /* index in the accounting file */
    int ctx_charged;     /* this process's context on the GPU has been charged */
};

extern struct gs_dev gs_devs[GS_MAX_DEVICES];
extern int gs_ndevs;      /* CUDA devices this process sees (table filled), 0 before cuInit */
extern int gs_any_limit;  /* any device has a memory limit or is blocked: allocations are accounted */

/* Fill the device table once the driver is initialised. 0 when ready, -1 when the driver is not. */
int gs_devices_setup(void);
static inline int gs_devices_ready(void)
{
    return GS_LIKELY(__atomic_load_n(&gs_ndevs, __ATOMIC_ACQUIRE) > 0) || gs_devices_setup() == 0;
}
/* CUDA ordinal of the calling thread's current context. CUDA_SUCCESS, or the driver's error. */
CUresult gs_current_device(int *d);

/* Charge this process's context on GPU d (once). CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY or NOT_PERMITTED;
 * *charged_now tells whether this call took the charge (to undo it when the context is not created). */
CUresult gs_ctx_charge(int d, int *charged_now);
void gs_ctx_uncharge(int d);

/* Before an allocation of bytes on GPU d: CUDA_SUCCESS with *tracked (the bytes were reserved), or the error. */
CUresult gs_alloc_begin(int d, uint64_t bytes, int *tracked);
/* After the real allocation: keep the reservation under key on success, give it back on failure. */
void gs_alloc_end(CUresult rc, int tracked, int d, uint64_t bytes, struct gs_ptrmap *map, uint64_t key);
/* Give back bytes reserved on GPU d that no allocation kept. */
void gs_alloc_undo(int d, uint64_t bytes);
/* Before a free: take key's reservation out of the map (so a reused address cannot collide). */
int gs_free_begin(struct gs_ptrmap *map, uint64_t key, struct gs_ptr_entry *e);
/* After the real free: give the bytes back on success, restore the entry on failure. */
void gs_free_end(CUresult rc, int had, struct gs_ptrmap *map, const struct gs_ptr_entry *e);

/* In a forked child: the parent's locks, allocations and context charges are not the child's. */
void gs_devices_after_fork_child(void);
void gs_memory_after_fork_child(void);

extern struct gs_ptrmap gs_pointers; /* device pointers */
extern struct gs_ptrmap gs_handles;  /* cuMemCreate handles */

#endif /* GS_SHIM_H */
