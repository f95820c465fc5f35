/* Per-call cost of driver entry points, reached as the CUDA runtime reaches them (dlopen + cuGetProcAddress_v2),
 * for bench/shim_overhead.py, which runs it with and without the shim:
 *   gs_bench launch N       N cuLaunchKernel calls (1 block), ns per call
 *   gs_bench alloc N SIZE   N cuMemAlloc_v2 + cuMemFree_v2 pairs of SIZE bytes, ns per pair
 * Prints one JSON line. libcuda: $GS_PROBE_LIBCUDA. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gs_cuda_types.h"

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void *get(gpa_fn gpa, const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, 12080, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st) || !p) {
        fprintf(stderr, "gs_bench: no %s\n", name);
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: gs_bench launch N | alloc N SIZE\n");
        return 2;
    }
    const char *path = getenv("GS_PROBE_LIBCUDA");
    void *h = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW);
    gpa_fn gpa = h ? (gpa_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        fprintf(stderr, "gs_bench: cannot load libcuda\n");
        return 1;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))get(gpa, "cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))get(gpa, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))get(gpa, "cuCtxSetCurrent");
    CUcontext ctx;
    if (init(0) || retain(&ctx, 0) || set(ctx)) {
        fprintf(stderr, "gs_bench: no context\n");
        return 1;
    }
    long n = atol(argv[2]);
    uint64_t t0, t1;
    if (!strcmp(argv[1], "launch")) {
        launch_fn launch = (launch_fn)get(gpa, "cuLaunchKernel");
        for (long i = 0; i < n / 10; i++) /* warm up: the share controller's first measurement */
            launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            if (launch(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
                return 1;
        t1 = now_ns();
    } else if (!strcmp(argv[1], "alloc") && argc == 4) {
        CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))get(gpa, "cuMemAlloc");
        CUresult (*fr)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))get(gpa, "cuMemFree");
        size_t size = strtoull(argv[3], NULL, 10);
        CUdeviceptr p;
        for (long i = 0; i < n / 10; i++)
            if (alloc(&p, size) || fr(p))
                return 1;
        t0 = now_ns();
        for (long i = 0; i < n; i++)
            if (alloc(&p, size) || fr(p))
                return 1;
        t1 = now_ns();
    } else {
        fprintf(stderr, "gs_bench: unknown benchmark %s\n", argv[1]);
        return 2;
    }
    printf("{\"bench\":\"%s\",\"n\":%ld,\"ns_per_call\":%.2f}\n", argv[1], n, (double)(t1 - t0) / (double)n);
    return 0;
}
