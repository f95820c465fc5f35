/* Fake driver: cuGetExportTable, the private tables the CUDA runtime asks for by UUID before it makes any call.
 * Their layouts are not published; the slots filled here are the ones the runtime, CuPy and PyTorch reach:
 *   6bd5fb6c  cudart interface: 1 module from a fatbin wrapper, 2 the device's primary context (called before
 *             cuDevicePrimaryCtxRetain), 6 and 8 module from a fatbin with extra arguments
 *   a094798c  runtime callback hooks: 2 and 6 hand out a buffer and its size
 *   c693336e  context-local storage: put, delete, get (no size slot)
 *   42d85a81  tools TLS: 2 the calling thread's current context
 *   263e8860  context checks: 2 (ctx, flags, detail), 3 ()
 *   d4082055  the integrity check (fake_cuda_integrity.c)
 *   21318c60  context: 4 a number that identifies a context (fake_cuda_export_context.c; cuBLASLt's GEMMs)
 * Any other UUID is answered CUDA_ERROR_NOT_FOUND, which the runtime takes as "not offered" (NOT_SUPPORTED would
 * make every runtime call fail). Unreached slots answer CUDA_ERROR_NOT_SUPPORTED instead of jumping to 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_export.h"

#define SIZE_SLOT(n) ((void *)(uintptr_t)((n) * sizeof(void *)))

static CUresult not_supported(void)
{
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* --- cudart interface ------------------------------------------------------------------------------------ */
struct fatbin_wrapper {
    uint32_t magic, version;
    const void *data;
    const void *filename_or_fatbins;
};
#define FATBIN_WRAPPER_MAGIC 0x466243B1u

static CUresult module_from_wrapper(CUmodule *mod, const struct fatbin_wrapper *w)
{
    if (!mod || !w || w->magic != FATBIN_WRAPPER_MAGIC || !w->data)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_module_from_image(mod, w->data);
}

static CUresult cudart_module(CUmodule *mod, const struct fatbin_wrapper *w)
{
    return module_from_wrapper(mod, w);
}

static CUresult cudart_primary_ctx(CUcontext *pctx, CUdevice dev)
{
    return fake_primary_ctx_private(pctx, dev);
}

static CUresult cudart_module_ext1(CUmodule *mod, const struct fatbin_wrapper *w, void *a3, void *a4, unsigned a5)
{
    (void)a3, (void)a4, (void)a5;
    return module_from_wrapper(mod, w);
}

static CUresult cudart_module_ext2(const void *fatbin, CUmodule *mod, void *a3, void *a4, unsigned a5)
{
    (void)a3, (void)a4, (void)a5;
    if (!mod || !fatbin)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_module_from_image(mod, fatbin);
}

static CUresult cudart_nop(void)
{
    return CUDA_SUCCESS;
}

static void *cudart_table[13] = {
    SIZE_SLOT(13),           (void *)cudart_module,      (void *)cudart_primary_ctx,
    (void *)not_supported,   (void *)not_supported,      (void *)not_supported,
    (void *)cudart_module_ext1, (void *)cudart_nop,      (void *)cudart_module_ext2,
    (void *)not_supported,   (void *)not_supported,      (void *)not_supported,
    (void *)not_supported,
};

/* --- runtime callback hooks -------------------------------------------------------------------------------- */
static unsigned char hook_buffer_a[1024], hook_buffer_b[64];

static void hooks_buffer_a(void **p, size_t *n)
{
    if (p)
        *p = hook_buffer_a;
    if (n)
        *n = sizeof hook_buffer_a;
}

static void hooks_buffer_b(void **p, size_t *n)
{
    if (p)
        *p = hook_buffer_b;
    if (n)
        *n = 14;
}

static void *hooks_table[7] = {
    SIZE_SLOT(7), (void *)cudart_nop, (void *)hooks_buffer_a, (void *)cudart_nop,
    (void *)cudart_nop, (void *)cudart_nop, (void *)hooks_buffer_b,
};

/* --- context-local storage: values the runtime keeps per context, keyed by (context, key) -------------------- */
typedef void (*cls_dtor)(CUcontext ctx, void *key, void *value);
struct cls_entry {
    CUcontext ctx;
    void *key, *value;
    cls_dtor dtor;
    struct cls_entry *next;
};
static struct cls_entry *cls_head;
static pthread_mutex_t cls_lock = PTHREAD_MUTEX_INITIALIZER;

