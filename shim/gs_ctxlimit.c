/* cuCtxSetLimit: three context limits reserve device memory. The stack: its size per thread, for every thread the
 * GPU can hold at once (multiprocessors x threads per multiprocessor: 216 MiB for 1 KiB on an A100); the malloc heap
 * and the printf FIFO: their size. What a value above the driver's default (read before the first change) adds is
 * charged before the driver is asked, given back when lowered, and refused with CUDA_ERROR_OUT_OF_MEMORY when it
 * does not fit; the defaults belong to the context's charge. Limits are per context in the driver; the shim keeps
 * one figure per process and GPU (the last value set on any of its contexts there). */
#include <string.h>

#include "gs_alloc.h"
#include "gs_log.h"

enum { LIMIT_STACK = 0, LIMIT_PRINTF_FIFO = 1, LIMIT_MALLOC_HEAP = 2, NLIMITS = 3 };
#define ATTR_MULTIPROCESSOR_COUNT 16
#define ATTR_MAX_THREADS_PER_MULTIPROCESSOR 39

static struct {
    pthread_mutex_t lock;
    size_t base[GS_MAX_DEVICES][NLIMITS]; /* the driver's value before this process changed it */
    int known[GS_MAX_DEVICES][NLIMITS];
    uint64_t charged[GS_MAX_DEVICES][NLIMITS];
} lim = {PTHREAD_MUTEX_INITIALIZER, {{0}}, {{0}}, {{0}}};

/* A forked child has no context of its own yet: its parent's limits are not its. */
static void child_after_fork(void)
{
    pthread_mutex_init(&lim.lock, NULL);
    memset(lim.known, 0, sizeof lim.known);
    memset(lim.charged, 0, sizeof lim.charged);
}
GS_ON_FORK_CHILD(child_after_fork)

/* Threads GPU d holds at once, 0 when the driver cannot say. */
static uint64_t resident_threads(int d)
{
    int sms = 0, per_sm = 0;
    if (!gs_cu.cuDeviceGetAttribute || gs_cu.cuDeviceGetAttribute(&sms, ATTR_MULTIPROCESSOR_COUNT, d) ||
        gs_cu.cuDeviceGetAttribute(&per_sm, ATTR_MAX_THREADS_PER_MULTIPROCESSOR, d) || sms <= 0 || per_sm <= 0)
        return 0;
    return (uint64_t)sms * (uint64_t)per_sm;
}

/* The device memory `value` holds beyond the base, rounded to the GPU's granularity; UINT64_MAX when it cannot be
 * told (the stack of a GPU whose size the driver does not give). */
static uint64_t beyond_base(int d, int limit, size_t value)
{
    size_t base = lim.base[d][limit];
    if (value <= base)
        return 0;
    uint64_t bytes = value - base;
    if (limit == LIMIT_STACK) {
        uint64_t threads = resident_threads(d);
        if (!threads || bytes > UINT64_MAX / threads)
            return UINT64_MAX;
        bytes *= threads;
    }
    return gs_charge_size(d, bytes);
}

GS_EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
    GS_ENTER_OR_RETURN(cuCtxSetLimit);
    int d;
    if (limit < 0 || limit >= NLIMITS || gs_alloc_target(&d) != CUDA_SUCCESS || d < 0)
        return gs_cu.cuCtxSetLimit(limit, value); /* not memory, or nothing accounted: the driver answers */
    pthread_mutex_lock(&lim.lock);
    if (!lim.known[d][limit]) {
        size_t base = 0;
        if (!gs_cu.cuCtxGetLimit || gs_cu.cuCtxGetLimit(&base, limit) != CUDA_SUCCESS) {
            pthread_mutex_unlock(&lim.lock);
            return gs_cu.cuCtxSetLimit(limit, value); /* no current context: the driver says so */
        }
        lim.base[d][limit] = base;
        lim.known[d][limit] = 1;
    }
    uint64_t want = beyond_base(d, limit, value), had = lim.charged[d][limit];
    int tracked = 0;
    CUresult rc = want > had ? gs_alloc_begin(d, want - had, &tracked) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS)
        rc = gs_cu.cuCtxSetLimit(limit, value);
    if (rc == CUDA_SUCCESS && want < had)
        gs_alloc_undo(d, had - want);
    else if (rc != CUDA_SUCCESS && tracked)
        gs_alloc_undo(d, want - had);
    if (rc == CUDA_SUCCESS && (tracked || want < had))
        lim.charged[d][limit] = want;
    pthread_mutex_unlock(&lim.lock);
    return rc;
}
