/* Memory accounting around each allocation: reserve first, allocate, then keep or roll back; give back on free.
 * Above gs_devices and gs_region; used by the memory and context hooks. */
#ifndef GS_ACCOUNT_H
#define GS_ACCOUNT_H

#include "gs_devices.h"
#include "gs_ptrmap.h"

extern struct gs_ptrmap gs_pointers; /* device pointers, arrays, imported IPC memory */

/* Round bytes up to GPU d's allocation granularity (what the driver really reserves). */
uint64_t gs_charge_size(int d, uint64_t bytes);

/* Charge this process's context on GPU d (once). CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY or NOT_PERMITTED;
 * *charged_now tells whether this call took the charge (to undo it when the context is not created). */
CUresult gs_ctx_charge(int d, int *charged_now);
void gs_ctx_uncharge(int d);

/* Before an allocation of bytes on GPU d: CUDA_SUCCESS with *tracked (the bytes were reserved), or the error. */
CUresult gs_alloc_begin(int d, uint64_t bytes, int *tracked);
/* After the real allocation: keep the reservation under key on success, give it back on failure. Returns
 * CUDA_SUCCESS, or CUDA_ERROR_OUT_OF_MEMORY when the allocation cannot be tracked (host memory ran out): the
 * reservation is then given back and the caller must free what the driver allocated. */
CUresult gs_alloc_end(CUresult rc, int tracked, int d, uint64_t bytes, struct gs_ptrmap *map, uint64_t key);
/* Give back bytes reserved on GPU d that no allocation kept. */
void gs_alloc_undo(int d, uint64_t bytes);
/* Before a free: take key's reservation out of the map (so a reused address cannot collide). */
int gs_free_begin(struct gs_ptrmap *map, uint64_t key, struct gs_ptr_entry *e);
/* After the real free: give the bytes back on success, restore the entry on failure. */
void gs_free_end(CUresult rc, int had, struct gs_ptrmap *map, const struct gs_ptr_entry *e);
/* Give back an entry's bytes (a free that completed later, in stream order); for an allocation from a stream-ordered
 * pool, what the pool does not keep (gs_poolcache.h). */
void gs_free_entry(const struct gs_ptr_entry *e);

/* An allocation of `bytes` on GPU d from stream-ordered pool `pool` (a gs_poolcache id, 0 = not known): what the
 * pool keeps covers *reused of it, the rest is reserved. Then, after the driver's answer, as gs_alloc_end (the
 * entry remembers its pool). */
CUresult gs_pool_alloc_begin(int d, int pool, uint64_t bytes, uint64_t *reused, int *tracked);
CUresult gs_pool_alloc_end(CUresult rc, int tracked, int d, int pool, uint64_t bytes, uint64_t reused,
                           struct gs_ptrmap *map, uint64_t key);

#endif /* GS_ACCOUNT_H */
