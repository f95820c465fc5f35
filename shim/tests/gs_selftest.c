/* The shim's own sources linked into one program with a calloc that can be made to fail, for what the fake
 * driver cannot provoke: the pointer map (growth, deletion, reuse), and an allocation whose entry cannot be
 * recorded (it must be freed again and its charge given back). Built plainly and with sanitizers (make asan).
 *
 *   gs_selftest            (env: the fake driver, GPUSHARE_REAL_LIBCUDA, CUDA_DEVICE_MEMORY_LIMIT)
 * Prints one line per check, "ok ..." or "FAIL ...", and exits 1 when any failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/fake_cuda_counters.h"
#include "gs_account.h"
#include "gs_ptrmap.h"
#include "gs_region.h"

CUresult cuInit(unsigned int flags);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr);

static int failures;
static int fail_calloc;

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size)
{
    return fail_calloc ? NULL : __real_calloc(n, size);
}

static void check(int ok, const char *what)
{
    printf("%s %s\n", ok ? "ok" : "FAIL", what);
    failures += !ok;
}

static void ptrmap_holds_what_was_put(void)
{
    struct gs_ptrmap m = GS_PTRMAP_INIT;
    struct gs_ptr_entry e;
    int ok = 1;
    for (uint64_t k = 1; k <= 5000; k++)
        ok &= gs_ptrmap_put(&m, k * 4096, k, (int)(k % 16), 0) == 0;
    for (uint64_t k = 1; k <= 5000; k += 2) /* every other one out: backward-shift deletion */
        ok &= gs_ptrmap_take(&m, k * 4096, &e) == 1 && e.bytes == k && e.dev == (int)(k % 16);
    for (uint64_t k = 1; k <= 5000; k++)
        ok &= gs_ptrmap_take(&m, k * 4096, &e) == (k % 2 == 0);
    ok &= m.count == 0 && gs_ptrmap_take(&m, 4096, &e) == 0;
    check(ok, "the pointer map gives back exactly what was put, through growth and deletion");
    fail_calloc = 1;
    check(gs_ptrmap_put(&m, 1, 1, 0, 0) == 0, "a map with room needs no memory to insert");
    gs_ptrmap_reset(&m);
    check(gs_ptrmap_put(&m, 1, 1, 0, 0) == -1, "an insert that needs memory it cannot get fails");
    fail_calloc = 0;
    gs_ptrmap_reset(&m);
}

static void untrackable_allocation_is_undone(void)
{
    const char *path = getenv("GPUSHARE_REAL_LIBCUDA");
    void *fake = dlopen(path ? path : "libcuda.so.1", RTLD_NOW);
    CUresult (*set_current)(CUcontext) = fake ? (CUresult(*)(CUcontext))dlsym(fake, "cuCtxSetCurrent") : NULL;
    int (*counters)(struct fake_cuda_counters *, size_t) =
        fake ? (int (*)(struct fake_cuda_counters *, size_t))dlsym(fake, "fakeCuda_getCounters") : NULL;
    CUcontext ctx;
    if (!set_current || !counters || cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || set_current(ctx)) {
        check(0, "the fake driver is reachable (run under the fake node's env)");
        return;
    }
    struct fake_cuda_counters c;
    CUdeviceptr p = 0;
    gs_ptrmap_reset(&gs_pointers); /* empty: the first insert must allocate */
    fail_calloc = 1;
    CUresult rc = cuMemAlloc_v2(&p, 2 << 20);
    fail_calloc = 0;
    counters(&c, sizeof c);
    check(rc == CUDA_ERROR_OUT_OF_MEMORY, "an allocation the shim cannot record is answered out of memory");
    check(c.mem_alloc == 1 && c.live_bytes == 0, "... and what the driver allocated is freed again");
    check(gs_region_usage(gs_devs[0].rd) == 0, "... and its charge is given back");
    rc = cuMemAlloc_v2(&p, 2 << 20);
    check(rc == CUDA_SUCCESS && gs_region_usage(gs_devs[0].rd) == (2 << 20), "the next allocation is charged");
    check(cuMemFree_v2(p) == CUDA_SUCCESS && gs_region_usage(gs_devs[0].rd) == 0, "and its free gives back");
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    ptrmap_holds_what_was_put();
    untrackable_allocation_is_undone();
    return failures ? 1 : 0;
}
