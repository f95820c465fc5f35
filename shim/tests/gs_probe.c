/* A CUDA program driven from the command line, for the shim's tests: it reaches the driver the way real
 * programs do (see gs_probe.h) and runs a list of steps, printing one JSON object per step on stdout.
 *
 *   gs_probe MODE STEP...        MODE: gpa | gpa-ptsz | dlsym | linked (gs_probe_linked only)
 *
 * Steps (sizes take k/m/g suffixes, powers of 1024):
 *   init                   cuInit + device count          ctx D         retain GPU D's primary context, make current
 *   alloc|managed|async|pool|hostpool|create|createhost SIZE     one allocation of that kind (kept)
 *   pitch W H              cuMemAllocPitch_v2              free / freeall  free the newest / every allocation kept
 *   fill KIND CHUNK        allocate CHUNKs of KIND until one fails; report the bytes obtained
 *   meminfo                cuMemGetInfo_v2                 totalmem D    cuDeviceTotalMem_v2
 *   nvml I                 nvmlDeviceGetMemoryInfo and _v2 of NVML device I (library: $GS_PROBE_LIBNVML)
 *   launch|launchex|coop|graph N GRID                       N launches of GRID blocks
 *   launchfor KIND MS GRID launches of KIND for MS milliseconds, with per-100-ms counts
 *   forkfill N KIND CHUNK  fork N children that each fill; the parent reports what each obtained
 *   hammer T N MAX         T threads each make N random allocations (1 byte..MAX) and frees, keeping up to 8
 *   alloc1 SIZE            the CUDA 3.1 cuMemAlloc (kept)  nocontext     no current context
 *   pitch1 W H             the CUDA 3.1 cuMemAllocPitch (kept; freed by the CUDA 3.1 cuMemFree)
 *   array1 W H FMT CH | array3d1 W H D FMT CH FLAGS    the CUDA 3.1 cuArrayCreate / cuArray3DCreate (kept)
 *   array W H FMT CH | array3d W H D FMT CH FLAGS | mipmap W H D FMT CH LEVELS    an array (kept)
 *   module SIZE            cuModuleLoadData of a fake image whose globals take SIZE (kept; free unloads it)
 *   graphnode SIZE         a memory-allocation node of SIZE on the current GPU in a graph
 *   ipcget                 cuIpcGetMemHandle of the newest allocation (hex)   ipcopen HEX   open one (kept)
 *   lookup NAME VERSION    cuGetProcAddress_v2 of NAME      dlsym NAME    dlsym of NAME in libcuda
 *   counters               the fake driver's counters      stats D       the shim's compute share on GPU D
 *   ready                  print {"op":"ready"} and wait for a line on stdin     sleep MS
 * libcuda: $GS_PROBE_LIBCUDA (default libcuda.so.1). Exit status 0 unless the command line is wrong.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda/fake_cuda_counters.h"
#include "gs_probe.h"

#define PROBE_NAME "gs_probe"
#include "tests/probe_common.h"

#ifdef GS_PROBE_LINKED
#define DECLARE(field, name, base, ret, params) ret name params;
PROBE_CUDA(DECLARE)
#undef DECLARE
#endif

#define FIELD(field, name, base, ret, params) ret(*field) params;
static struct {
    PROBE_CUDA(FIELD)
} cu;
#undef FIELD

static void *libcuda;
static const char *mode;

/* cuGetProcAddress_v2 of "name" (CUDA 12.8) or "name@VERSION". */
static void *lookup(gpa_fn gpa, const char *base, cuuint64_t flags)
{
    char name[128];
    int version = 12080;
    snprintf(name, sizeof name, "%s", base);
    char *at = strchr(name, '@');
    if (at) {
        *at = '\0';
        version = atoi(at + 1);
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult status;
    gpa(name, &p, version, flags, &status);
    return p;
}

static void load(void)
{
    const char *path = getenv("GS_PROBE_LIBCUDA");
    libcuda = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!libcuda)
        die("cannot load libcuda: %s", dlerror());
    if (!strcmp(mode, "linked")) {
#ifdef GS_PROBE_LINKED
#define TAKE(field, name, base, ret, params) cu.field = name;
        PROBE_CUDA(TAKE)
#undef TAKE
        return;
#else
        die("mode %s needs gs_probe_linked", mode);
#endif
    }
    if (!strcmp(mode, "dlsym")) {
#define TAKE(field, name, base, ret, params) cu.field = (ret(*) params)dlsym(libcuda, #name);
        PROBE_CUDA(TAKE)
#undef TAKE
        return;
    }
    cuuint64_t flags;
    if (!strcmp(mode, "gpa"))
        flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    else if (!strcmp(mode, "gpa-ptsz"))
        flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    else
        die("unknown mode %s (gpa, gpa-ptsz, dlsym, linked)", mode);
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) =
        (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
            libcuda, "cuGetProcAddress_v2");
    if (!gpa)
        die("no cuGetProcAddress_v2 in %s", "libcuda");
