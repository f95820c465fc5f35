/* Fake driver: device memory. Allocations hand out made-up addresses and take the bytes, rounded up to the
 * allocation granularity as the real driver takes them, from the simulated GPU's shared `mem_used_bytes`, so
 * every process on the fake node sees the same free memory. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fake_cuda_mem.h"

#define PITCH_ALIGN 512

enum kind { K_DEVICE = 1, K_HOST = 2 };

struct entry {
    uint64_t key; /* 0 = empty */
    uint64_t bytes;
    int dev;      /* CUDA ordinal charged, -1 for host memory */
    struct fake_pool *pool; /* the stream-ordered pool it came from, or NULL */
};

static struct {
    pthread_mutex_t lock;
    struct entry *slots;
    size_t cap, count;
} map = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static uint64_t next_address = 0x7f0000000000ULL; /* when no address range could be reserved */
static uint64_t next_low_address = 0x10000000ULL; /* 32-bit device pointers (cuMemAlloc v1) */


static size_t slot_of(uint64_t key, size_t cap)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 20) & (cap - 1);
}

static int map_grow(void)
{
    size_t cap = map.cap ? map.cap * 2 : 1024;
    struct entry *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return -1;
    for (size_t i = 0; i < map.cap; i++) {
        if (!map.slots[i].key)
            continue;
        size_t j = slot_of(map.slots[i].key, cap);
        while (slots[j].key)
            j = (j + 1) & (cap - 1);
        slots[j] = map.slots[i];
    }
    free(map.slots);
    map.slots = slots;
    map.cap = cap;
    return 0;
}

static int map_put_pool(uint64_t key, uint64_t bytes, int dev, struct fake_pool *pool)
{
    pthread_mutex_lock(&map.lock);
    int rc = 0;
    if ((map.count + 1) * 2 > map.cap && map_grow()) {
        rc = -1;
    } else {
        size_t i = slot_of(key, map.cap);
        while (map.slots[i].key)
            i = (i + 1) & (map.cap - 1);
        map.slots[i] = (struct entry){key, bytes, dev, pool};
        map.count++;
    }
    pthread_mutex_unlock(&map.lock);
    return rc;
}

/* The slot holding key, or SIZE_MAX; with map.lock held. */
static size_t map_find(uint64_t key)
{
    if (!map.cap)
        return SIZE_MAX;
    size_t i = slot_of(key, map.cap);
    while (map.slots[i].key && map.slots[i].key != key)
        i = (i + 1) & (map.cap - 1);
    return map.slots[i].key == key ? i : SIZE_MAX;
}

/* Remove key; 1 and *out when it was there. Backward-shift deletion keeps probe chains whole. */
static int map_take(uint64_t key, struct entry *out)
{
    pthread_mutex_lock(&map.lock);
    size_t i = map_find(key);
    if (i != SIZE_MAX) {
        *out = map.slots[i];
        map.count--;
        size_t hole = i;
        for (size_t j = (i + 1) & (map.cap - 1); map.slots[j].key; j = (j + 1) & (map.cap - 1)) {
            size_t home = slot_of(map.slots[j].key, map.cap);
            if (((j - home) & (map.cap - 1)) >= ((j - hole) & (map.cap - 1))) {
                map.slots[hole] = map.slots[j];
                hole = j;
            }
        }
        map.slots[hole].key = 0;
    }
    pthread_mutex_unlock(&map.lock);
    return i != SIZE_MAX;
}

static void child_after_fork(void)
{
    pthread_mutex_init(&map.lock, NULL);
    free(map.slots);
    map.slots = NULL;
    map.cap = map.count = 0;
    __atomic_store_n(&fake_counters.live_bytes, 0, __ATOMIC_RELAXED);
}

FAKE_ON_FORK_CHILD(child_after_fork)

/* A process that ends gives its memory back, as the real driver does (a killed one keeps it charged in the
 * state file: tests that kill processes size the fake GPU for that). */
