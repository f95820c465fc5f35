/* A driver-API program for the shim's tests of memory that outlives its allocation call: VMM allocations with their
 * handle references and mappings, allocations shared between processes through file descriptors, stream-ordered
 * pools that keep freed memory, and context limits that reserve device memory. Each step prints one JSON line.
 *
 *   gs_vmm MODE STEP...            MODE: gpa (everything through cuGetProcAddress_v2) | dlsym
 *
 * Objects are numbered in the order they were made (handles h0 h1 ..., mappings m0 ..., pools p0 ..., stream-ordered
 * allocations a0 ...); steps name them by number. Sizes take k/m/g suffixes (powers of 1024).
 *   init | ctx D | meminfo | sync | counters | ready | sleep MS
 *   create SIZE            cuMemCreate on the current device -> handle
 *   map H                  reserve an address range and map all of handle H, open it up -> mapping
 *   reserve H TOTAL        reserve TOTAL bytes and map handle H at their start -> mapping
 *   mapnext H M            map handle H right after mapping M (inside a range `reserve` made) -> mapping
 *   release H              cuMemRelease of handle H
 *   unmap M [N]            cuMemUnmap of mapping M (with N: the mappings M..M+N-1, mapped side by side, in one call)
 *   retain M               cuMemRetainAllocationHandle of mapping M's address -> handle
 *   export H               cuMemExportToShareableHandle as a POSIX descriptor: prints pid and fd
 *   import PID FD SIZE     takes descriptor FD of process PID and cuMemImportFromShareableHandle -> handle (of
 *                          SIZE bytes)
 *   pool THRESHOLD         cuMemPoolCreate on the current device with that release threshold -> pool
 *   defaultpool THRESHOLD  the device's default pool, its release threshold set -> pool
 *   setpool P              cuDeviceSetMemPool(current device, pool P)
 *   palloc P SIZE          cuMemAllocFromPoolAsync from pool P -> allocation    async SIZE   cuMemAllocAsync
 *   afree A                cuMemFreeAsync of allocation A      trim P KEEP   cuMemPoolTrimTo
 *   setthreshold P VALUE   pool P's release threshold
 *   reserved P             pool P's reserved and used memory   pdestroy P    cuMemPoolDestroy
 *   setlimit L VALUE       cuCtxSetLimit (0 stack, 1 printf FIFO, 2 malloc heap)     getlimit L
 * libcuda: $GS_PROBE_LIBCUDA (default libcuda.so.1). Exit status 0 unless the command line is wrong. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cuda/fake_cuda_counters.h"
#include "gs_cuda_types.h"

#define PROBE_NAME "gs_vmm"
#include "tests/probe_common.h"

#define POSIX_FD 1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
#define RELEASE_THRESHOLD 4
#define RESERVED_MEM_CURRENT 5
#define USED_MEM_CURRENT 7

/* X(field, name, return type, parameters) */
#define VMM_CUDA(X)                                                                                            \
    X(init, cuInit, CUresult, (unsigned))                                                                     \
    X(ctx_retain, cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                                \
    X(ctx_set, cuCtxSetCurrent, CUresult, (CUcontext))                                                         \
    X(sync, cuCtxSynchronize, CUresult, (void))                                                                \
    X(mem_get_info, cuMemGetInfo_v2, CUresult, (size_t *, size_t *))                                          \
    X(create, cuMemCreate, CUresult, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,    \
                                      unsigned long long))                                                     \
    X(release, cuMemRelease, CUresult, (CUmemGenericAllocationHandle))                                        \
    X(reserve, cuMemAddressReserve, CUresult, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(map, cuMemMap, CUresult, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(unmap, cuMemUnmap, CUresult, (CUdeviceptr, size_t))                                                      \
    X(set_access, cuMemSetAccess, CUresult, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t))           \
    X(retain, cuMemRetainAllocationHandle, CUresult, (CUmemGenericAllocationHandle *, void *))               \
    X(export_handle, cuMemExportToShareableHandle, CUresult,                                                  \
      (void *, CUmemGenericAllocationHandle, int, unsigned long long))                                         \
    X(import_handle, cuMemImportFromShareableHandle, CUresult, (CUmemGenericAllocationHandle *, void *, int)) \
    X(pool_create, cuMemPoolCreate, CUresult, (CUmemoryPool *, const CUmemPoolProps *))                       \
    X(pool_destroy, cuMemPoolDestroy, CUresult, (CUmemoryPool))                                               \
    X(pool_set, cuMemPoolSetAttribute, CUresult, (CUmemoryPool, int, void *))                                 \
    X(pool_get, cuMemPoolGetAttribute, CUresult, (CUmemoryPool, int, void *))                                 \
    X(pool_trim, cuMemPoolTrimTo, CUresult, (CUmemoryPool, size_t))                                           \
    X(default_pool, cuDeviceGetDefaultMemPool, CUresult, (CUmemoryPool *, CUdevice))                         \
    X(set_pool, cuDeviceSetMemPool, CUresult, (CUdevice, CUmemoryPool))                                       \
    X(alloc_pool, cuMemAllocFromPoolAsync, CUresult, (CUdeviceptr *, size_t, CUmemoryPool, CUstream))        \
    X(alloc_async, cuMemAllocAsync, CUresult, (CUdeviceptr *, size_t, CUstream))                             \
    X(free_async, cuMemFreeAsync, CUresult, (CUdeviceptr, CUstream))                                          \
    X(set_limit, cuCtxSetLimit, CUresult, (int, size_t))                                                       \
    X(get_limit, cuCtxGetLimit, CUresult, (size_t *, int))

#define FIELD(field, name, ret, params) ret(*field) params;
static struct {
    VMM_CUDA(FIELD)
} cu;
#undef FIELD

struct mapping {
    CUdeviceptr addr;
    size_t size;
};

#define MAX_OBJECTS 4096
static CUmemGenericAllocationHandle handles[MAX_OBJECTS];
static size_t handle_size[MAX_OBJECTS];
static struct mapping mappings[MAX_OBJECTS];
static CUmemoryPool pools[MAX_OBJECTS];
static CUdeviceptr allocations[MAX_OBJECTS];
static int nhandles, nmappings, npools, nallocations;
static int device;
static void *libcuda;

/* The base name cuGetProcAddress takes: the exported name without its _v2 suffix. */
static void *by_proc_address(gpa_fn gpa, const char *name)
{
    char base[64];
    snprintf(base, sizeof base, "%s", name);
    char *v = strstr(base, "_v2");
    if (v && !v[3])
        *v = '\0';
    void *p = NULL;
    CUdriverProcAddressQueryResult status;
    gpa(base, &p, 12080, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
    return p;
}

static void load(const char *mode)
{
    const char *path = getenv("GS_PROBE_LIBCUDA");
    libcuda = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!libcuda)
        die("cannot load libcuda: %s", dlerror());
    if (!strcmp(mode, "dlsym")) {
#define TAKE(field, name, ret, params) cu.field = (ret(*) params)dlsym(libcuda, #name);
        VMM_CUDA(TAKE)
#undef TAKE
        return;
    }
    if (strcmp(mode, "gpa"))
        die("unknown mode %s (gpa, dlsym)", mode);
    gpa_fn gpa = (gpa_fn)dlsym(libcuda, "cuGetProcAddress_v2");
    if (!gpa)
        die("no cuGetProcAddress_v2 in %s", "libcuda");
#define TAKE(field, name, ret, params) cu.field = (ret(*) params)by_proc_address(gpa, #name);
    VMM_CUDA(TAKE)
#undef TAKE
}

static int index_arg(const char *s, int count, const char *what)
{
    int i = atoi(s);
    if (i < 0 || i >= count)
        die("no such %s", what);
    return i;
}

static CUmemAllocationProp device_prop(void)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = POSIX_FD;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    return prop;
}

