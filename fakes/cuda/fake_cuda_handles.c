/* Fake driver: the physical allocations of the virtual memory API (cuMemCreate handles). As the driver documents,
 * one lives until every reference to it is gone: its handle references (cuMemCreate, cuMemRetainAllocationHandle
 * and cuMemImportFromShareableHandle take one, cuMemRelease drops one) and its mappings (cuMemMap adds one,
 * cuMemUnmap drops it; fake_cuda_vmm.c). NVIDIA's own VMM sample releases the handle right after mapping: the
 * memory stays taken until the last unmap.
 *
 * Sharing between processes (cuMemExportToShareableHandle with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR): the
 * exported descriptor is a small memfd holding the allocation's record (its GPU's slot in the state file, its
 * size, an id and how many processes hold it). A process that imports it gets a handle of its own to the same
 * memory, which is taken once on the GPU and given back when the last process holding it lets go. NVML counts it
 * as the creator's memory while the creator holds it. The descriptor itself does not keep the memory alive here
 * (the fake cannot see it closed; the real driver counts it as one more reference). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_gpu_ident.h"
#include "fake_cuda_mem.h"

#define HANDLE_TAG (1ULL << 62)
#define SHARED_MAGIC 0x31444853454b4146ULL /* "FAKESHD1" */
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 1

struct shared { /* in the exported memfd, mapped by every process that holds the allocation */
    uint64_t magic;
    uint64_t id;
    uint64_t bytes;
    uint32_t slot;    /* the GPU's entry in the state file */
    uint32_t holders; /* processes holding a handle reference or a mapping */
};

struct phys {
    uint64_t handle, bytes;
    int dev;              /* CUDA ordinal, -1: host memory (not charged) */
    uint32_t refs, maps;  /* handle references and mappings */
    int attributed;       /* counted as this process's memory (NVML's per-process figure): the creator's */
    struct shared *shared; /* once exported or imported */
    int fd;               /* the exported memfd, -1 */
};

static struct {
    pthread_mutex_t lock;
    struct phys **all;
    size_t n, cap;
} t = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};
static uint64_t next_handle = 1;

static void child_after_fork(void)
{
    pthread_mutex_init(&t.lock, NULL);
    t.n = 0; /* a forked child holds none of its parent's allocations */
}
FAKE_ON_FORK_CHILD(child_after_fork)

/* With t.lock held. */
static struct phys *find(uint64_t handle)
{
    for (size_t i = 0; i < t.n; i++)
        if (t.all[i]->handle == handle)
            return t.all[i];
    return NULL;
}

static int add(struct phys *p)
{
    if (t.n == t.cap) {
        size_t cap = t.cap ? t.cap * 2 : 64;
        struct phys **all = realloc(t.all, cap * sizeof *all);
        if (!all)
            return -1;
        t.all = all;
        t.cap = cap;
    }
    t.all[t.n++] = p;
    return 0;
}

static void unlink_phys(struct phys *p)
{
    for (size_t i = 0; i < t.n; i++)
        if (t.all[i] == p) {
            t.all[i] = t.all[--t.n];
            return;
        }
}

/* Let go of an allocation this process no longer refers to: its device memory goes back unless another
 * process still holds it. With t.lock not needed (p is unlinked). */
static void let_go(struct phys *p)
{
    if (p->dev >= 0) {
        if (p->attributed)
            fake_sim_mem(p->dev, -(int64_t)p->bytes);
        if (!p->shared || __atomic_sub_fetch(&p->shared->holders, 1, __ATOMIC_ACQ_REL) == 0)
            fake_mem_give_gpu(p->dev, p->bytes);
    }
    __atomic_fetch_sub(&fake_counters.live_bytes, p->bytes, __ATOMIC_RELAXED);
    if (p->shared)
        munmap(p->shared, sizeof *p->shared);
    if (p->fd >= 0)
        close(p->fd);
    free(p);
}

/* A process that ends lets go of what it holds, as the real driver does on its behalf. */
__attribute__((destructor)) static void release_all(void)
{
    if (!fake_state)
        return;
    pthread_mutex_lock(&t.lock);
    while (t.n)
        let_go(t.all[--t.n]);
    pthread_mutex_unlock(&t.lock);
}

int fake_handle_lookup(uint64_t handle, uint64_t *bytes, int *dev)
{
    pthread_mutex_lock(&t.lock);
    struct phys *p = find(handle);
    if (p && p->refs) {
        *bytes = p->bytes;
        *dev = p->dev;
    }
    pthread_mutex_unlock(&t.lock);
    return p && p->refs;
}