__attribute__((destructor)) static void release_all(void)
{
    if (!fake_state)
        return;
    pthread_mutex_lock(&map.lock);
    for (size_t i = 0; i < map.cap; i++)
        if (map.slots[i].key && map.slots[i].dev >= 0)
            fake_mem_give(map.slots[i].dev, map.slots[i].bytes);
    map.count = 0;
    if (map.slots)
        memset(map.slots, 0, map.cap * sizeof *map.slots);
    pthread_mutex_unlock(&map.lock);
}

CUresult fake_mem_take(int dev, uint64_t bytes)
{
    const struct fake_gpu_info *g = &fake_devices[dev].info;
    uint64_t cap = g->memory_bytes - g->reserved_bytes;
    uint64_t *used = &fake_state->gpus[fake_devices[dev].slot].mem_used_bytes;
    uint64_t cur = __atomic_load_n(used, __ATOMIC_RELAXED);
    do {
        if (bytes > cap || cur > cap - bytes) {
            FAKE_COUNT(mem_oom);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } while (!__atomic_compare_exchange_n(used, &cur, cur + bytes, 1, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
    fake_sim_mem(dev, (int64_t)bytes);
    return CUDA_SUCCESS;
}

void fake_mem_give_gpu(int dev, uint64_t bytes)
{
    __atomic_fetch_sub(&fake_state->gpus[fake_devices[dev].slot].mem_used_bytes, bytes, __ATOMIC_ACQ_REL);
}

void fake_mem_give(int dev, uint64_t bytes)
{
    fake_mem_give_gpu(dev, bytes);
    fake_sim_mem(dev, -(int64_t)bytes);
}

/* Device addresses come from one range of address space reserved at the first allocation (FAKE_CUDA_VA_GIB,
 * default 4096 GiB, MAP_NORESERVE: it costs nothing until touched), 2 MiB aligned as the real driver's are, so
 * they never collide with host memory. With FAKE_CUDA_HOST_BACKED=1 the range is readable and writable and
 * copies, memsets and kernels' host-side checks see real bytes (a copy to the device and back round-trips);
 * freed memory is given back to the kernel. */
static struct {
    pthread_once_t once;
    uint64_t base, end, next;
    int backed;
} va = {PTHREAD_ONCE_INIT, 0, 0, 0, 0};

static void va_reserve(void)
{
    uint64_t size = fake_env_u64("FAKE_CUDA_VA_GIB", 4096) << 30;
    va.backed = fake_env_u64("FAKE_CUDA_HOST_BACKED", 0) != 0;
    void *p = mmap(NULL, size + FAKE_CUDA_GRANULARITY, va.backed ? PROT_READ | PROT_WRITE : PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "fake libcuda: cannot reserve %llu GiB of address space for device memory; device "
                        "addresses are made up and copies are not performed\n", (unsigned long long)(size >> 30));
        va.backed = 0;
        return;
    }
    va.base = ((uint64_t)(uintptr_t)p + FAKE_CUDA_GRANULARITY - 1) & ~(FAKE_CUDA_GRANULARITY - 1);
    va.next = va.base;
    va.end = va.base + size;
}

uint64_t fake_mem_new_address(uint64_t bytes)
{
    pthread_once(&va.once, va_reserve);
    uint64_t span = (bytes + FAKE_CUDA_GRANULARITY - 1) & ~(FAKE_CUDA_GRANULARITY - 1);
    if (!span)
        span = FAKE_CUDA_GRANULARITY;
    if (va.base) {
        uint64_t addr = __atomic_fetch_add(&va.next, span, __ATOMIC_RELAXED);
        if (addr + span <= va.end)
            return addr;
    }
    return __atomic_fetch_add(&next_address, span, __ATOMIC_RELAXED);
}

int fake_mem_is_device(uint64_t addr)
{
    return va.base && addr >= va.base && addr < va.end;
}

int fake_mem_backed(void)
{
    pthread_once(&va.once, va_reserve);
    return va.backed;
}

static void va_release(uint64_t addr, uint64_t bytes)
{
    if (va.backed && fake_mem_is_device(addr) && bytes)
        madvise((void *)(uintptr_t)addr, bytes, MADV_DONTNEED);
}

CUresult fake_mem_alloc(uint64_t *out, uint64_t bytes, int dev, int low)
{
    return fake_mem_alloc_pool(out, bytes, dev, low, NULL);
}

CUresult fake_mem_alloc_pool(uint64_t *out, uint64_t bytes, int dev, int low, struct fake_pool *pool)
{
    if (!out || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev >= 0)
        bytes = (bytes + FAKE_CUDA_GRANULARITY - 1) & ~(FAKE_CUDA_GRANULARITY - 1);
    uint64_t cached = pool ? fake_pool_reuse(pool, bytes) : 0; /* memory the pool kept from earlier frees */
    CUresult rc = dev >= 0 && bytes > cached ? fake_mem_take(dev, bytes - cached) : CUDA_SUCCESS;
    if (rc) {
        if (cached)
            fake_pool_keep(pool, cached);
        return rc;
    }
    uint64_t addr;
    if (low) {
        addr = __atomic_fetch_add(&next_low_address, bytes, __ATOMIC_RELAXED);
        if (addr + bytes > (1ULL << 32)) {
            if (dev >= 0)
                fake_mem_give(dev, bytes);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        addr = fake_mem_new_address(bytes);
    }
    if (map_put_pool(addr, bytes, dev, pool)) {
        if (dev >= 0 && bytes > cached)
            fake_mem_give(dev, bytes - cached);
        if (cached)
            fake_pool_keep(pool, cached);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    __atomic_fetch_add(&fake_counters.live_bytes, bytes, __ATOMIC_RELAXED);
    if (pool)
        fake_pool_account(pool, (int64_t)bytes);
    *out = addr;
    return CUDA_SUCCESS;
}

static CUresult allocate(CUdeviceptr *dptr, uint64_t bytes, int dev)
{
    return fake_mem_alloc((uint64_t *)dptr, bytes, dev, 0);
}

int fake_mem_lookup(uint64_t addr, uint64_t *bytes, int *dev)
{
    pthread_mutex_lock(&map.lock);
    size_t i = map_find(addr);
    if (i != SIZE_MAX) {
        *bytes = map.slots[i].bytes;
        *dev = map.slots[i].dev;
    }
    pthread_mutex_unlock(&map.lock);
    return i != SIZE_MAX;
}

CUresult fake_mem_free(uint64_t key)
{
    struct entry e;
    if (!map_take(key, &e))
        return CUDA_ERROR_INVALID_VALUE;
    if (e.pool)
        fake_pool_account(e.pool, -(int64_t)e.bytes);
    /* A pool keeps freed memory up to its release threshold (fake_cuda_pools.c); the rest goes back. */
    uint64_t back = e.pool ? fake_pool_release(e.pool, e.bytes) : e.bytes;
    if (e.dev >= 0 && back)
        fake_mem_give(e.dev, back);
    va_release(key, e.bytes);
    __atomic_fetch_sub(&fake_counters.live_bytes, e.bytes, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

static CUresult on_current(CUdeviceptr *dptr, size_t bytes)
{
    int dev;
    CUresult rc = fake_current_device(&dev);
    return rc ? rc : allocate(dptr, bytes, dev);
}

/* cuMemAllocAsync: from the current device's current pool (cuDeviceSetMemPool), which counts its use. */
static CUresult on_current_pool(CUdeviceptr *dptr, size_t bytes)
{
    int dev;
    CUresult rc = fake_current_device(&dev);
    if (rc)
        return rc;
    return fake_mem_alloc_pool((uint64_t *)dptr, bytes, dev, 0, fake_pool_current(dev));
}

CUresult impl_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FAKE_COUNT(mem_alloc);
    return on_current(dptr, bytesize);
}
FAKE_EXPORT(cuMemAlloc_v2)

CUresult impl_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
    FAKE_COUNT(mem_alloc_pitch);
    if (!pitch || !width || !height || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + PITCH_ALIGN - 1) & ~(size_t)(PITCH_ALIGN - 1);
    CUresult rc = on_current(dptr, p * height);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}
FAKE_EXPORT(cuMemAllocPitch_v2)

/* The CUDA 3.1 cuMemAllocPitch (the shim does not hook it: its tests use it as a version the shim does not know). */
CUresult impl_cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                              unsigned int elem)
{
    CUdeviceptr addr = 0;
    size_t p = 0;
    CUresult rc = dptr ? impl_cuMemAllocPitch_v2(&addr, &p, width, height, elem) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)addr;
        *pitch = (unsigned int)p;
    }
    return rc;
}
FAKE_EXPORT(cuMemAllocPitch)

CUresult impl_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    (void)flags;
    FAKE_COUNT(mem_alloc_managed);
    return on_current(dptr, bytesize);
}
FAKE_EXPORT(cuMemAllocManaged)

