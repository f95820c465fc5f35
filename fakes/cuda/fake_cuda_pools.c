/* Fake driver: stream-ordered memory pools. Each device has a default pool (cuDeviceGetDefaultMemPool) and a
 * current one (cuDeviceGetMemPool / cuDeviceSetMemPool) that cuMemAllocAsync takes from. Attributes read back what
 * was set (CuPy keeps its pool's limit in the release threshold). As the driver's, a pool keeps freed memory
 * (still taken on the GPU) while what it holds stays within its release threshold (default 0: nothing), reuses it
 * for its next allocations, and gives it back on cuMemPoolTrimTo, a lower threshold and cuMemPoolDestroy; the real
 * driver trims to the threshold at the next synchronisation, the fake at the free. Reserved = used + kept. */
#include <pthread.h>
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
static struct fake_pool *created;                      /* the pools this process created */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* kept memory and the list above */

static void child_after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++)
        default_pool[d].cached = 0;
    for (struct fake_pool *p = created; p; p = p->next)
        p->cached = 0; /* the parent's memory, not the child's */
}
FAKE_ON_FORK_CHILD(child_after_fork)

static int pool_device(const struct fake_pool *p)
{
    return p->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? p->location.id : -1;
}

/* Keep at most what `reserved` (used + kept) allows; with lock held. Returns what the pool stops keeping. */
static uint64_t trim_to(struct fake_pool *p, uint64_t reserved)
{
    uint64_t used = __atomic_load_n(&p->used, __ATOMIC_RELAXED);
    uint64_t room = reserved > used ? reserved - used : 0;
    uint64_t excess = p->cached > room ? p->cached - room : 0;
    p->cached -= excess;
    return excess;
}

static void give_back(struct fake_pool *p, uint64_t bytes)
{
    if (bytes && pool_device(p) >= 0 && fake_state)
        fake_mem_give(pool_device(p), bytes);
}

uint64_t fake_pool_reuse(struct fake_pool *pool, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    uint64_t got = pool->cached < bytes ? pool->cached : bytes;
    pool->cached -= got;
    pthread_mutex_unlock(&lock);
    return got;
}

void fake_pool_keep(struct fake_pool *pool, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    pool->cached += bytes;
    pthread_mutex_unlock(&lock);
}

uint64_t fake_pool_release(struct fake_pool *pool, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    pool->cached += bytes;
    uint64_t back = trim_to(pool, pool->attr[ATTR_RELEASE_THRESHOLD]);
    pthread_mutex_unlock(&lock);
    return back;
}

/* A process that ends gives back what its pools keep. */
__attribute__((destructor)) static void release_kept(void)
{
    pthread_mutex_lock(&lock);
    for (int d = 0; d < FAKE_CUDA_MAX_DEVICES; d++) {
        give_back(&default_pool[d], default_pool[d].cached);
        default_pool[d].cached = 0;
    }
    for (struct fake_pool *p = created; p; p = p->next) {
        give_back(p, p->cached);
        p->cached = 0;
    }
    pthread_mutex_unlock(&lock);
}

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
    pthread_mutex_lock(&lock);
    p->next = created;
    created = p;
    pthread_mutex_unlock(&lock);
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolCreate)

CUresult impl_cuMemPoolDestroy(CUmemoryPool pool)
{
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p || p->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < fake_device_count; d++) {
        struct fake_pool *expected = p;
        __atomic_compare_exchange_n(&current_pool[d], &expected, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
    }
    pthread_mutex_lock(&lock);
    for (struct fake_pool **pp = &created; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    give_back(p, p->cached);
    pthread_mutex_unlock(&lock);
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
    if (attr == ATTR_RELEASE_THRESHOLD) {
        pthread_mutex_lock(&lock);
        give_back(p, trim_to(p, p->attr[attr]));
        pthread_mutex_unlock(&lock);
    }
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolSetAttribute)

CUresult impl_cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value)
{
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p || !value || attr < 1 || attr >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t v = p->attr[attr];
    uint64_t kept = attr == ATTR_RESERVED_MEM_CURRENT || attr == ATTR_RESERVED_MEM_HIGH ? p->cached : 0;
    if (attr == ATTR_RESERVED_MEM_CURRENT || attr == ATTR_USED_MEM_CURRENT)
        v = __atomic_load_n(&p->used, __ATOMIC_RELAXED) + kept;
    else if (attr == ATTR_RESERVED_MEM_HIGH || attr == ATTR_USED_MEM_HIGH)
        v = __atomic_load_n(&p->used_high, __ATOMIC_RELAXED) + kept;
    if (int_attr(attr))
        *(int *)value = (int)v;
    else
        *(uint64_t *)value = v;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemPoolGetAttribute)

CUresult impl_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    struct fake_pool *p = (struct fake_pool *)pool;
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    give_back(p, trim_to(p, keep));
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
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