CUresult fake_handle_hold(uint64_t handle, int refs, int maps)
{
    pthread_mutex_lock(&t.lock);
    struct phys *p = find(handle);
    if (!p || (refs < 0 && p->refs < (uint32_t)-refs) || (maps < 0 && p->maps < (uint32_t)-maps) ||
        (maps > 0 && !p->refs)) { /* a released handle cannot be mapped again (retained through a mapping, yes) */
        pthread_mutex_unlock(&t.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    p->refs += (uint32_t)refs;
    p->maps += (uint32_t)maps;
    int gone = !p->refs && !p->maps;
    if (gone)
        unlink_phys(p);
    pthread_mutex_unlock(&t.lock);
    if (gone)
        let_go(p);
    return CUDA_SUCCESS;
}

static CUresult add_handle(struct phys *p, CUmemGenericAllocationHandle *handle)
{
    p->handle = HANDLE_TAG | __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&t.lock);
    int rc = add(p);
    pthread_mutex_unlock(&t.lock);
    if (rc)
        return CUDA_ERROR_OUT_OF_MEMORY;
    __atomic_fetch_add(&fake_counters.live_bytes, p->bytes, __ATOMIC_RELAXED);
    *handle = p->handle;
    return CUDA_SUCCESS;
}

CUresult impl_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                          unsigned long long flags)
{
    (void)flags;
    FAKE_COUNT(mem_create);
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!handle || !prop || !size)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (prop->location.id < 0 || prop->location.id >= fake_device_count)
            return CUDA_ERROR_INVALID_DEVICE;
        dev = prop->location.id;
    }
    if (size % FAKE_CUDA_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE; /* as the real driver: a multiple of the granularity */
    struct phys *p = calloc(1, sizeof *p);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (struct phys){0, size, dev, 1, 0, dev >= 0, NULL, -1};
    CUresult rc = dev >= 0 ? fake_mem_take(dev, size) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS && (rc = add_handle(p, handle)) != CUDA_SUCCESS && dev >= 0)
        fake_mem_give(dev, size);
    if (rc)
        free(p);
    return rc;
}
FAKE_EXPORT(cuMemCreate)

CUresult impl_cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FAKE_COUNT(mem_release);
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return fake_handle_hold(handle, -1, 0);
}
FAKE_EXPORT(cuMemRelease)

CUresult impl_cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    uint64_t bytes;
    int dev;
    if (!prop || !fake_handle_lookup(handle, &bytes, &dev))
        return CUDA_ERROR_INVALID_VALUE;
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = dev >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    prop->location.id = dev >= 0 ? dev : 0;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemGetAllocationPropertiesFromHandle)

/* The memfd that carries an allocation's record, made on its first export. With t.lock held. */
static int share(struct phys *p)
{
    if (p->fd >= 0)
        return 0;
    int fd = memfd_create("fake-cuda-allocation", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    struct shared *s = MAP_FAILED;
    if (ftruncate(fd, sizeof *s) == 0)
        s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED) {
        close(fd);
        return -1;
    }
    /* the process as the node knows it: in a container getpid() is the same small number in every one */
    uint64_t id = ((uint64_t)(uint32_t)fake_ident_self() << 32) ^ p->handle ^ (uint64_t)(uintptr_t)s;
    *s = (struct shared){SHARED_MAGIC, id, p->bytes, (uint32_t)fake_devices[p->dev].slot, 1};
    p->shared = s;
    p->fd = fd;
    return 0;
}

CUresult impl_cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                           unsigned long long flags)
{
    (void)flags;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED; /* fabric and Windows handles are not simulated */
    if (!shareable)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&t.lock);
    struct phys *p = find(handle);
    if (!p || !p->refs || p->dev < 0)
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (share(p) != 0 || (*(int *)shareable = fcntl(p->fd, F_DUPFD_CLOEXEC, 0)) < 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&t.lock);
    return rc;
}
FAKE_EXPORT(cuMemExportToShareableHandle)

CUresult impl_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *shareable, int type)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)(intptr_t)shareable;
    struct shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (s == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    for (int i = 0; i < fake_device_count; i++)
        if ((uint32_t)fake_devices[i].slot == s->slot)
            dev = i;
    CUresult rc = s->magic != SHARED_MAGIC ? CUDA_ERROR_INVALID_VALUE : dev < 0 ? CUDA_ERROR_INVALID_DEVICE
                                                                               : CUDA_SUCCESS;
    pthread_mutex_lock(&t.lock);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < t.n; i++) {
        struct phys *p = t.all[i];
        if (p->shared && p->shared->id == s->id && p->refs) { /* already held here: one more reference */
            p->refs++;
            *handle = p->handle;
            pthread_mutex_unlock(&t.lock);
            munmap(s, sizeof *s);
            return CUDA_SUCCESS;
        }
    }
    /* Still alive somewhere: this process becomes one more holder (a record nobody holds is memory gone). */
    uint32_t holders = __atomic_load_n(&s->holders, __ATOMIC_ACQUIRE);
    while (rc == CUDA_SUCCESS) {
        if (!holders)
            rc = CUDA_ERROR_INVALID_VALUE;
        else if (__atomic_compare_exchange_n(&s->holders, &holders, holders + 1, 1, __ATOMIC_ACQ_REL,
                                             __ATOMIC_ACQUIRE))
            break;
    }
    pthread_mutex_unlock(&t.lock);
    struct phys *p = rc == CUDA_SUCCESS ? calloc(1, sizeof *p) : NULL;
    if (p) {
        *p = (struct phys){0, s->bytes, dev, 1, 0, 0, s, -1};
        if ((rc = add_handle(p, handle)) == CUDA_SUCCESS)
            return rc;
        __atomic_sub_fetch(&s->holders, 1, __ATOMIC_ACQ_REL);
        free(p);
    } else if (rc == CUDA_SUCCESS) {
        __atomic_sub_fetch(&s->holders, 1, __ATOMIC_ACQ_REL);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    munmap(s, sizeof *s);
    return rc;
}
FAKE_EXPORT(cuMemImportFromShareableHandle)
