/* The shape every memory hook shares (gs_memory, gs_arrays, gs_ipc, gs_modules, gs_graphmem): find the GPU the
 * allocation goes to, reserve what the driver will really take, call the driver, keep or roll back. Nothing
 * is ever left untracked: an unknown current device returns the driver's error without allocating, and an
 * allocation the shim cannot record is freed again and reported out of memory. */
#ifndef GS_ALLOC_H
#define GS_ALLOC_H

#include "gs_shim.h"

/* The GPU an allocation of the calling thread goes to (its current context's): CUDA_SUCCESS with *d, where
 * -1 means nothing is accounted (call the driver as is), or the error to return without allocating. */
static inline CUresult gs_alloc_target(int *d)
{
    *d = -1;
    if (GS_UNLIKELY(!gs_devices_ready()) || !gs_any_limit)
        return CUDA_SUCCESS; /* not ready: the driver is not initialised, and will say so itself */
    return gs_current_device(d);
}

/* Reserve `charge` on d, run `call` (a CUresult expression), keep the charge under `key` in `map` or roll it
 * back; when the allocation cannot be recorded, run `undo` (free what the driver gave) and answer out of
 * memory. `key` is evaluated only after a successful call. */
#define GS_TRACKED(d, charge, map, call, key, undo)                                   \
    do {                                                                            \
        int tracked_;                                                               \
        CUresult rc_ = gs_alloc_begin((d), (charge), &tracked_);                    \
        if (rc_)                                                                    \
            return rc_;                                                             \
        rc_ = (call);                                                               \
        if (gs_alloc_end(rc_, tracked_, (d), (charge), (map), rc_ ? 0 : (uint64_t)(key))) { \
            undo;                                                                   \
            return CUDA_ERROR_OUT_OF_MEMORY;                                        \
        }                                                                           \
        return rc_;                                                                 \
    } while (0)

/* A free: take key's entry out of map, call the driver, give back or restore. */
#define GS_UNTRACK(map, key, call)                           \
    do {                                                     \
        struct gs_ptr_entry e_;                              \
        int had_ = gs_free_begin((map), (uint64_t)(key), &e_); \
        CUresult rc_ = (call);                               \
        gs_free_end(rc_, had_, (map), &e_);                  \
        return rc_;                                          \
    } while (0)

#endif /* GS_ALLOC_H */
