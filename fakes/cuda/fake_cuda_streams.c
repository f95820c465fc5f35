/* Fake driver: streams, events and stream capture into graphs. Streams and events are small objects (a stream
 * remembers its flags and priority; an event the time it was recorded, so elapsed times are real). A stream
 * being captured (cuStreamBeginCapture) says so to cuStreamIsCapturing and cuStreamGetCaptureInfo until
 * cuStreamEndCapture hands back the graph; the fake's graphs record nothing and a launch is timed as one kernel
 * (fake_cuda_launch.c). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "fake_cuda_mem.h"

#pragma GCC diagnostic ignored "-Wunused-parameter" /* entry points keep cuda.h's parameter lists */

#define STREAM_MAGIC 0x5354524dU

struct fake_stream {
    unsigned magic, flags;
    int priority;
    int device;
    unsigned long long id;
    int capturing;
    CUgraph graph;
};

static unsigned long long next_id = 3; /* 1 and 2: the default streams' ids (attrs_of) */

/* NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are the default stream. */
static struct fake_stream *stream_of(CUstream s)
{
    struct fake_stream *st = (struct fake_stream *)s;
    return (uintptr_t)s > 2 && st->magic == STREAM_MAGIC ? st : NULL;
}

CUresult impl_cuStreamCreateWithPriority(CUstream *out, unsigned flags, int priority)
{
    int dev;
    CUresult rc = fake_current_device(&dev);
    if (rc)
        return rc;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_stream *st = calloc(1, sizeof *st);
    if (!st)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *st = (struct fake_stream){STREAM_MAGIC, flags, priority < -5 ? -5 : priority > 0 ? 0 : priority, dev,
                               __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED), 0, NULL};
    *out = (CUstream)st;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamCreateWithPriority)

CUresult impl_cuStreamCreate(CUstream *out, unsigned flags)
{
    return impl_cuStreamCreateWithPriority(out, flags, 0);
}
FAKE_EXPORT(cuStreamCreate)

CUresult impl_cuStreamDestroy_v2(CUstream s)
{
    struct fake_stream *st = stream_of(s);
    if (!st)
        return CUDA_ERROR_INVALID_HANDLE;
    st->magic = 0;
    free(st);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamDestroy_v2)

/* A stream is done when the kernels this process queued on the simulated GPU have run (the fake keeps one queue
 * per process and GPU, not one per stream). */
