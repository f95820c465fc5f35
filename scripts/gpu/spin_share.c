/* A compute load without PyTorch or the CUDA toolkit: a PTX kernel that spins for a number of GPU clock
 * cycles, JIT-compiled by the driver, launched back to back through cuGetProcAddress_v2 (as the CUDA runtime
 * does). Prints the kernels completed per tick as JSON lines, for spin_share.py and share_containers.py, and
 * at the end the shim's compute-share state when the shim is loaded.
 *   spin_share SECONDS [CYCLES] [TICK_MS]   (CYCLES per kernel, default 200000; TICK_MS default 1000) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "gs_cuda_types.h"

typedef struct CUmod_st *CUmodule;

static const char ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 cycles, .param .u64 out)\n"
    "{\n"
    "  .reg .u64 %start, %now, %limit, %d, %o;\n"
    "  .reg .pred %p;\n"
    "  ld.param.u64 %limit, [cycles];\n"
    "  ld.param.u64 %o, [out];\n"
    "  mov.u64 %start, %clock64;\n"
    "LOOP:\n"
    "  mov.u64 %now, %clock64;\n"
    "  sub.u64 %d, %now, %start;\n"
    "  setp.lt.u64 %p, %d, %limit;\n"
    "  @%p bra LOOP;\n"
    "  st.global.u64 [%o], %d;\n"
    "  ret;\n"
    "}\n";

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_fn gpa;

static void *get(const char *name)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (gpa(name, &p, 12000, 0, &st) || !p) {
        fprintf(stderr, "spin_share: no %s\n", name);
        exit(1);
    }
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define CHECK(call)                                                      \
    do {                                                                 \
        CUresult rc_ = (call);                                           \
        if (rc_) {                                                       \
            fprintf(stderr, "spin_share: %s failed: %d\n", #call, rc_);  \
            return 1;                                                    \
        }                                                                \
    } while (0)

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    unsigned long long cycles = argc > 2 ? strtoull(argv[2], NULL, 10) : 200000;
    double tick_s = argc > 3 ? atof(argv[3]) / 1000.0 : 1.0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    gpa = lib ? (gpa_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        fprintf(stderr, "spin_share: cannot load libcuda.so.1\n");
        return 1;
    }
    CUresult (*init)(unsigned) = get("cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) = get("cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = get("cuCtxSetCurrent");
    CUresult (*attr)(int *, int, CUdevice) = get("cuDeviceGetAttribute");
    CUresult (*load)(CUmodule *, const void *) = get("cuModuleLoadData");
    CUresult (*function)(CUfunction *, CUmodule, const char *) = get("cuModuleGetFunction");
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                       void **, void **) = get("cuLaunchKernel");
    CUresult (*sync)(void) = get("cuCtxSynchronize");
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr out;
    int sms = 0;
    CHECK(init(0));
    CHECK(retain(&ctx, 0));
    CHECK(set(ctx));
    CHECK(attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
    CHECK(load(&mod, ptx));
    CHECK(function(&fn, mod, "spin"));
    CHECK(alloc(&out, 64));
    void *params[] = {&cycles, &out};
    unsigned grid = (unsigned)sms * 4;
    double start = now(), tick = start + tick_s;
    long done = 0;
    while (now() < start + seconds) {
        for (int i = 0; i < 4; i++)
            CHECK(launch(fn, grid, 1, 1, 128, 1, 1, 0, NULL, params, NULL));
        CHECK(sync());
        done += 4;
        if (now() >= tick) {
            printf("{\"op\":\"second\",\"kernels\":%ld,\"t\":%.3f}\n", done, now() - start);
            fflush(stdout);
            done = 0;
            tick += tick_s;
        }
    }
    struct {
        long long rate;
        unsigned long long spent, draws, waits;
        int active, sm_limit, allowed, used_pct, gpu_pct, nvml_pid;
    } st;
    int (*stats)(int, void *, size_t) = (int (*)(int, void *, size_t))dlsym(RTLD_DEFAULT, "gpushare_share_stats");
    if (stats && stats(0, &st, sizeof st) == 0)
        printf("{\"op\":\"share\",\"active\":%d,\"allowed\":%d,\"used_pct\":%d,\"gpu_pct\":%d,\"nvml_pid\":%d,"
               "\"pid\":%d,\"waits\":%llu}\n", st.active, st.allowed, st.used_pct, st.gpu_pct, st.nvml_pid,
               (int)getpid(), st.waits);
    return 0;
}