#define TAKE(field, name, base, ret, params) cu.field = (ret(*) params)lookup(gpa, base, flags);
    PROBE_CUDA(TAKE)
#undef TAKE
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* --- allocations kept by the probe ------------------------------------------------------------------------ */
enum kind { PLAIN, MANAGED, ASYNC, POOL, HOSTPOOL, CREATE, CREATEHOST, PITCH, ALLOC1, ARRAY, MIPMAP, MODULE, IPC };
static const char *const kind_names[] = {"alloc", "managed", "async", "pool", "hostpool", "create", "createhost",
                                         "pitch", "alloc1"};

struct held {
    enum kind kind;
    uint64_t handle; /* pointer, or cuMemCreate handle */
    uint64_t bytes;
};
static struct held *held;
static size_t nheld, capheld;
static CUmemoryPool device_pool, host_pool;
static int current_device;
static CUcontext current_context;

static int kind_of(const char *name)
{
    for (int k = 0; k <= ALLOC1; k++)
        if (!strcmp(kind_names[k], name))
            return k;
    return -1;
}

static CUresult allocate(enum kind kind, uint64_t bytes, uint64_t *handle)
{
    CUdeviceptr p = 0;
    CUresult rc;
    switch (kind) {
    case PLAIN:
        rc = cu.mem_alloc(&p, bytes);
        break;
    case MANAGED:
        rc = cu.mem_alloc_managed(&p, bytes, 1);
        break;
    case ASYNC:
        rc = cu.mem_alloc_async(&p, bytes, NULL);
        break;
    case POOL:
    case HOSTPOOL: {
        CUmemoryPool *pool = kind == POOL ? &device_pool : &host_pool;
        if (!*pool) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = 1;
            props.location.type = kind == POOL ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
            props.location.id = current_device;
            /* the real struct is longer: pass a zeroed buffer of the full size */
            unsigned char buf[128];
            memset(buf, 0, sizeof buf);
            memcpy(buf, &props, sizeof props);
            rc = cu.pool_create(pool, (const CUmemPoolProps *)buf);
            if (rc)
                return rc;
        }
        rc = cu.mem_alloc_pool(&p, bytes, *pool, NULL);
        break;
    }
    case CREATE:
    case CREATEHOST: {
        unsigned char buf[64];
        memset(buf, 0, sizeof buf);
        CUmemAllocationProp *prop = (CUmemAllocationProp *)buf;
        prop->type = 1;
        prop->location.type = kind == CREATE ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
        prop->location.id = current_device;
        CUmemGenericAllocationHandle h = 0;
        rc = cu.mem_create(&h, bytes, prop, 0);
        p = h;
        break;
    }
    case ALLOC1: {
        CUdeviceptr_v1 p1 = 0;
        rc = cu.mem_alloc_v1 ? cu.mem_alloc_v1(&p1, (unsigned int)bytes) : CUDA_ERROR_NOT_FOUND;
        p = p1;
        break;
    }
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    *handle = p;
    return rc;
}

static void keep(enum kind kind, uint64_t handle, uint64_t bytes)
{
    if (nheld == capheld) {
        capheld = capheld ? capheld * 2 : 64;
        held = realloc(held, capheld * sizeof *held);
    }
    held[nheld++] = (struct held){kind, handle, bytes};
}

