/* Fake driver: stream-ordered memory pools. Each device has a default pool (cuDeviceGetDefaultMemPool) and a
 * current one (cuDeviceGetMemPool / cuDeviceSetMemPool) that cuMemAllocAsync takes from. Attributes read back what
 * was set (CuPy keeps its pool's limit in the release threshold); the used and reserved figures are the bytes
 * the pool's allocations hold (the fake gives freed memory back at once, so reserved = used). */
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_mem.h"

enum {
    ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    ATTR_RELEASE_THRESHOLD = 4,
    ATTR_RESERVED_MEM_CURRENT = 5,
    ATTR_RESERVED_MEM_HIGH = 6,
    ATTR_USED_MEM_CURRENT = 7,
    ATTR_USED_MEM_HIGH = 8,
};

static struct fake_pool default_pool[FAKE_CUDA_MAX_DEVICES];
static struct fake_pool *current_pool[FAKE_CUDA_MAX_DEVICES];

static void pool_init(struct fake_pool *p, int dev)
{
    memset(p, 0, sizeof *p);
    p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->location.id = dev;
    p->attr[ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES] = 1;
    p->attr[ATTR_REUSE_ALLOW_OPPORTUNISTIC] = 1;
    p->attr[ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES] = 1;
}

struct fake_pool *fake_pool_current(int dev)
{
    if (dev < 0 || dev >= fake_device_count)
        return NULL;
    struct fake_pool *p = __atomic_load_n(&current_pool[dev], __ATOMIC_ACQUIRE);
    if (p)
        return p;
    if (!default_pool[dev].is_default) {
        pool_init(&default_pool[dev], dev);
        default_pool[dev].is_default = 1;
    }
    return &default_pool[dev];
}

void fake_pool_account(struct fake_pool *pool, int64_t bytes)
{
    uint64_t now = __atomic_add_fetch(&pool->used, (uint64_t)bytes, __ATOMIC_RELAXED);
    uint64_t high = __atomic_load_n(&pool->used_high, __ATOMIC_RELAXED);
    while (bytes > 0 && now > high &&
           !__atomic_compare_exchange_n(&pool->used_high, &high, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* The checks both pool getters make on their arguments, in the driver's order. */
static CUresult pool_getter_args(const CUmemoryPool *pool, CUdevice dev)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

CUresult impl_cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = pool_getter_args(pool, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    fake_pool_current(dev);
    *pool = (CUmemoryPool)&default_pool[dev];
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetDefaultMemPool)

CUresult impl_cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult rc = pool_getter_args(pool, dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    *pool = (CUmemoryPool)fake_pool_current(dev);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetMemPool)

CUresult impl_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p || p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id != dev)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&current_pool[dev], p, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceSetMemPool)

CUresult impl_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pool || !props)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        (props->location.id < 0 || props->location.id >= fake_device_count))
        return CUDA_ERROR_INVALID_DEVICE;
    struct fake_pool *p = malloc(sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pool_init(p, props->location.id);
    p->location = props->location;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolCreate)

CUresult impl_cuMemPoolDestroy(CUmemoryPool pool)
{
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p || p->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < fake_device_count; d++)
        __atomic_compare_exchange_n(&current_pool[d], &p, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    free(p);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolDestroy)

static int int_attr(int attr)
{
    return attr >= ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES && attr <= ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

CUresult impl_cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value)
{
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p || !value || attr < 1 || attr >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == ATTR_RESERVED_MEM_HIGH || attr == ATTR_USED_MEM_HIGH) {
        if (*(uint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE; /* the high marks can only be reset */
        __atomic_store_n(&p->used_high, __atomic_load_n(&p->used, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        return CUDA_SUCCESS;
    }
    if (attr == ATTR_RESERVED_MEM_CURRENT || attr == ATTR_USED_MEM_CURRENT)
        return CUDA_ERROR_INVALID_VALUE;
    p->attr[attr] = int_attr(attr) ? (uint64_t) * (int *)value : *(uint64_t *)value;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolSetAttribute)

CUresult impl_cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p || !value || attr < 1 || attr >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t v = p->attr[attr];
    if (attr == ATTR_RESERVED_MEM_CURRENT || attr == ATTR_USED_MEM_CURRENT)
        v = __atomic_load_n(&p->used, __ATOMIC_RELAXED);
    else if (attr == ATTR_RESERVED_MEM_HIGH || attr == ATTR_USED_MEM_HIGH)
        v = __atomic_load_n(&p->used_high, __ATOMIC_RELAXED);
    if (int_attr(attr))
        *(int *)value = (int)v;
    else
        *(uint64_t *)value = v;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolGetAttribute)

CUresult impl_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    (void)keep;
    return pool ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; /* nothing is kept beyond what is in use */
}
FAKE_EXPORT(cuMemPoolTrimTo)

CUresult impl_cuMemPoolSetAccess(CUmemoryPool pool, const void *desc, size_t count)
{
    (void)desc, (void)count;
    return pool ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuMemPoolSetAccess)

CUresult impl_cuMemPoolGetAccess(int *flags, CUmemoryPool pool, const CUmemLocation *location)
{
    (void)location;
    if (!flags || !pool)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolGetAccess)
