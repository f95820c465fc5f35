/* The driver's private export tables (cuGetExportTable). The CUDA runtime gets the device's primary context
 * through slot 2 of its "cudart interface" table before it calls cuDevicePrimaryCtxRetain; a driver that creates
 * the context right there does so out of the shim's sight, and the shim could neither charge the context nor
 * learn this process's NVML pid (gs_pidmap.h), which the compute share needs. So slot 2 of that table is
 * replaced, in the driver's own table, by a function that goes through the same steps as the
 * cuDevicePrimaryCtxRetain hook (charge the context, map the pid while it is created) around the driver's slot.
 * In place, not a copy: the runtime's start-up integrity check hashes the table's address. Every other table and
 * slot is the driver's. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gs_context.h"
#include "gs_log.h"

#define GS_TABLE_MAX_SLOTS 64

static const unsigned char cudart_interface[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                                   0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};

typedef CUresult (*gs_primary_ctx_fn)(CUcontext *pctx, CUdevice dev);

static struct {
    pthread_mutex_t lock;
    const void *original;
    gs_primary_ctx_fn primary_ctx;
} table = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL};

static void child_after_fork(void)
{
    pthread_mutex_init(&table.lock, NULL);
}
GS_ON_FORK_CHILD(child_after_fork)

static CUresult primary_ctx(CUcontext *pctx, CUdevice dev)
{
    GS_CONTEXT_HOOK(cuGetExportTable, dev, table.primary_ctx(pctx, dev));
}

/* Put primary_ctx in slot 2 of the driver's table (once per table; the page is made writable for the store when
 * the driver keeps its tables read-only). */
static void interpose(const void *original)
{
    void **slots = (void **)original;
    size_t bytes = (size_t)(uintptr_t)slots[0];
    if (bytes % sizeof(void *) || bytes / sizeof(void *) < 3 || bytes / sizeof(void *) > GS_TABLE_MAX_SLOTS) {
        GS_WARN("the driver's cudart interface table has an unexpected size (%zu bytes); the contexts the runtime "
                "creates through it are not seen by the shim", bytes);
        return;
    }
    pthread_mutex_lock(&table.lock);
    if (table.original != original && slots[2] != (void *)&primary_ctx) {
        long pagesize = sysconf(_SC_PAGESIZE);
        uintptr_t page = (uintptr_t)&slots[2] & ~(uintptr_t)(pagesize - 1);
        int writable = mprotect((void *)page, (size_t)pagesize, PROT_READ | PROT_WRITE) == 0;
        if (writable) {
            table.primary_ctx = (gs_primary_ctx_fn)slots[2];
            __atomic_store_n(&slots[2], (void *)&primary_ctx, __ATOMIC_RELEASE);
            table.original = original;
        } else {
            GS_WARN("cannot hook the runtime's way to the primary context (%s); the contexts it creates are not "
                    "seen by the shim", strerror(errno));
        }
    }
    pthread_mutex_unlock(&table.lock);
}

GS_EXPORT CUresult cuGetExportTable(const void **out, const CUuuid *id)
{
    GS_ENTER_OR_RETURN(cuGetExportTable);
    CUresult rc = gs_cu.cuGetExportTable(out, id);
    if (rc == CUDA_SUCCESS && out && *out && id && !memcmp(id->bytes, cudart_interface, 16))
        interpose(*out);
    return rc;
}