static CUcontext cls_ctx(CUcontext ctx)
{
    return ctx ? ctx : (CUcontext)fake_current;
}

static CUresult cls_put(CUcontext ctx, void *key, void *value, cls_dtor dtor)
{
    ctx = cls_ctx(ctx);
    if (!ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&cls_lock);
    struct cls_entry *e = cls_head;
    while (e && !(e->ctx == ctx && e->key == key))
        e = e->next;
    if (!e && (e = calloc(1, sizeof *e)) != NULL) {
        e->ctx = ctx, e->key = key, e->next = cls_head;
        cls_head = e;
    }
    if (e)
        e->value = value, e->dtor = dtor;
    pthread_mutex_unlock(&cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult cls_delete(CUcontext ctx, void *key)
{
    ctx = cls_ctx(ctx);
    pthread_mutex_lock(&cls_lock);
    struct cls_entry **pp = &cls_head;
    while (*pp && !((*pp)->ctx == ctx && (*pp)->key == key))
        pp = &(*pp)->next;
    struct cls_entry *e = *pp;
    if (e)
        *pp = e->next;
    pthread_mutex_unlock(&cls_lock);
    free(e);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult cls_get(void **value, CUcontext ctx, void *key)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    ctx = cls_ctx(ctx);
    pthread_mutex_lock(&cls_lock);
    struct cls_entry *e = cls_head;
    while (e && !(e->ctx == ctx && e->key == key))
        e = e->next;
    *value = e ? e->value : NULL;
    pthread_mutex_unlock(&cls_lock);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static void cls_after_fork(void)
{
    pthread_mutex_init(&cls_lock, NULL);
    cls_head = NULL; /* the parent's entries name its contexts; the child has none */
}
FAKE_ON_FORK_CHILD(cls_after_fork)

static void *cls_table[3] = {(void *)cls_put, (void *)cls_delete, (void *)cls_get};

/* --- tools TLS ----------------------------------------------------------------------------------------------- */
static CUresult tools_current_ctx(CUcontext *out)
{
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUcontext)fake_current;
    return CUDA_SUCCESS;
}

static void *tools_tls_table[4] = {SIZE_SLOT(4), (void *)not_supported, (void *)tools_current_ctx,
                                   (void *)not_supported};

/* --- context checks ------------------------------------------------------------------------------------------ */
static CUresult ctx_check(CUcontext ctx, unsigned *flags, const void **detail)
{
    (void)ctx;
    if (flags)
        *flags = 0;
    if (detail)
        *detail = NULL;
    return CUDA_SUCCESS;
}

static CUresult ctx_check_none(void)
{
    return CUDA_SUCCESS;
}

static void *ctx_checks_table[4] = {SIZE_SLOT(4), (void *)not_supported, (void *)ctx_check, (void *)ctx_check_none};

/* --- integrity ----------------------------------------------------------------------------------------------- */
static void *integrity_table[3] = {SIZE_SLOT(3), (void *)fake_integrity_check, (void *)not_supported};

const void *fake_export_cudart_table(void)
{
    return cudart_table;
}

const void *fake_export_integrity_table(void)
{
    return integrity_table;
}

static const struct {
    unsigned char id[16];
    void **table;
} tables[] = {
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}, cudart_table},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66}, hooks_table},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93}, cls_table},
    {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
     tools_tls_table},
    {{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
     ctx_checks_table},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
     integrity_table},
    {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
     fake_export_context_table},
};

CUresult impl_cuGetExportTable(const void **table, const CUuuid *id)
{
    if (!table || !id)
        return CUDA_ERROR_INVALID_VALUE;
    if (getenv("FAKE_CUDA_TRACE"))
        fprintf(stderr, "fake libcuda: cuGetExportTable(%02x%02x%02x%02x)\n", (unsigned char)id->bytes[0],
                (unsigned char)id->bytes[1], (unsigned char)id->bytes[2], (unsigned char)id->bytes[3]);
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        if (!memcmp(tables[i].id, id->bytes, 16)) {
            *table = tables[i].table;
            return CUDA_SUCCESS;
        }
    }
    *table = NULL;
    return CUDA_ERROR_NOT_FOUND;
}
FAKE_EXPORT(cuGetExportTable)
