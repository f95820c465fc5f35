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

/* Into d, the GPU an allocation of the calling thread goes to; return the driver's own answer to `call` when
 * nothing is accounted there (or `out`, where the driver writes the handle, is NULL), or the error to return
 * without allocating. */
#define GS_ALLOC_TARGET(d, out, call)           \
    do {                                        \
        CUresult t_ = gs_alloc_target(&(d));    \
        if (t_)                                 \
            return t_;                          \
        if ((d) < 0 || !(out))                  \
            return (call);                      \
    } while (0)

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

/* An allocation on the calling thread's GPU of `bytes` (rounded to its granularity), kept in `map` under the
 * handle `call` writes to *out; `undo` frees it again. */
#define GS_ALLOC_CURRENT(map, bytes, call, out, undo)                                               \
    do {                                                                                            \
        int d_;                                                                                     \
        GS_ALLOC_TARGET(d_, (out), (call));                                                         \
        GS_TRACKED(d_, gs_charge_size(d_, (bytes)), (map), (call), (uintptr_t) * (out), undo);      \
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
