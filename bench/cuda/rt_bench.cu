// Per-call cost of CUDA runtime calls, for bench/cuda_runtime_overhead.py: `rt_bench CASE N` prints
// {"case": ..., "n": N, "ns": ns per call}. Cases: malloc (cudaMalloc + cudaFree of 1 MiB), async
// (cudaMallocAsync + cudaFreeAsync of 1 MiB on a stream), launch (an empty <<<1, 32>>> kernel).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__global__ void empty_kernel() {}

static double now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "rt_bench: %s: %s\n", what, cudaGetErrorName(e));
        exit(1);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: rt_bench malloc|async|launch N\n");
        return 2;
    }
    const char *c = argv[1];
    long n = atol(argv[2]);
    cudaStream_t s;
    check(cudaFree(0), "cudaFree(0)");
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    void *p;
    for (int i = 0; i < 100; i++) { // warm up: lazy loading, first context work
        check(cudaMalloc(&p, 1 << 20), "cudaMalloc");
        check(cudaFree(p), "cudaFree");
        empty_kernel<<<1, 32, 0, s>>>();
    }
    double t0 = now_ns();
    if (!strcmp(c, "malloc")) {
        for (long i = 0; i < n; i++) {
            check(cudaMalloc(&p, 1 << 20), "cudaMalloc");
            check(cudaFree(p), "cudaFree");
        }
    } else if (!strcmp(c, "async")) {
        for (long i = 0; i < n; i++) {
            check(cudaMallocAsync(&p, 1 << 20, s), "cudaMallocAsync");
            check(cudaFreeAsync(p, s), "cudaFreeAsync");
        }
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    } else if (!strcmp(c, "launch")) {
        for (long i = 0; i < n; i++)
            empty_kernel<<<1, 32, 0, s>>>();
        check(cudaGetLastError(), "launch");
        check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    } else {
        fprintf(stderr, "rt_bench: unknown case %s\n", c);
        return 2;
    }
    printf("{\"case\":\"%s\",\"n\":%ld,\"ns\":%.1f}\n", c, n, (now_ns() - t0) / n);
    return 0;
}
