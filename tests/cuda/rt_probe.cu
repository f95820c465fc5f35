// A CUDA runtime program for the shim's tests: each argument is a step, each step prints one JSON line.
// Built with nvcc against static and shared cudart (tests/support/cuda_runtime.py); run over the fake driver, with or
// without the shim. Steps act on the current device (device 0 until a `device` step):
//   init | count | device N (cudaSetDevice) | meminfo | props | alloc MiB | free | freeall | fill MiB | async MiB
//   freeasync | poolfill MiB
//   launchfor MS GRID | copy | nvml | vmm MiB | graph MiB | fork | threads N MiB | library MiB | ready
//   vmmsample MiB (NVIDIA's VMM sample: each page's handle released right after mapping, until one fails)
//   stack KiB (cudaDeviceSetLimit of the stack size, read back) | pools N MiB (N pools that keep everything, each
//   filled with MiB allocations and freed)
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <vector>

#define MiB (1ULL << 20)

__global__ void touch(int *p, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (p && i < n)
        p[i] += 1;
}

static std::vector<void *> held;
static std::vector<void *> held_async;
static cudaStream_t stream;

static void out(const char *op, cudaError_t e, const char *fmt = "", ...)
{
    char extra[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(extra, sizeof extra, fmt, ap);
    va_end(ap);
    printf("{\"op\":\"%s\",\"rc\":%d,\"error\":\"%s\"%s%s}\n", op, (int)e, cudaGetErrorName(e), *extra ? "," : "",
           extra);
    fflush(stdout);
}

static double now_s()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

template <typename T> static T driver(const char *name)
{
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
    return (T)fn;
}

struct thread_arg {
    size_t bytes;
    int count;
    cudaError_t last;
};

static void *thread_fill(void *p)
{
    thread_arg *a = (thread_arg *)p;
    cudaSetDevice(0);
    void *d;
    while ((a->last = cudaMalloc(&d, a->bytes)) == cudaSuccess)
        a->count++;
    cudaGetLastError();
    return NULL;
}

static void nvml_view(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        out("nvml", cudaErrorUnknown, "\"why\":\"no libnvidia-ml.so.1\"");
        return;
    }
    typedef struct { unsigned long long total, free, used; } mem_t;
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*by_index)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*meminfo)(void *, mem_t *) = (int (*)(void *, mem_t *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    void *dev = NULL;
    mem_t m = {0, 0, 0};
    int current = 0;
    cudaGetDevice(&current); /* NVML's index of the current device: the tests set no CUDA_VISIBLE_DEVICES */
    int rc = init();
    if (!rc)
        rc = by_index((unsigned)current, &dev);
    if (!rc)
        rc = meminfo(dev, &m);
    out("nvml", rc ? cudaErrorUnknown : cudaSuccess, "\"nvml_rc\":%d,\"total\":%llu,\"free\":%llu,\"used\":%llu", rc,
        m.total, m.free, m.used);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        if (!strcmp(op, "init")) {
            cudaError_t e = cudaFree(0);
            if (e == cudaSuccess)
                e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
            out(op, e);
        } else if (!strcmp(op, "count")) {
            int n = 0;
            cudaError_t e = cudaGetDeviceCount(&n);
            out(op, e, "\"count\":%d", n);
        } else if (!strcmp(op, "device")) {
            int d = atoi(argv[++i]);
            out(op, cudaSetDevice(d), "\"device\":%d", d);
        } else if (!strcmp(op, "meminfo")) {
            size_t f = 0, t = 0;
            cudaError_t e = cudaMemGetInfo(&f, &t);
            out(op, e, "\"free\":%zu,\"total\":%zu", f, t);
        } else if (!strcmp(op, "props")) {
            cudaDeviceProp p = {};
            int d = 0;
            cudaError_t e = cudaGetDevice(&d);
            if (e == cudaSuccess)
                e = cudaGetDeviceProperties(&p, d);
            out(op, e, "\"name\":\"%s\",\"sms\":%d,\"major\":%d,\"minor\":%d,\"total\":%zu,\"l2\":%d,\"smem_sm\":%zu",
                p.name, p.multiProcessorCount, p.major, p.minor, p.totalGlobalMem, p.l2CacheSize,
                p.sharedMemPerMultiprocessor);
        } else if (!strcmp(op, "alloc")) {
            void *d = NULL;
            cudaError_t e = cudaMalloc(&d, strtoull(argv[++i], NULL, 10) * MiB);
            if (e == cudaSuccess)
                held.push_back(d);
            cudaGetLastError();
            out(op, e, "\"ptr\":%llu", (unsigned long long)(uintptr_t)d);
        } else if (!strcmp(op, "free")) {
            cudaError_t e = held.empty() ? cudaErrorInvalidValue : cudaFree(held.back());
            if (!held.empty())
                held.pop_back();
            out(op, e);
        } else if (!strcmp(op, "freeall")) {
            cudaError_t e = cudaSuccess;
            for (void *p : held)
                if (cudaFree(p) != cudaSuccess)
                    e = cudaErrorInvalidValue;
            held.clear();
            for (void *p : held_async)
                if (cudaFreeAsync(p, stream) != cudaSuccess)
                    e = cudaErrorInvalidValue;
            held_async.clear();
            cudaStreamSynchronize(stream);
            out(op, e);
        } else if (!strcmp(op, "fill") || !strcmp(op, "async")) {
            size_t bytes = strtoull(argv[++i], NULL, 10) * MiB;
            int n = 0;
            cudaError_t e;
            void *d;
            int async = !strcmp(op, "async");
            while ((e = async ? cudaMallocAsync(&d, bytes, stream) : cudaMalloc(&d, bytes)) == cudaSuccess) {
                (async ? held_async : held).push_back(d);
                n++;
            }
            cudaGetLastError();
            out(op, e, "\"count\":%d", n);
        } else if (!strcmp(op, "poolfill")) {
            // a pool of its own that keeps what is freed (release threshold: no limit), filled to the cap
            cudaMemPoolProps props = {};
            props.allocType = cudaMemAllocationTypePinned;
            props.location.type = cudaMemLocationTypeDevice;
            props.location.id = 0;
            cudaMemPool_t pool;
            cudaError_t e = cudaMemPoolCreate(&pool, &props);
            unsigned long long threshold = ~0ULL, back = 0;
            if (e == cudaSuccess)
                e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
            if (e == cudaSuccess)
                e = cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &back);
            size_t bytes = strtoull(argv[++i], NULL, 10) * MiB;
            int n = 0;
            void *d;
            while (e == cudaSuccess && (e = cudaMallocFromPoolAsync(&d, bytes, pool, stream)) == cudaSuccess) {
                held_async.push_back(d);
                n++;
            }
            cudaGetLastError();
            unsigned long long used = 0;
            cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
            out(op, e, "\"count\":%d,\"threshold\":%llu,\"used\":%llu", n, back, used);
        } else if (!strcmp(op, "launchfor")) {
            double ms = atof(argv[++i]);
            int grid = atoi(argv[++i]);
            double end = now_s() + ms / 1000;
            long n = 0;
            cudaError_t e = cudaSuccess;
            while (e == cudaSuccess && now_s() < end) {
                touch<<<grid, 32>>>(NULL, 0);
                e = cudaGetLastError();
                n++;
            }
            if (e == cudaSuccess)
                e = cudaDeviceSynchronize();
            out(op, e, "\"launches\":%ld", n);
        } else if (!strcmp(op, "copy")) {
            int h[1024], g[1024];
            for (int k = 0; k < 1024; k++)
                h[k] = k * 7 + 1, g[k] = 0;
            int *d = NULL;
            cudaError_t e = cudaMalloc(&d, sizeof h);
            if (e == cudaSuccess)
                e = cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
            if (e == cudaSuccess)
                e = cudaMemcpy(g, d, sizeof g, cudaMemcpyDeviceToHost);
            cudaFree(d);
            out(op, e, "\"same\":%d", !memcmp(h, g, sizeof h));
        } else if (!strcmp(op, "nvml")) {
            nvml_view();
        } else if (!strcmp(op, "vmm")) {
            // PyTorch's expandable segments: reserve a range, then create, map and open up pages as it grows
            typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                         unsigned long long);
            typedef CUresult (*reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
            typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
            typedef CUresult (*access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
            create_t create = driver<create_t>("cuMemCreate");
            reserve_t reserve = driver<reserve_t>("cuMemAddressReserve");
            map_t map = driver<map_t>("cuMemMap");
            access_t access = driver<access_t>("cuMemSetAccess");
            size_t page = strtoull(argv[++i], NULL, 10) * MiB;
            CUdeviceptr base = 0;
            CUresult r = create && reserve && map && access ? reserve(&base, 64ULL << 30, 0, 0, 0)
                                                             : CUDA_ERROR_NOT_FOUND;
            CUmemAllocationProp prop = {};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            CUmemAccessDesc desc = {};
            desc.location = prop.location;
            desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            int n = 0;
            while (r == CUDA_SUCCESS) {
                CUmemGenericAllocationHandle h;
                if ((r = create(&h, page, &prop, 0)) != CUDA_SUCCESS)
                    break;
                if ((r = map(base + n * page, page, 0, h, 0)) != CUDA_SUCCESS)
                    break;
                if ((r = access(base + n * page, page, &desc, 1)) != CUDA_SUCCESS)
                    break;
                n++;
            }
            out(op, cudaSuccess, "\"driver_rc\":%d,\"count\":%d", (int)r, n);
        } else if (!strcmp(op, "vmmsample")) {
            // NVIDIA's VMM sample (cuda-samples vectorAddMMAP): create, reserve, map, release the handle at once
            // (the mapping keeps the memory), open up access; here page after page until one fails
            typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                         unsigned long long);
            typedef CUresult (*reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
            typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
            typedef CUresult (*release_t)(CUmemGenericAllocationHandle);
            typedef CUresult (*access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
            create_t create = driver<create_t>("cuMemCreate");
            reserve_t reserve = driver<reserve_t>("cuMemAddressReserve");
            map_t map = driver<map_t>("cuMemMap");
            release_t release = driver<release_t>("cuMemRelease");
            access_t access = driver<access_t>("cuMemSetAccess");
            size_t page = strtoull(argv[++i], NULL, 10) * MiB;
            CUmemAllocationProp prop = {};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = 0;
            CUmemAccessDesc desc = {};
            desc.location = prop.location;
            desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            CUresult r = create && reserve && map && release && access ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
            int n = 0;
            while (r == CUDA_SUCCESS && n < 100000) {
                CUmemGenericAllocationHandle h;
                CUdeviceptr va = 0;
                if ((r = create(&h, page, &prop, 0)) != CUDA_SUCCESS)
                    break;
                if ((r = reserve(&va, page, 0, 0, 0)) == CUDA_SUCCESS && (r = map(va, page, 0, h, 0)) == CUDA_SUCCESS)
                    r = release(h);
                if (r == CUDA_SUCCESS && (r = access(va, page, &desc, 1)) == CUDA_SUCCESS)
                    n++;
            }
            out(op, cudaSuccess, "\"driver_rc\":%d,\"count\":%d", (int)r, n);
        } else if (!strcmp(op, "stack")) {
            size_t want = strtoull(argv[++i], NULL, 10) * 1024, now = 0;
            cudaError_t e = cudaDeviceSetLimit(cudaLimitStackSize, want);
            cudaGetLastError();
            cudaDeviceGetLimit(&now, cudaLimitStackSize);
            out(op, e, "\"stack\":%zu", now);
        } else if (!strcmp(op, "pools")) {
            int npools = atoi(argv[++i]);
            size_t bytes = strtoull(argv[++i], NULL, 10) * MiB;
            char counts[256] = "";
            cudaError_t e = cudaSuccess;
            for (int k = 0; k < npools && e == cudaSuccess; k++) {
                cudaMemPoolProps props = {};
                props.allocType = cudaMemAllocationTypePinned;
                props.location.type = cudaMemLocationTypeDevice;
                props.location.id = 0;
                cudaMemPool_t pool;
                unsigned long long keep_all = ~0ULL;
                e = cudaMemPoolCreate(&pool, &props);
                if (e == cudaSuccess)
                    e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all);
                std::vector<void *> got;
                void *d;
                while (e == cudaSuccess && cudaMallocFromPoolAsync(&d, bytes, pool, stream) == cudaSuccess)
                    got.push_back(d);
                cudaGetLastError();
                for (void *p : got)
                    cudaFreeAsync(p, stream);
                cudaStreamSynchronize(stream);
                snprintf(counts + strlen(counts), sizeof counts - strlen(counts), "%s%zu", k ? "," : "", got.size());
            }
            out(op, e, "\"counts\":[%s]", counts);
        } else if (!strcmp(op, "graph")) {
            // a graph that allocates (a memory node captured from cudaMallocAsync), instantiated and launched
            size_t bytes = strtoull(argv[++i], NULL, 10) * MiB;
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            void *d = NULL;
            cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
            if (e == cudaSuccess)
                e = cudaMallocAsync(&d, bytes, stream);
            cudaError_t end = cudaStreamEndCapture(stream, &graph);
            if (e == cudaSuccess)
                e = end;
            if (e == cudaSuccess)
                e = cudaGraphInstantiate(&exec, graph, 0);
            if (e == cudaSuccess)
                e = cudaGraphLaunch(exec, stream);
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(stream);
            cudaGetLastError();
            out(op, e);
        } else if (!strcmp(op, "fork")) {
            // a child forked after CUDA started (a data loader's worker): it never uses CUDA and exits
            pid_t pid = fork();
            if (pid == 0)
                _exit(0);
            int status = 0;
            waitpid(pid, &status, 0);
            out(op, WIFEXITED(status) && WEXITSTATUS(status) == 0 ? cudaSuccess : cudaErrorUnknown);
        } else if (!strcmp(op, "threads")) {
            int n = atoi(argv[++i]);
            size_t bytes = strtoull(argv[++i], NULL, 10) * MiB;
            std::vector<pthread_t> t(n);
            std::vector<thread_arg> a(n, thread_arg{bytes, 0, cudaSuccess});
            for (int k = 0; k < n; k++)
                pthread_create(&t[k], NULL, thread_fill, &a[k]);
            int total = 0, all_oom = 1;
            for (int k = 0; k < n; k++) {
                pthread_join(t[k], NULL);
                total += a[k].count;
                all_oom &= a[k].last == cudaErrorMemoryAllocation;
            }
            out(op, all_oom ? cudaErrorMemoryAllocation : cudaErrorUnknown, "\"count\":%d", total);
        } else if (!strcmp(op, "library")) {
            // a kernel image loaded as a library (how CUDA 12/13 runtimes load images); the fake driver's test
            // image "fake-module <bytes>" takes that much device memory
            char image[64];
            snprintf(image, sizeof image, "fake-module %llu", strtoull(argv[++i], NULL, 10) * MiB);
            cudaLibrary_t lib;
            cudaError_t e = cudaLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
            cudaGetLastError();
            out(op, e);
        } else if (!strcmp(op, "ready")) {
            out(op, cudaSuccess);
            char line[16];
            if (!fgets(line, sizeof line, stdin))
                return 1;
        } else {
            fprintf(stderr, "rt_probe: unknown step %s\n", op);
            return 2;
        }
    }
    return 0;
}