/* Map all of handle h at a new address range, readable and writable from the current device. */
static CUresult map_handle(int h, struct mapping *m)
{
    m->size = handle_size[h];
    CUresult rc = cu.reserve(&m->addr, m->size, 0, 0, 0);
    if (!rc)
        rc = cu.map(m->addr, m->size, 0, handles[h], 0);
    if (!rc) {
        struct {
            CUmemLocation location;
            unsigned long long flags;
        } access = {{CU_MEM_LOCATION_TYPE_DEVICE, device}, 3};
        rc = cu.set_access(m->addr, m->size, (const CUmemAccessDesc *)&access, 1);
    }
    return rc;
}

static void new_handle(const char *op, CUresult rc, CUmemGenericAllocationHandle h, size_t size)
{
    int i = -1;
    if (!rc && nhandles < MAX_OBJECTS) {
        i = nhandles++;
        handles[i] = h;
        handle_size[i] = size;
    }
    printf("{\"op\":\"%s\",\"rc\":%d,\"handle\":%d,\"value\":%llu}\n", op, rc, i, (unsigned long long)h);
}

static CUresult set_threshold(CUmemoryPool pool, uint64_t threshold)
{
    cuuint64_t v = threshold;
    return cu.pool_set(pool, RELEASE_THRESHOLD, &v);
}

