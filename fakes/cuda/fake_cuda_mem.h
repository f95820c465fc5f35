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
    uint64_t cached;   /* freed memory the pool keeps (up to its release threshold), still taken on the GPU */
    int is_default;
    struct fake_pool *next; /* the pools this process created */
};
CUresult fake_mem_alloc_pool(uint64_t *addr, uint64_t bytes, int dev, int low, struct fake_pool *pool);
void fake_pool_account(struct fake_pool *pool, int64_t bytes);
struct fake_pool *fake_pool_current(int dev);
/* Take up to `bytes` of what the pool keeps for a new allocation: the bytes it covers (no new memory taken). */
uint64_t fake_pool_reuse(struct fake_pool *pool, uint64_t bytes);
/* Give bytes that fake_pool_reuse handed out back to the pool's keep (the allocation failed). */
void fake_pool_keep(struct fake_pool *pool, uint64_t bytes);
/* `bytes` of the pool's were freed (after fake_pool_account): the pool keeps what its release threshold
 * allows; returns what must go back to the GPU. */
uint64_t fake_pool_release(struct fake_pool *pool, uint64_t bytes);
/* 1 when addr lies in the fake's device address range; fake_mem_backed(): that range holds real bytes. */
int fake_mem_is_device(uint64_t addr);
int fake_mem_backed(void);
/* Give back device memory on the GPU alone (fake_mem_give also takes it off this process's NVML figure). */
void fake_mem_give_gpu(int dev, uint64_t bytes);
/* cuMemCreate handles (fake_cuda_handles.c): 1 and the size and device of a handle that is not released; take
 * or drop handle references and mappings (the allocation goes when both are 0): CUDA_ERROR_INVALID_VALUE for an
 * unknown or released handle. */
int fake_handle_lookup(uint64_t handle, uint64_t *bytes, int *dev);
CUresult fake_handle_hold(uint64_t handle, int refs, int maps);
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
