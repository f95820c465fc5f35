/* Fake driver: context limits (cuCtxGetLimit / cuCtxSetLimit). Three of them reserve device memory, as on a real
 * GPU: the stack (its size per thread, for every thread the GPU can hold at once: SMs x 2048), the malloc heap and
 * the printf FIFO. The fake takes what a value above the A100's defaults adds (the defaults are part of what a
 * context costs) from the current GPU when it is set, gives it back when it is lowered, and refuses with
 * CUDA_ERROR_OUT_OF_MEMORY what does not fit, as the driver does. Values are per process here (the driver keeps
 * them per context). */
#include <pthread.h>

#include "fake_cuda_mem.h"

enum { LIMIT_STACK = 0, LIMIT_PRINTF_FIFO = 1, LIMIT_MALLOC_HEAP = 2, NLIMITS = 16 };
#define THREADS_PER_SM 2048 /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR (fake_cuda_attributes.c) */

/* The values an A100 starts with; set ones read back. */
static const size_t defaults[NLIMITS] = {1024, 1048576, 8388608, 2, 2048, 0, 0, 0};
static size_t limits[NLIMITS] = {1024, 1048576, 8388608, 2, 2048, 0, 0, 0};
static uint64_t taken[NLIMITS]; /* device memory a limit above its default holds */
static int taken_on[NLIMITS];   /* on which CUDA ordinal */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void child_after_fork(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int i = 0; i < NLIMITS; i++)
        taken[i] = 0; /* the parent's context, not the child's */
}
FAKE_ON_FORK_CHILD(child_after_fork)

/* The device memory `value` of `limit` holds beyond the default, rounded up to the granularity. */
static uint64_t reserved_beyond_default(int limit, size_t value, int dev)
{
    if (value <= defaults[limit])
        return 0;
    uint64_t bytes = value - defaults[limit];
    if (limit == LIMIT_STACK)
        bytes *= (uint64_t)fake_devices[dev].info.sms * THREADS_PER_SM;
    return (bytes + FAKE_CUDA_GRANULARITY - 1) & ~(FAKE_CUDA_GRANULARITY - 1);
}

CUresult impl_cuCtxGetLimit(size_t *value, int limit)
{
    if (!value || limit < 0 || limit >= NLIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    *value = limits[limit];
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuCtxGetLimit)

CUresult impl_cuCtxSetLimit(int limit, size_t value)
{
    if (limit < 0 || limit >= NLIMITS)
        return CUDA_ERROR_INVALID_VALUE;
    if (limit != LIMIT_STACK && limit != LIMIT_PRINTF_FIFO && limit != LIMIT_MALLOC_HEAP) {
        limits[limit] = value;
        return CUDA_SUCCESS;
    }
    int dev;
    CUresult rc = fake_current_device(&dev);
    if (rc)
        return rc;
    pthread_mutex_lock(&lock);
    uint64_t want = reserved_beyond_default(limit, value, dev);
    if (taken[limit] && taken_on[limit] != dev) { /* set last on another GPU: move it */
        fake_mem_give(taken_on[limit], taken[limit]);
        taken[limit] = 0;
    }
    if (want > taken[limit])
        rc = fake_mem_take(dev, want - taken[limit]);
    else if (want < taken[limit])
        fake_mem_give(dev, taken[limit] - want);
    if (rc == CUDA_SUCCESS) {
        taken[limit] = want;
        taken_on[limit] = dev;
        limits[limit] = value;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}
FAKE_EXPORT(cuCtxSetLimit)

/* A process that ends gives back what its limits hold. */
__attribute__((destructor)) static void release_limits(void)
{
    if (!fake_state)
        return;
    for (int i = 0; i < NLIMITS; i++)
        if (taken[i])
            fake_mem_give(taken_on[i], taken[i]);
}