CUresult impl_cuMemFree_v2(CUdeviceptr dptr)
{
    FAKE_COUNT(mem_free);
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return dptr ? fake_mem_free(dptr) : CUDA_SUCCESS; /* cudaFree(0) is how programs make the runtime start */
}
FAKE_EXPORT(cuMemFree_v2)

/* The CUDA 3.1 entry points: 32-bit device pointers. */
CUresult impl_cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    FAKE_COUNT(mem_alloc);
    int dev;
    uint64_t addr = 0;
    CUresult rc = dptr ? fake_current_device(&dev) : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && (rc = fake_mem_alloc(&addr, bytesize, dev, 1)) == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)addr;
    return rc;
}
FAKE_EXPORT(cuMemAlloc)

CUresult impl_cuMemFree(CUdeviceptr_v1 dptr)
{
    FAKE_COUNT(mem_free);
    return fake_initialised ? fake_mem_free(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuMemFree)

CUresult impl_cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
    (void)option;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!granularity || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = FAKE_CUDA_GRANULARITY;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemGetAllocationGranularity)

CUresult impl_cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    uint64_t bytes;
    int dev;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fake_mem_lookup(dptr, &bytes, &dev))
        return CUDA_ERROR_NOT_FOUND;
    if (base)
        *base = dptr;
    if (size)
        *size = bytes;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemGetAddressRange_v2)

