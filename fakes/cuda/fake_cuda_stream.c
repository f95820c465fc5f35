/* Fake driver: host functions in stream order. cuLaunchHostFunc runs the function on the process's host-function
 * thread once the work this process queued on the GPU before it has finished (the simulated GPU's queue), as the
 * real driver runs it when the stream reaches it; cuCtxSynchronize waits for them too. Streams are captured only when a
 * test says so (FAKE_CUDA_CAPTURING). */
#include <pthread.h>
#include <stdlib.h>

#include "fake_cuda_api.h"

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pending_done = PTHREAD_COND_INITIALIZER;
static pthread_cond_t work_ready = PTHREAD_COND_INITIALIZER;
static int pending; /* host functions queued and not yet run */
static int worker_running;

struct host_call {
    CUhostFn fn;
    void *data;
    int dev; /* -1: no current context, nothing to wait for */
    struct host_call *next;
};
static struct host_call *queue_head, *queue_tail;

static void child_after_fork(void)
{
    pthread_mutex_init(&pending_lock, NULL);
    pthread_cond_init(&pending_done, NULL);
    pthread_cond_init(&work_ready, NULL);
    pending = 0;
    worker_running = 0; /* the parent's worker thread does not exist in the child */
    queue_head = queue_tail = NULL;
}

FAKE_ON_FORK_CHILD(child_after_fork)

void fake_host_calls_wait(void)
{
    pthread_mutex_lock(&pending_lock);
    while (pending)
        pthread_cond_wait(&pending_done, &pending_lock);
    pthread_mutex_unlock(&pending_lock);
}

/* One thread runs the host functions in the order they were queued, each once the work queued before it on the
 * simulated GPU has finished. */
static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pending_lock);
    for (;;) {
        while (!queue_head)
            pthread_cond_wait(&work_ready, &pending_lock);
        struct host_call *c = queue_head;
        queue_head = c->next;
        if (!queue_head)
            queue_tail = NULL;
        pthread_mutex_unlock(&pending_lock);
        if (c->dev >= 0)
            fake_sim_drain(c->dev);
        c->fn(c->data);
        free(c);
        pthread_mutex_lock(&pending_lock);
        if (--pending == 0)
            pthread_cond_broadcast(&pending_done);
    }
    return NULL;
}

static CUresult host_func(CUstream stream, CUhostFn fn, void *data)
{
    (void)stream;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    struct host_call *c = malloc(sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct host_call){fn, data, -1, NULL};
    if (fake_current_device(&c->dev) != CUDA_SUCCESS)
        c->dev = -1;
    pthread_mutex_lock(&pending_lock);
    if (!worker_running) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        worker_running = pthread_create(&t, &attr, worker, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (!worker_running) {
            pthread_mutex_unlock(&pending_lock);
            free(c);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pending++;
    if (queue_tail)
        queue_tail->next = c;
    else
        queue_head = c;
    queue_tail = c;
    pthread_cond_signal(&work_ready);
    pthread_mutex_unlock(&pending_lock);
    return CUDA_SUCCESS;
}

CUresult impl_cuLaunchHostFunc(CUstream stream, CUhostFn fn, void *data)
{
    return host_func(stream, fn, data);
}
FAKE_EXPORT(cuLaunchHostFunc)

CUresult impl_cuLaunchHostFunc_ptsz(CUstream stream, CUhostFn fn, void *data)
{
    return host_func(stream, fn, data);
}
FAKE_EXPORT(cuLaunchHostFunc_ptsz)

/* A stream between cuStreamBeginCapture and cuStreamEndCapture is being captured (status ACTIVE); with
 * FAKE_CUDA_CAPTURING=1 every stream says so. */
int fake_stream_capturing(CUstream s);

/* FAKE_CUDA_CAPTURING is read once: a getenv on every call would make this the slowest call of the fake (the
 * real driver answers from the stream's state), and the shim asks it on every cuMemFreeAsync. */
static pthread_once_t capturing_once = PTHREAD_ONCE_INIT;
static int all_capturing;

static void read_capturing(void)
{
    all_capturing = fake_env_u64("FAKE_CUDA_CAPTURING", 0) != 0;
}

static CUresult is_capturing(CUstream stream, int *status)
{
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&capturing_once, read_capturing);
    *status = all_capturing || fake_stream_capturing(stream) ? 1 : CU_STREAM_CAPTURE_STATUS_NONE;
    return fake_initialised ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult impl_cuStreamIsCapturing(CUstream stream, int *status)
{
    return is_capturing(stream, status);
}
FAKE_EXPORT(cuStreamIsCapturing)

CUresult impl_cuStreamIsCapturing_ptsz(CUstream stream, int *status)
{
    return is_capturing(stream, status);
}
FAKE_EXPORT(cuStreamIsCapturing_ptsz)