static void new_pool(const char *op, CUresult rc, CUmemoryPool pool)
{
    int i = -1;
    if (!rc && npools < MAX_OBJECTS)
        pools[i = npools++] = pool;
    printf("{\"op\":\"%s\",\"rc\":%d,\"pool\":%d}\n", op, rc, i);
}

static void new_allocation(const char *op, CUresult rc, CUdeviceptr p)
{
    int i = -1;
    if (!rc && nallocations < MAX_OBJECTS)
        allocations[i = nallocations++] = p;
    printf("{\"op\":\"%s\",\"rc\":%d,\"allocation\":%d}\n", op, rc, i);
}

static void print_counters(void)
{
    int (*get)(struct fake_cuda_counters *, size_t) =
        (int (*)(struct fake_cuda_counters *, size_t))dlsym(libcuda, "fakeCuda_getCounters");
    struct fake_cuda_counters c;
    if (!get || get(&c, sizeof c)) {
        printf("{\"op\":\"counters\",\"rc\":-1}\n");
        return;
    }
    printf("{\"op\":\"counters\",\"rc\":0,\"live_bytes\":%llu,\"mem_oom\":%llu}\n",
           (unsigned long long)c.live_bytes, (unsigned long long)c.mem_oom);
}

/* A copy of another process's descriptor, as if it had been passed over a socket: pidfd_getfd (the same open file,
 * as a real driver's descriptor needs), else /proc/PID/fd/FD opened anew (enough for the fake driver's). */
static int descriptor_of(int pid, int fd)
{
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd >= 0) {
        int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
        close(pidfd);
        if (got >= 0)
            return got;
    }
