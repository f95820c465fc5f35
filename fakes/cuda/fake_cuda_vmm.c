/* Fake driver: virtual memory management (cuMemAddressReserve, cuMemMap, ...): PyTorch's expandable segments
 * reserve a large range and map physical allocations (cuMemCreate handles, fake_cuda_handles.c) into it as the
 * segment grows. A reserved range comes from the fake's device address range; a mapping takes no memory but is a
 * reference to its allocation, which lives until its last mapping is gone even after cuMemRelease, and remembers
 * which handle backs which address, for cuMemRetainAllocationHandle. */
#include <pthread.h>
#include <stdlib.h>

#include "fake_cuda_mem.h"

#pragma GCC diagnostic ignored "-Wunused-parameter" /* entry points keep cuda.h's parameter lists */

struct mapping {
    uint64_t addr, size;
    CUmemGenericAllocationHandle handle;
    struct mapping *next;
};
static struct mapping *mappings;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void child_after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    mappings = NULL;
}
FAKE_ON_FORK_CHILD(child_after_fork)

CUresult impl_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || !size || size % (2ULL << 20))
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment > (2ULL << 20)) /* every range is 2 MiB aligned; a larger alignment is rounded into the size */
        size += alignment;
    uint64_t a = fake_mem_new_address(size);
    if (alignment > (2ULL << 20))
        a = (a + alignment - 1) & ~(uint64_t)(alignment - 1);
    *ptr = a;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemAddressReserve)

CUresult impl_cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return ptr && size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuMemAddressFree)

CUresult impl_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long flags)
{
    uint64_t bytes;
    int dev;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!ptr || !size || !fake_handle_lookup(handle, &bytes, &dev) || offset + size > bytes)
        return CUDA_ERROR_INVALID_VALUE;
    struct mapping *m = malloc(sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = fake_handle_hold(handle, 0, 1);
    if (rc) {
        free(m);
        return rc;
    }
    *m = (struct mapping){ptr, size, handle, NULL};
    pthread_mutex_lock(&lock);
    m->next = mappings;
    mappings = m;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemMap)

CUresult impl_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct mapping *gone = NULL;
    pthread_mutex_lock(&lock);
    for (struct mapping **pp = &mappings; *pp;) {
        struct mapping *m = *pp;
        if (m->addr >= ptr && m->addr + m->size <= ptr + size) {
            *pp = m->next;
            m->next = gone;
            gone = m;
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&lock);
    CUresult rc = gone ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    while (gone) { /* the last mapping of a released allocation frees it */
        struct mapping *m = gone;
        gone = m->next;
        fake_handle_hold(m->handle, 0, -1);
        free(m);
    }
    return rc;
}
FAKE_EXPORT(cuMemUnmap)

CUresult impl_cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return ptr && size && desc && count ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuMemSetAccess)

CUresult impl_cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    if (!flags || !location)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = 3; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuMemGetAccess)

CUresult impl_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (struct mapping *m = mappings; m; m = m->next)
        if (a >= m->addr && a < m->addr + m->size) {
            *handle = m->handle;
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc == CUDA_SUCCESS ? fake_handle_hold(*handle, 1, 0) : rc; /* one more reference to release */
}
FAKE_EXPORT(cuMemRetainAllocationHandle)
