/* Fake driver: the private "context" export table, UUID 21318c60-9714-3248-8ca6-41ff7324c8f2 (fakes/README.md,
 * "The context table"). cuBLASLt asks for it when it first chooses a GEMM algorithm for a context
 * (cublasLtMatmulAlgoGetHeuristic) and calls slot 4 with the current context (which it gets from the tools TLS
 * table, 42d85a81 slot 2) for a number that identifies the context; it keys what it caches per context by that
 * number. Without the table, or with slot 4 failing, every GEMM fails CUBLAS_STATUS_NOT_SUPPORTED ("Failed to
 * query heuristics"). cuBLAS calls slots 51 and 39 when the algorithm needs a workspace (a GEMM that splits K): the
 * stream a handle stands for, then that stream's id, which keys its per-stream workspace; failing, the GEMM answers
 * CUBLAS_STATUS_INTERNAL_ERROR.
 *
 * Slot 0 holds the table's size in bytes, as in the other tables with a size slot; the pinned clients never read
 * it. No other slot is reached by them: each answers CUDA_ERROR_NOT_SUPPORTED (rather than jumping to 0), and with
 * FAKE_CUDA_TRACE=1 says on stderr which slot was called with which first arguments, so a client that needs more
 * shows what (slots 51 and 39 were found so). */
#include <stdio.h>

#include "fake_cuda_export.h"

#pragma GCC visibility push(hidden)
CUresult impl_cuStreamGetId(CUstream s, unsigned long long *id);
#pragma GCC visibility pop

#define CONTEXT_SLOTS 64

/* Slot 4: (CUcontext ctx, unsigned long long *number). NULL is the calling thread's current context. The number is
 * the one cuCtxGetId answers: unique in the process, never reused by a later context. */
static CUresult context_number(CUcontext ctx, unsigned long long *number)
{
    if (!number)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_ctx *c = ctx ? (struct fake_ctx *)ctx : fake_current;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    *number = c->id;
    return CUDA_SUCCESS;
}

/* Slot 51: (CUcontext ctx, CUstream handle, CUstream *stream): the stream a handle stands for. NULL is the legacy
 * default stream (CU_STREAM_LEGACY, 1); CU_STREAM_PER_THREAD (2) and streams made with cuStreamCreate stand for
 * themselves. cuBLAS hands the answer to slot 39 and nothing else. */
static CUresult stream_of_handle(CUcontext ctx, CUstream handle, CUstream *stream)
{
    if (!stream)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx && !fake_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    *stream = handle ? handle : (CUstream)(uintptr_t)1;
    return CUDA_SUCCESS;
}

/* Slot 39: (CUcontext ctx, CUstream stream, unsigned long long *id): the stream's id, as cuStreamGetId answers
 * (the default streams': 1 legacy, 2 per-thread; created streams count from 3). cuBLAS keys what it keeps per
 * stream (its workspace) by it, and by the calling thread for the per-thread stream. */
static CUresult stream_number(CUcontext ctx, CUstream stream, unsigned long long *id)
{
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    if (!ctx && !fake_current)
        return CUDA_ERROR_INVALID_CONTEXT;
    return impl_cuStreamGetId(stream, id);
}

static CUresult unknown_slot(int slot, uintptr_t a0, uintptr_t a1, uintptr_t a2)
{
    static int trace = -1;
    if (trace < 0)
        trace = fake_env_u64("FAKE_CUDA_TRACE", 0) != 0;
    if (trace)
        fprintf(stderr,
                "fake libcuda: export table 21318c60 slot %d called (%#lx, %#lx, %#lx, ...): not known, "
                "CUDA_ERROR_NOT_SUPPORTED\n",
                slot, (unsigned long)a0, (unsigned long)a1, (unsigned long)a2);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* One function per slot, so that the trace can say which slot a client called. */
#define SLOT(n)                                                           \
    static CUresult slot_##n(uintptr_t a0, uintptr_t a1, uintptr_t a2)    \
    {                                                                     \
        return unknown_slot(n, a0, a1, a2);                               \
    }
#define SLOTS10(t) SLOT(t##0) SLOT(t##1) SLOT(t##2) SLOT(t##3) SLOT(t##4) SLOT(t##5) SLOT(t##6) SLOT(t##7) SLOT(t##8) SLOT(t##9)
SLOT(1) SLOT(2) SLOT(3) SLOT(5) SLOT(6) SLOT(7) SLOT(8) SLOT(9)
SLOTS10(1) SLOTS10(2) SLOT(30) SLOT(31) SLOT(32) SLOT(33) SLOT(34) SLOT(35) SLOT(36) SLOT(37) SLOT(38)
SLOTS10(4) SLOT(50) SLOT(52) SLOT(53) SLOT(54) SLOT(55) SLOT(56) SLOT(57) SLOT(58) SLOT(59)
SLOT(60) SLOT(61) SLOT(62) SLOT(63)

#define P(n) (void *)slot_##n
#define P10(t) P(t##0), P(t##1), P(t##2), P(t##3), P(t##4), P(t##5), P(t##6), P(t##7), P(t##8), P(t##9)
void *fake_export_context_table[CONTEXT_SLOTS] = {
    (void *)(uintptr_t)(CONTEXT_SLOTS * sizeof(void *)),
    P(1), P(2), P(3), (void *)context_number, P(5), P(6), P(7), P(8), P(9),
    P10(1), P10(2),
    P(30), P(31), P(32), P(33), P(34), P(35), P(36), P(37), P(38), (void *)stream_number,
    P10(4),
    P(50), (void *)stream_of_handle, P(52), P(53), P(54), P(55), P(56), P(57), P(58), P(59),
    P(60), P(61), P(62), P(63),
};