CUresult impl_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    (void)stream;
    FAKE_COUNT(mem_alloc_async);
    return on_current_pool(dptr, bytesize);
}
FAKE_EXPORT(cuMemAllocAsync)

CUresult impl_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream)
{
    (void)stream;
    FAKE_COUNT(mem_alloc_async_ptsz);
    return on_current_pool(dptr, bytesize);
}
FAKE_EXPORT(cuMemAllocAsync_ptsz)

static CUresult from_pool(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_mem_alloc_pool((uint64_t *)dptr, bytesize,
                               p->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? p->location.id : -1, 0, p);
}

CUresult impl_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    (void)stream;
    FAKE_COUNT(mem_alloc_pool);
    return from_pool(dptr, bytesize, pool);
}
FAKE_EXPORT(cuMemAllocFromPoolAsync)

CUresult impl_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream)
{
    (void)stream;
    FAKE_COUNT(mem_alloc_pool_ptsz);
    return from_pool(dptr, bytesize, pool);
}
FAKE_EXPORT(cuMemAllocFromPoolAsync_ptsz)

CUresult impl_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    FAKE_COUNT(mem_free_async);
    return fake_initialised ? fake_mem_free(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuMemFreeAsync)

CUresult impl_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    FAKE_COUNT(mem_free_async_ptsz);
    return fake_initialised ? fake_mem_free(dptr) : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuMemFreeAsync_ptsz)

CUresult impl_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    int dev;
    CUresult rc = fake_current_device(&dev);
    if (rc)
        return rc;
    if (!free_bytes || !total_bytes)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_gpu_info *g = &fake_devices[dev].info;
    uint64_t used = __atomic_load_n(&fake_state->gpus[fake_devices[dev].slot].mem_used_bytes,
                                    __ATOMIC_RELAXED) + g->reserved_bytes;
    *total_bytes = g->memory_bytes;
    *free_bytes = used < g->memory_bytes ? g->memory_bytes - used : 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemGetInfo_v2)
