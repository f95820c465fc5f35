/* The fake driver's device memory, shared by its allocation entry points (fake_cuda_memory.c, arrays, IPC,
 * modules): every object that takes device memory is an entry keyed by its address or handle. Device memory is
 * taken in steps of FAKE_CUDA_GRANULARITY, as the real driver takes it in pages of its allocation granularity. */
#ifndef FAKE_CUDA_MEM_H
#define FAKE_CUDA_MEM_H

#include "fake_cuda_api.h"

#pragma GCC visibility push(hidden)

#define FAKE_CUDA_GRANULARITY (2ULL << 20) /* cuMemGetAllocationGranularity, and what allocations round to */

/* Take `bytes` (rounded up to the granularity) on dev (-1: host memory, not charged) under a new address.
 * low: an address below 4 GiB (the 32-bit cuMemAlloc). */
CUresult fake_mem_alloc(uint64_t *addr, uint64_t bytes, int dev, int low);
/* Stream-ordered memory pools (fake_cuda_pools.c): where they are, their attributes, the bytes they hold. */
struct fake_pool {
    CUmemLocation location;
    uint64_t attr[16]; /* cuMemPoolSetAttribute values, by CUmemPool_attribute */
    uint64_t used, used_high;
    int is_default;
};
CUresult fake_mem_alloc_pool(uint64_t *addr, uint64_t bytes, int dev, int low, struct fake_pool *pool);
void fake_pool_account(struct fake_pool *pool, int64_t bytes);
struct fake_pool *fake_pool_current(int dev);
/* 1 when addr lies in the fake's device address range; fake_mem_backed(): that range holds real bytes. */
int fake_mem_is_device(uint64_t addr);
int fake_mem_backed(void);
/* Free the entry at addr: CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE when there is none. */
CUresult fake_mem_free(uint64_t addr);
/* The entry at addr: its size (as rounded) and device. 0 when there is none. */
int fake_mem_lookup(uint64_t addr, uint64_t *bytes, int *dev);
/* A new address range of `bytes` that maps memory some entry already owns (no device memory taken). */
uint64_t fake_mem_new_address(uint64_t bytes);

/* Wait until every host function this process queued (cuLaunchHostFunc) has run (cuCtxSynchronize). */
void fake_host_calls_wait(void);

#pragma GCC visibility pop

#endif /* FAKE_CUDA_MEM_H */