static CUresult query(CUstream s)
{
    struct fake_stream *st = stream_of(s);
    int dev;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (st)
        dev = st->device;
    else if (fake_current_device(&dev) != CUDA_SUCCESS)
        return CUDA_SUCCESS;
    return fake_sim_busy(dev) ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult impl_cuStreamQuery(CUstream s)
{
    return query(s);
}
FAKE_EXPORT(cuStreamQuery)

CUresult impl_cuStreamQuery_ptsz(CUstream s)
{
    return query(s);
}
FAKE_EXPORT(cuStreamQuery_ptsz)

/* What the getters report of stream `s`: its own priority, flags and ID, or the default stream's (priority 0, no
 * flags, the handle's value as its ID). */
static struct fake_stream attrs_of(CUstream s)
{
    struct fake_stream *st = stream_of(s);
    return st ? *st : (struct fake_stream){.id = (unsigned long long)(uintptr_t)s};
}

CUresult impl_cuStreamGetPriority(CUstream s, int *priority)
{
    if (!priority)
        return CUDA_ERROR_INVALID_VALUE;
    *priority = attrs_of(s).priority;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamGetPriority)

CUresult impl_cuStreamGetFlags(CUstream s, unsigned *flags)
{
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = attrs_of(s).flags;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamGetFlags)

CUresult impl_cuStreamGetId(CUstream s, unsigned long long *id)
{
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    *id = attrs_of(s).id;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamGetId)

CUresult impl_cuStreamGetCtx(CUstream s, CUcontext *ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    *ctx = (CUcontext)fake_current;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamGetCtx)

CUresult impl_cuStreamGetDevice(CUstream s, CUdevice *dev)
{
    struct fake_stream *st = stream_of(s);
    if (!dev)
        return CUDA_ERROR_INVALID_VALUE;
    if (st) {
        *dev = st->device;
        return CUDA_SUCCESS;
    }
    return fake_current_device(dev);
}
FAKE_EXPORT(cuStreamGetDevice)

CUresult impl_cuStreamWaitEvent(CUstream s, void *event, unsigned flags)
{
    return fake_initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT(cuStreamWaitEvent)

CUresult impl_cuStreamAddCallback(CUstream s, void (*cb)(CUstream, CUresult, void *), void *data, unsigned flags)
{
    if (!cb)
        return CUDA_ERROR_INVALID_VALUE;
    cb(s, CUDA_SUCCESS, data);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamAddCallback)

CUresult impl_cuStreamAttachMemAsync(CUstream s, CUdeviceptr p, size_t n, unsigned flags)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamAttachMemAsync)

/* Memory operations on streams (PyTorch's and cuBLASLt's synchronisation): done at once. */
CUresult impl_cuStreamWriteValue32_v2(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags)
{
    if (fake_mem_is_device(addr) && fake_mem_backed())
        *(volatile unsigned *)(uintptr_t)addr = value;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamWriteValue32_v2)

CUresult impl_cuStreamWriteValue64_v2(CUstream s, CUdeviceptr addr, unsigned long long value, unsigned flags)
{
    if (fake_mem_is_device(addr) && fake_mem_backed())
        *(volatile unsigned long long *)(uintptr_t)addr = value;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamWriteValue64_v2)

CUresult impl_cuStreamWaitValue32_v2(CUstream s, CUdeviceptr addr, unsigned value, unsigned flags)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamWaitValue32_v2)

CUresult impl_cuStreamWaitValue64_v2(CUstream s, CUdeviceptr addr, unsigned long long value, unsigned flags)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamWaitValue64_v2)

CUresult impl_cuStreamBatchMemOp_v2(CUstream s, unsigned count, void *ops, unsigned flags)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamBatchMemOp_v2)

/* --- capture ------------------------------------------------------------------------------------------------- */
int fake_stream_capturing(CUstream s)
{
    struct fake_stream *st = stream_of(s);
    return st && st->capturing;
}

CUresult impl_cuStreamBeginCapture_v2(CUstream s, int mode)
{
    struct fake_stream *st = stream_of(s);
    if (!st)
        return CUDA_ERROR_NOT_SUPPORTED; /* the legacy default stream cannot be captured */
    if (st->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = impl_cuGraphCreate(&st->graph, 0);
    if (rc)
        return rc;
    st->capturing = 1;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamBeginCapture_v2)

CUresult impl_cuStreamEndCapture(CUstream s, CUgraph *graph)
{
    struct fake_stream *st = stream_of(s);
    if (!graph)
        return CUDA_ERROR_INVALID_VALUE;
    if (!st || !st->capturing)
        return CUDA_ERROR_INVALID_VALUE;
    st->capturing = 0;
    *graph = st->graph;
    st->graph = NULL;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamEndCapture)

static CUresult capture_info(CUstream s, int *status, unsigned long long *id, CUgraph *graph,
                             const CUgraphNode **deps, const void **edges, size_t *ndeps)
{
    struct fake_stream *st = stream_of(s);
    int on = st && st->capturing;
    if (status)
        *status = on ? 1 : 0; /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
    if (id)
        *id = on ? st->id : 0;
    if (graph)
        *graph = on ? st->graph : NULL;
    if (deps)
        *deps = NULL;
    if (edges)
        *edges = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}

CUresult impl_cuStreamGetCaptureInfo_v2(CUstream s, int *status, unsigned long long *id, CUgraph *graph,
                                        const CUgraphNode **deps, size_t *ndeps)
{
    return capture_info(s, status, id, graph, deps, NULL, ndeps);
}
FAKE_EXPORT(cuStreamGetCaptureInfo_v2)

CUresult impl_cuStreamGetCaptureInfo_v3(CUstream s, int *status, unsigned long long *id, CUgraph *graph,
                                        const CUgraphNode **deps, const void **edges, size_t *ndeps)
{
    return capture_info(s, status, id, graph, deps, edges, ndeps);
}
FAKE_EXPORT(cuStreamGetCaptureInfo_v3)

CUresult impl_cuStreamUpdateCaptureDependencies(CUstream s, CUgraphNode *deps, size_t n, unsigned flags)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuStreamUpdateCaptureDependencies)

CUresult impl_cuThreadExchangeStreamCaptureMode(int *mode)
{
    static __thread int current;
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    int old = current;
    current = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuThreadExchangeStreamCaptureMode)

/* --- graphs beyond cuGraphCreate / cuGraphDestroy (fake_cuda_objects.c) ------------------------------------- */
CUresult impl_cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    if (!exec || !graph)
        return CUDA_ERROR_INVALID_VALUE;
    *exec = (CUgraphExec)calloc(1, 64);
    return *exec ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_EXPORT(cuGraphInstantiateWithFlags)

CUresult impl_cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph, void *params)
{
    return impl_cuGraphInstantiateWithFlags(exec, graph, 0);
}
FAKE_EXPORT(cuGraphInstantiateWithParams)

CUresult impl_cuGraphExecDestroy(CUgraphExec exec)
{
    if (!exec)
        return CUDA_ERROR_INVALID_VALUE;
    free(exec);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuGraphExecDestroy)

CUresult impl_cuGraphUpload(CUgraphExec exec, CUstream s)
{
    return exec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuGraphUpload)

CUresult impl_cuGraphGetNodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    if (!graph || !count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuGraphGetNodes)

CUresult impl_cuGraphDebugDotPrint(CUgraph graph, const char *path, unsigned flags)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}
FAKE_EXPORT(cuGraphDebugDotPrint)

CUresult impl_cuDeviceGraphMemTrim(CUdevice dev)
{
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGraphMemTrim)

CUresult impl_cuDeviceGetGraphMemAttribute(CUdevice dev, int attr, void *value)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    *(uint64_t *)value = 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetGraphMemAttribute)

/* --- events -------------------------------------------------------------------------------------------------- */
struct fake_event {
    uint64_t ns;
    unsigned flags;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

CUresult impl_cuEventCreate(void **event, unsigned flags)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!event)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = flags;
    *event = e;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuEventCreate)

CUresult impl_cuEventDestroy_v2(void *event)
{
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    free(event);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuEventDestroy_v2)

CUresult impl_cuEventRecord(void *event, CUstream s)
{
    struct fake_event *e = event;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    e->ns = now_ns();
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuEventRecord)

CUresult impl_cuEventRecordWithFlags(void *event, CUstream s, unsigned flags)
{
    return impl_cuEventRecord(event, s);
}
FAKE_EXPORT(cuEventRecordWithFlags)

CUresult impl_cuEventQuery(void *event)
{
    return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
FAKE_EXPORT(cuEventQuery)

CUresult impl_cuEventSynchronize(void *event)
{
    int dev;
    if (!event)
        return CUDA_ERROR_INVALID_HANDLE;
    if (fake_current_device(&dev) == CUDA_SUCCESS)
        fake_sim_drain(dev);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuEventSynchronize)

CUresult impl_cuEventElapsedTime_v2(float *ms, void *start, void *end)
{
    struct fake_event *a = start, *b = end;
    if (!ms || !a || !b)
        return CUDA_ERROR_INVALID_VALUE;
    *ms = (float)((double)((int64_t)(b->ns - a->ns)) / 1e6);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuEventElapsedTime_v2)

CUresult impl_cuEventElapsedTime(float *ms, void *start, void *end)
{
    return impl_cuEventElapsedTime_v2(ms, start, end);
}
FAKE_EXPORT(cuEventElapsedTime)

CUresult impl_cuIpcGetEventHandle(void *handle, void *event)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}
FAKE_EXPORT(cuIpcGetEventHandle)