static CUresult release(const struct held *h)
{
    switch (h->kind) {
    case ASYNC:
    case POOL:
    case HOSTPOOL:
        return cu.mem_free_async(h->handle, NULL);
    case CREATE:
    case CREATEHOST:
        return cu.mem_release(h->handle);
    case ALLOC1:
        return cu.mem_free_v1((CUdeviceptr_v1)h->handle);
    case ARRAY:
        return cu.array_destroy((CUarray)(uintptr_t)h->handle);
    case MIPMAP:
        return cu.mipmap_destroy((CUmipmappedArray)(uintptr_t)h->handle);
    case MODULE:
        return cu.module_unload((CUmodule)(uintptr_t)h->handle);
    case IPC:
        return cu.ipc_close(h->handle);
    default:
        return cu.mem_free(h->handle);
    }
}

static uint64_t fill(enum kind kind, uint64_t chunk, CUresult *last, int *count)
{
    uint64_t total = 0, handle;
    *count = 0;
    while ((*last = allocate(kind, chunk, &handle)) == CUDA_SUCCESS) {
        keep(kind, handle, chunk);
        total += chunk;
        ++*count;
    }
    return total;
}

/* --- launches -------------------------------------------------------------------------------------------------- */
static CUresult launch_one(const char *kind, unsigned grid)
{
    if (!strcmp(kind, "launch"))
        return cu.launch(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(kind, "coop"))
        return cu.launch_coop(NULL, grid, 1, 1, 128, 1, 1, 0, NULL, NULL);
    if (!strcmp(kind, "launchex")) {
        CUlaunchConfig cfg = {grid, 1, 1, 128, 1, 1, 0, NULL, NULL, 0};
        return cu.launch_ex(&cfg, NULL, NULL, NULL);
    }
    if (!strcmp(kind, "graph"))
        return cu.graph_launch(NULL, NULL);
    die("unknown launch kind %s", kind);
    return CUDA_ERROR_INVALID_VALUE;
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
    printf("{\"op\":\"counters\",\"rc\":0");
#define PRINT(name) printf(",\"%s\":%llu", #name, (unsigned long long)c.name);
    FAKE_CUDA_COUNTERS(PRINT)
#undef PRINT
    printf("}\n");
}

struct throttle_stats { /* gs_throttle.h's struct gpushare_throttle_stats */
    int64_t rate;
    uint64_t spent, draws, waits;
    int active, sm_limit;
    int allowed, used_pct, gpu_pct, nvml_pid;
};

static void print_stats(int dev)
{
    int (*get)(int, struct throttle_stats *, size_t) =
        (int (*)(int, struct throttle_stats *, size_t))dlsym(RTLD_DEFAULT, "gpushare_share_stats");
    struct throttle_stats s;
    if (!get || get(dev, &s, sizeof s)) {
        printf("{\"op\":\"stats\",\"shim\":false}\n");
        return;
    }
    printf("{\"op\":\"stats\",\"shim\":true,\"rate\":%lld,\"spent\":%llu,\"draws\":%llu,\"waits\":%llu,"
           "\"active\":%d,\"sm_limit\":%d,\"allowed\":%d,\"used_pct\":%d,\"gpu_pct\":%d,\"nvml_pid\":%d,"
           "\"pid\":%d}\n",
           (long long)s.rate, (unsigned long long)s.spent, (unsigned long long)s.draws,
           (unsigned long long)s.waits, s.active, s.sm_limit, s.allowed, s.used_pct, s.gpu_pct, s.nvml_pid,
           (int)getpid());
}