#endif
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: gs_vmm MODE STEP... (see the source)%s", "");
    setvbuf(stdout, NULL, _IOLBF, 0);
    load(argv[1]);
    for (int i = 2; i < argc; i++) {
        const char *op = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (die("%s needs an argument", op), ""))
        if (!strcmp(op, "init")) {
            printf("{\"op\":\"init\",\"rc\":%d}\n", cu.init(0));
        } else if (!strcmp(op, "ctx")) {
            device = atoi(ARG());
            CUcontext ctx = NULL;
            CUresult rc = cu.ctx_retain(&ctx, device);
            if (!rc)
                rc = cu.ctx_set(ctx);
            printf("{\"op\":\"ctx\",\"rc\":%d}\n", rc);
        } else if (!strcmp(op, "meminfo")) {
            size_t f = 0, t = 0;
            CUresult rc = cu.mem_get_info(&f, &t);
            printf("{\"op\":\"meminfo\",\"rc\":%d,\"free\":%zu,\"total\":%zu,\"used\":%zu}\n", rc, f, t, t - f);
        } else if (!strcmp(op, "sync")) {
            printf("{\"op\":\"sync\",\"rc\":%d}\n", cu.sync());
        } else if (!strcmp(op, "counters")) {
            print_counters();
        } else if (!strcmp(op, "create")) {
            size_t size = size_arg(ARG());
            CUmemAllocationProp prop = device_prop();
            CUmemGenericAllocationHandle h = 0;
            CUresult rc = cu.create(&h, size, &prop, 0);
            new_handle(op, rc, h, size);
        } else if (!strcmp(op, "map")) {
            int h = index_arg(ARG(), nhandles, "handle");
            struct mapping m = {0, 0};
            CUresult rc = map_handle(h, &m);
            int j = -1;
            if (!rc && nmappings < MAX_OBJECTS)
                mappings[j = nmappings++] = m;
            printf("{\"op\":\"map\",\"rc\":%d,\"mapping\":%d}\n", rc, j);
        } else if (!strcmp(op, "mapnext")) {
            /* map handle H right after mapping M (a range reserved large enough by `reserve`) */
            int h = index_arg(ARG(), nhandles, "handle");
            int m = index_arg(ARG(), nmappings, "mapping");
            struct mapping next = {mappings[m].addr + mappings[m].size, handle_size[h]};
            CUresult rc = cu.map(next.addr, next.size, 0, handles[h], 0);
            int j = -1;
            if (!rc && nmappings < MAX_OBJECTS)
                mappings[j = nmappings++] = next;
            printf("{\"op\":\"mapnext\",\"rc\":%d,\"mapping\":%d}\n", rc, j);
        } else if (!strcmp(op, "release")) {
            int h = index_arg(ARG(), nhandles, "handle");
            printf("{\"op\":\"release\",\"rc\":%d}\n", cu.release(handles[h]));
        } else if (!strcmp(op, "unmap")) {
            int m = index_arg(ARG(), nmappings, "mapping");
            int n = i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9' ? atoi(argv[++i]) : 1;
            size_t size = 0;
            for (int k = m; k < m + n && k < nmappings; k++)
                size += mappings[k].size;
            printf("{\"op\":\"unmap\",\"rc\":%d}\n", cu.unmap(mappings[m].addr, size));
        } else if (!strcmp(op, "retain")) {
            int m = index_arg(ARG(), nmappings, "mapping");
            CUmemGenericAllocationHandle h = 0;
            CUresult rc = cu.retain(&h, (void *)(uintptr_t)mappings[m].addr);
            new_handle(op, rc, h, mappings[m].size);
        } else if (!strcmp(op, "export")) {
            int h = index_arg(ARG(), nhandles, "handle");
            int fd = -1;
            CUresult rc = cu.export_handle(&fd, handles[h], POSIX_FD, 0);
            printf("{\"op\":\"export\",\"rc\":%d,\"pid\":%d,\"fd\":%d}\n", rc, (int)getpid(), fd);
        } else if (!strcmp(op, "import")) {
            const char *pid = ARG(), *fdnum = ARG();
            int fd = descriptor_of(atoi(pid), atoi(fdnum));
            CUmemGenericAllocationHandle h = 0;
            CUresult rc = fd < 0 ? CUDA_ERROR_INVALID_VALUE : cu.import_handle(&h, (void *)(intptr_t)fd, POSIX_FD);
            if (fd >= 0)
                close(fd);
            /* the size travels beside the descriptor, as in real programs: here, the exporter's step says it */
            new_handle(op, rc, h, size_arg(ARG()));
        } else if (!strcmp(op, "reserve")) {
            /* a range for `mapnext`: map handle H at its start */
            int h = index_arg(ARG(), nhandles, "handle");
            uint64_t total = size_arg(ARG());
            struct mapping m = {0, handle_size[h]};
            CUresult rc = cu.reserve(&m.addr, total, 0, 0, 0);
            if (!rc)
                rc = cu.map(m.addr, m.size, 0, handles[h], 0);
            int j = -1;
            if (!rc && nmappings < MAX_OBJECTS)
                mappings[j = nmappings++] = m;
            printf("{\"op\":\"reserve\",\"rc\":%d,\"mapping\":%d}\n", rc, j);
        } else if (!strcmp(op, "pool")) {
            uint64_t threshold = size_arg(ARG());
            unsigned char buf[sizeof(CUmemPoolProps)];
            memset(buf, 0, sizeof buf);
            CUmemPoolProps *props = (CUmemPoolProps *)buf;
            props->allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            props->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props->location.id = device;
            CUmemoryPool pool = NULL;
            CUresult rc = cu.pool_create(&pool, props);
            if (!rc)
                rc = set_threshold(pool, threshold);
            new_pool(op, rc, pool);
        } else if (!strcmp(op, "defaultpool")) {
            uint64_t threshold = size_arg(ARG());
            CUmemoryPool pool = NULL;
            CUresult rc = cu.default_pool(&pool, device);
            if (!rc)
                rc = set_threshold(pool, threshold);
            new_pool(op, rc, pool);
        } else if (!strcmp(op, "setpool")) {
            int p = index_arg(ARG(), npools, "pool");
            printf("{\"op\":\"setpool\",\"rc\":%d}\n", cu.set_pool(device, pools[p]));
        } else if (!strcmp(op, "palloc")) {
            int p = index_arg(ARG(), npools, "pool");
            CUdeviceptr d = 0;
            CUresult rc = cu.alloc_pool(&d, size_arg(ARG()), pools[p], NULL);
            new_allocation(op, rc, d);
        } else if (!strcmp(op, "async")) {
            CUdeviceptr d = 0;
            CUresult rc = cu.alloc_async(&d, size_arg(ARG()), NULL);
            new_allocation(op, rc, d);
        } else if (!strcmp(op, "afree")) {
            int a = index_arg(ARG(), nallocations, "allocation");
            printf("{\"op\":\"afree\",\"rc\":%d}\n", cu.free_async(allocations[a], NULL));
        } else if (!strcmp(op, "setthreshold")) {
            int p = index_arg(ARG(), npools, "pool");
            printf("{\"op\":\"setthreshold\",\"rc\":%d}\n", set_threshold(pools[p], size_arg(ARG())));
        } else if (!strcmp(op, "trim")) {
            int p = index_arg(ARG(), npools, "pool");
            printf("{\"op\":\"trim\",\"rc\":%d}\n", cu.pool_trim(pools[p], size_arg(ARG())));
        } else if (!strcmp(op, "reserved")) {
            int p = index_arg(ARG(), npools, "pool");
            cuuint64_t reserved = 0, used = 0;
            CUresult rc = cu.pool_get(pools[p], RESERVED_MEM_CURRENT, &reserved);
            if (!rc)
                rc = cu.pool_get(pools[p], USED_MEM_CURRENT, &used);
            printf("{\"op\":\"reserved\",\"rc\":%d,\"reserved\":%llu,\"used\":%llu}\n", rc,
                   (unsigned long long)reserved, (unsigned long long)used);
        } else if (!strcmp(op, "pdestroy")) {
            int p = index_arg(ARG(), npools, "pool");
            printf("{\"op\":\"pdestroy\",\"rc\":%d}\n", cu.pool_destroy(pools[p]));
        } else if (!strcmp(op, "setlimit")) {
            int limit = atoi(ARG());
            printf("{\"op\":\"setlimit\",\"rc\":%d}\n", cu.set_limit(limit, size_arg(ARG())));
        } else if (!strcmp(op, "getlimit")) {
            size_t v = 0;
            CUresult rc = cu.get_limit(&v, atoi(ARG()));
            printf("{\"op\":\"getlimit\",\"rc\":%d,\"value\":%zu}\n", rc, v);
        } else if (!strcmp(op, "ready")) {
            printf("{\"op\":\"ready\"}\n");
            fflush(stdout);
            char line[16];
            if (!fgets(line, sizeof line, stdin))
                break;
        } else if (!strcmp(op, "sleep")) {
            uint64_t ms = size_arg(ARG());
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else {
            die("unknown step %s", op);
        }
        fflush(stdout);
    }
    return 0;
}