static void nvml_info(int index)
{
    const char *path = getenv("GS_PROBE_LIBNVML");
    void *h = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        printf("{\"op\":\"nvml\",\"rc\":-1,\"error\":\"cannot load NVML\"}\n");
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*by_index)(unsigned, nvmlDevice_t *) = (int (*)(unsigned, nvmlDevice_t *))dlsym(h,
                                                                                            "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(nvmlDevice_t, nvmlMemory_t *) = (int (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h,
                                                                                             "nvmlDeviceGetMemoryInfo");
    int (*info2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (int (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t dev;
    nvmlMemory_t m = {0, 0, 0};
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = nvmlMemory_v2;
    int rc = init ? init() : -1;
    if (!rc)
        rc = by_index ? by_index((unsigned)index, &dev) : -1;
    int rc1 = rc ? rc : info(dev, &m);
    int rc2 = rc ? rc : info2(dev, &m2);
    printf("{\"op\":\"nvml\",\"rc\":%d,\"total\":%llu,\"free\":%llu,\"used\":%llu,\"rc_v2\":%d,\"total_v2\":%llu,"
           "\"free_v2\":%llu,\"used_v2\":%llu,\"reserved_v2\":%llu}\n",
           rc1, m.total, m.free, m.used, rc2, m2.total, m2.free, m2.used, m2.reserved);
}

struct hammer_job {
    long iterations;
    uint64_t max;
    unsigned seed;
    long ok, oom, other;
};

static void *hammer_thread(void *arg)
{
    struct hammer_job *job = arg;
    CUdeviceptr live[8] = {0};
    unsigned x = job->seed;
    if (cu.ctx_set(current_context))
        return NULL;
    for (long i = 0; i < job->iterations; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        int slot = (int)(x % 8);
        if (live[slot]) {
            cu.mem_free(live[slot]);
            live[slot] = 0;
            continue;
        }
        CUresult rc = cu.mem_alloc(&live[slot], 1 + x % job->max);
        if (rc == CUDA_SUCCESS)
            job->ok++;
        else
            live[slot] = 0, rc == CUDA_ERROR_OUT_OF_MEMORY ? job->oom++ : job->other++;
    }
    for (int k = 0; k < 8; k++)
        if (live[k])
            cu.mem_free(live[k]);
    return NULL;
}

static void hammer(int threads, long iterations, uint64_t max)
{
    pthread_t t[64];
    struct hammer_job jobs[64];
    if (threads > 64)
        threads = 64;
    for (int i = 0; i < threads; i++) {
        jobs[i] = (struct hammer_job){iterations, max, 2463534242u + (unsigned)getpid() * 31u + (unsigned)i * 977u,
                                      0, 0, 0};
        pthread_create(&t[i], NULL, hammer_thread, &jobs[i]);
    }
    long ok = 0, oom = 0, other = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        ok += jobs[i].ok, oom += jobs[i].oom, other += jobs[i].other;
    }
    printf("{\"op\":\"hammer\",\"ok\":%ld,\"oom\":%ld,\"other\":%ld}\n", ok, oom, other);
}

static void forkfill(int n, enum kind kind, uint64_t chunk)
{
    int fds[2];
    if (pipe(fds))
        die("pipe: %s", strerror(errno));
    int go[2];
    if (pipe(go))
        die("pipe: %s", strerror(errno));
    pid_t pids[64];
    for (int i = 0; i < n && i < 64; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(fds[0]);
            close(go[1]);
            char c;
            if (read(go[0], &c, 1) < 0) /* start together */
                _exit(3);
            CUcontext ctx;
            CUresult rc = cu.ctx_retain(&ctx, current_device);
            if (!rc)
                rc = cu.ctx_set(ctx);
            CUresult last = rc;
            int count = 0;
            uint64_t got = rc ? 0 : fill(kind, chunk, &last, &count);
            char line[128];
            int len = snprintf(line, sizeof line, "%d %llu %d\n", (int)getpid(), (unsigned long long)got, last);
            if (write(fds[1], line, (size_t)len) < 0)
                _exit(3);
            pause(); /* hold the memory until the parent ends us */
            _exit(0);
        }
    }
    close(fds[1]);
    close(go[0]);
    close(go[1]); /* EOF releases every child at once */
    FILE *f = fdopen(fds[0], "r");
    printf("{\"op\":\"forkfill\",\"children\":[");
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        int pid, last;
        unsigned long long got;
        if (fscanf(f, "%d %llu %d", &pid, &got, &last) != 3)
            break;
        total += got;
        printf("%s{\"pid\":%d,\"bytes\":%llu,\"rc\":%d}", i ? "," : "", pid, got, last);
    }
    printf("],\"total\":%llu}\n", (unsigned long long)total);
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
    }
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        die("usage: gs_probe MODE STEP... (see the source)%s", "");
    setvbuf(stdout, NULL, _IOLBF, 0);
    mode = argv[1];
    load();
    for (int i = 2; i < argc; i++) {
        const char *op = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (die("%s needs an argument", op), ""))
        int k;
        if (!strcmp(op, "init")) {
            int n = 0;
            CUresult rc = cu.init(0);
            if (!rc)
                rc = cu.device_count(&n);
            printf("{\"op\":\"init\",\"rc\":%d,\"devices\":%d}\n", rc, n);
        } else if (!strcmp(op, "ctx")) {
            current_device = atoi(ARG());
            CUcontext ctx = NULL;
            CUresult rc = cu.ctx_retain(&ctx, current_device);
            if (!rc)
                rc = cu.ctx_set(ctx);
            current_context = ctx;
            printf("{\"op\":\"ctx\",\"rc\":%d,\"device\":%d}\n", rc, current_device);
        } else if ((k = kind_of(op)) >= 0 && k != PITCH) {
            uint64_t bytes = size_arg(ARG()), handle = 0;
            CUresult rc = allocate((enum kind)k, bytes, &handle);
            if (!rc)
                keep((enum kind)k, handle, bytes);
            printf("{\"op\":\"%s\",\"rc\":%d,\"bytes\":%llu}\n", op, rc, (unsigned long long)bytes);
        } else if (!strcmp(op, "pitch")) {
            uint64_t w = size_arg(ARG()), h = size_arg(ARG());
            CUdeviceptr p = 0;
            size_t pitch = 0;
            CUresult rc = cu.mem_alloc_pitch(&p, &pitch, w, h, 4);
            if (!rc)
                keep(PITCH, p, pitch * h);
            printf("{\"op\":\"pitch\",\"rc\":%d,\"pitch\":%zu,\"bytes\":%llu}\n", rc, pitch,
                   (unsigned long long)(pitch * h));
        } else if (!strcmp(op, "pitch1")) {
            unsigned int w = (unsigned int)size_arg(ARG()), h = (unsigned int)size_arg(ARG()), pitch = 0;
            CUdeviceptr_v1 p = 0;
            CUresult rc = cu.mem_alloc_pitch_v1 ? cu.mem_alloc_pitch_v1(&p, &pitch, w, h, 4) : CUDA_ERROR_NOT_FOUND;
            if (!rc)
                keep(ALLOC1, p, (uint64_t)pitch * h);
            printf("{\"op\":\"pitch1\",\"rc\":%d,\"pitch\":%u,\"bytes\":%llu}\n", rc, pitch,
                   (unsigned long long)pitch * h);
        } else if (!strcmp(op, "free")) {
            CUresult rc = nheld ? release(&held[--nheld]) : CUDA_ERROR_INVALID_VALUE;
            printf("{\"op\":\"free\",\"rc\":%d}\n", rc);
        } else if (!strcmp(op, "freeall")) {
            CUresult worst = CUDA_SUCCESS;
            while (nheld) {
                CUresult rc = release(&held[--nheld]);
                if (rc)
                    worst = rc;
            }
            printf("{\"op\":\"freeall\",\"rc\":%d}\n", worst);
        } else if (!strcmp(op, "fill")) {
            int kind = kind_of(ARG());
            if (kind < 0 || kind == PITCH)
                die("fill: unknown kind %s", argv[i]);
            uint64_t chunk = size_arg(ARG());
            CUresult last;
            int count;
            uint64_t got = fill((enum kind)kind, chunk, &last, &count);
            printf("{\"op\":\"fill\",\"rc\":%d,\"bytes\":%llu,\"count\":%d}\n", last, (unsigned long long)got, count);
        } else if (!strcmp(op, "meminfo")) {
            size_t f = 0, t = 0;
            CUresult rc = cu.mem_get_info(&f, &t);
            printf("{\"op\":\"meminfo\",\"rc\":%d,\"free\":%zu,\"total\":%zu}\n", rc, f, t);
        } else if (!strcmp(op, "totalmem")) {
            size_t t = 0;
            CUresult rc = cu.total_mem(&t, atoi(ARG()));
            printf("{\"op\":\"totalmem\",\"rc\":%d,\"total\":%zu}\n", rc, t);
        } else if (!strcmp(op, "nvml")) {
            nvml_info(atoi(ARG()));
        } else if (!strcmp(op, "launch") || !strcmp(op, "launchex") || !strcmp(op, "coop") || !strcmp(op, "graph")) {
            long n = atol(ARG());
            unsigned grid = (unsigned)atol(ARG());
            CUresult rc = CUDA_SUCCESS;
            for (long j = 0; j < n && !rc; j++)
                rc = launch_one(op, grid);
            printf("{\"op\":\"%s\",\"rc\":%d,\"n\":%ld}\n", op, rc, n);
        } else if (!strcmp(op, "launchfor")) {
            const char *kind = ARG();
            uint64_t ms = size_arg(ARG());
            unsigned grid = (unsigned)atol(ARG());
            uint64_t start = now_ns(), end = start + ms * 1000000ULL, next = start + 100000000ULL;
            long n = 0, bucket = 0;
            CUresult rc = CUDA_SUCCESS;
            printf("{\"op\":\"launchfor\",\"per_100ms\":[");
            int first = 1;
            for (uint64_t t = start; t < end && !rc; t = now_ns()) {
                rc = launch_one(kind, grid);
                n++, bucket++;
                if (t >= next) {
                    printf("%s%ld", first ? "" : ",", bucket);
                    first = 0;
                    bucket = 0;
                    next += 100000000ULL;
                }
            }
            printf("],\"rc\":%d,\"n\":%ld,\"seconds\":%.3f}\n", rc, n, (double)(now_ns() - start) / 1e9);
        } else if (!strcmp(op, "forkfill")) {
            int n = atoi(ARG());
            int kind = kind_of(ARG());
            uint64_t chunk = size_arg(ARG());
            fflush(stdout);
            forkfill(n, (enum kind)kind, chunk);
        } else if (!strcmp(op, "hammer")) {
            int threads = atoi(ARG());
            long n = atol(ARG());
            hammer(threads, n, size_arg(ARG()));
        } else if (!strcmp(op, "array1") || !strcmp(op, "array3d1")) {
            /* the CUDA 3.1 entry points: array1 W H FMT CH | array3d1 W H D FMT CH FLAGS */
            CUDA_ARRAY3D_DESCRIPTOR_v1 d3;
            memset(&d3, 0, sizeof d3);
            d3.Width = (unsigned)size_arg(ARG());
            d3.Height = (unsigned)size_arg(ARG());
            if (!strcmp(op, "array3d1"))
                d3.Depth = (unsigned)size_arg(ARG());
            d3.Format = (int)strtol(ARG(), NULL, 0);
            d3.NumChannels = (unsigned)atoi(ARG());
            void *obj = NULL;
            CUresult rc;
            if (!strcmp(op, "array1")) {
                CUDA_ARRAY_DESCRIPTOR_v1 d1 = {d3.Width, d3.Height, d3.Format, d3.NumChannels};
                rc = cu.array_create_v1 ? cu.array_create_v1((CUarray *)&obj, &d1) : CUDA_ERROR_NOT_FOUND;
            } else {
                d3.Flags = (unsigned)strtol(ARG(), NULL, 0);
                rc = cu.array3d_create_v1 ? cu.array3d_create_v1((CUarray *)&obj, &d3) : CUDA_ERROR_NOT_FOUND;
            }
            if (!rc)
                keep(ARRAY, (uintptr_t)obj, 0);
            printf("{\"op\":\"%s\",\"rc\":%d}\n", op, rc);
        } else if (!strcmp(op, "array") || !strcmp(op, "array3d") || !strcmp(op, "mipmap")) {
            CUDA_ARRAY3D_DESCRIPTOR d3;
            memset(&d3, 0, sizeof d3);
            d3.Width = size_arg(ARG());
            d3.Height = size_arg(ARG());
            if (strcmp(op, "array"))
                d3.Depth = size_arg(ARG());
            d3.Format = (int)strtol(ARG(), NULL, 0);
            d3.NumChannels = (unsigned)atoi(ARG());
            unsigned levels = 1;
            if (!strcmp(op, "array3d"))
                d3.Flags = (unsigned)strtol(ARG(), NULL, 0);
            if (!strcmp(op, "mipmap"))
                levels = (unsigned)atoi(ARG());
            CUresult rc;
            void *obj = NULL;
            if (!strcmp(op, "array")) {
                CUDA_ARRAY_DESCRIPTOR d2 = {d3.Width, d3.Height, d3.Format, d3.NumChannels};
                rc = cu.array_create((CUarray *)&obj, &d2);
            } else if (!strcmp(op, "array3d")) {
                rc = cu.array3d_create((CUarray *)&obj, &d3);
            } else {
                rc = cu.mipmap_create((CUmipmappedArray *)&obj, &d3, levels);
            }
            if (!rc)
                keep(strcmp(op, "mipmap") ? ARRAY : MIPMAP, (uintptr_t)obj, 0);
            printf("{\"op\":\"%s\",\"rc\":%d}\n", op, rc);
        } else if (!strcmp(op, "module")) {
            char image[64];
            snprintf(image, sizeof image, "fake-module %llu", (unsigned long long)size_arg(ARG()));
            CUmodule mod = NULL;
            CUresult rc = cu.module_load_data(&mod, image);
            if (!rc)
                keep(MODULE, (uintptr_t)mod, 0);
            printf("{\"op\":\"module\",\"rc\":%d}\n", rc);
        } else if (!strcmp(op, "graphnode")) {
            static CUgraph graph;
            CUresult rc = graph ? CUDA_SUCCESS : cu.graph_create(&graph, 0);
            CUDA_MEM_ALLOC_NODE_PARAMS params;
            memset(&params, 0, sizeof params);
            params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
            params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            params.poolProps.location.id = current_device;
            params.bytesize = size_arg(ARG());
            CUgraphNode node;
            if (!rc)
                rc = cu.graph_add_alloc(&node, graph, NULL, 0, &params);
            printf("{\"op\":\"graphnode\",\"rc\":%d}\n", rc);
        } else if (!strcmp(op, "ipcget")) {
            CUipcMemHandle h;
            memset(&h, 0, sizeof h);
            CUresult rc = nheld ? cu.ipc_get(&h, held[nheld - 1].handle) : CUDA_ERROR_INVALID_VALUE;
            printf("{\"op\":\"ipcget\",\"rc\":%d,\"handle\":\"", rc);
            for (int b = 0; b < CU_IPC_HANDLE_SIZE; b++)
                printf("%02x", (unsigned char)h.reserved[b]);
            printf("\"}\n");
        } else if (!strcmp(op, "ipcopen")) {
            const char *hex = ARG();
            CUipcMemHandle h;
            memset(&h, 0, sizeof h);
            for (int b = 0; b < CU_IPC_HANDLE_SIZE && hex[2 * b] && hex[2 * b + 1]; b++) {
                char byte[3] = {hex[2 * b], hex[2 * b + 1], 0};
                h.reserved[b] = (char)strtol(byte, NULL, 16);
            }
            CUdeviceptr p = 0;
            CUresult rc = cu.ipc_open(&p, h, 1);
            if (!rc)
                keep(IPC, p, 0);
            printf("{\"op\":\"ipcopen\",\"rc\":%d}\n", rc);
        } else if (!strcmp(op, "nocontext")) {
            printf("{\"op\":\"nocontext\",\"rc\":%d}\n", cu.ctx_set(NULL));
        } else if (!strcmp(op, "lookup")) {
            const char *name = ARG();
            int version = atoi(ARG());
            gpa_fn gpa = (gpa_fn)dlsym(libcuda, "cuGetProcAddress_v2");
            void *p = NULL;
            CUdriverProcAddressQueryResult status = -1;
            CUresult rc = gpa ? gpa(name, &p, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) : -1;
            printf("{\"op\":\"lookup\",\"rc\":%d,\"status\":%d,\"found\":%s}\n", rc, status,
                   p ? "true" : "false");
        } else if (!strcmp(op, "dlsym")) {
            const char *name = ARG();
            printf("{\"op\":\"dlsym\",\"found\":%s}\n", dlsym(libcuda, name) ? "true" : "false");
        } else if (!strcmp(op, "counters")) {
            print_counters();
        } else if (!strcmp(op, "stats")) {
            print_stats(atoi(ARG()));
        } else if (!strcmp(op, "sync")) {
            printf("{\"op\":\"sync\",\"rc\":%d}\n", cu.sync());
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
