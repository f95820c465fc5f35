/* The container's shared accounting file; see gs_region.h for the protocol. */
#define _GNU_SOURCE
#include "gs_region.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gs_log.h"

static struct gs_region *region;
static int region_fd = -1;
static pthread_mutex_t thread_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_slot *my_slot;
static uint64_t last_reap_ns;

struct gs_region *gs_region_map(void)
{
    return region;
}

int gs_region_ready(void)
{
    return __atomic_load_n(&region, __ATOMIC_ACQUIRE) != NULL;
}

/* Byte 0 of the file is the registration lock; byte GS_LEASE_BASE + i is slot i's lease, held (fcntl write
 * lock) by the process that owns the slot for as long as it lives. */
#define GS_LEASE_BASE 1

/* Threads of this process exclude each other with the mutex, processes with the fcntl lock (per process, and
 * released by the kernel when the holder dies, however it dies). region_fd is only set and read under the
 * mutex. */
void gs_region_lock(void)
{
    pthread_mutex_lock(&thread_lock);
    if (region_fd < 0)
        return;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    while (fcntl(region_fd, F_SETLKW, &fl) != 0) {
        if (errno != EINTR) {
            GS_WARN("cannot lock the accounting file: %s; relying on atomic updates only", strerror(errno));
            break;
        }
    }
}

void gs_region_unlock(void)
{
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    if (region_fd >= 0)
        fcntl(region_fd, F_SETLK, &fl);
    pthread_mutex_unlock(&thread_lock);
}

/* The accounting file must be a plain file of its own: not a symlink (O_NOFOLLOW), not a hard link to another
 * container's file, not a device or FIFO. 0, or -1 with the reason logged. */
static int check_file(int fd, const char *path)
{
    struct stat st;
    /* The system call, not glibc's fstat: that symbol is versioned 2.33, and the shim loads down to 2.17. */
    if (syscall(SYS_fstat, fd, &st) != 0) {
        GS_ERROR("cannot stat the accounting file %s: %s", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
        GS_ERROR("the accounting file %s is not a plain file with one link (remove it; the shim creates it)", path);
        return -1;
    }
    return 0;
}

/* Open, size, map and check the file, all under the mutex (so two threads never open it twice, and no error
 * path closes a descriptor while another thread of this process holds a lock on the file: closing any
 * descriptor of a file drops the process's fcntl locks on it). The file is made 0660 at most (umask applies):
 * the processes of one container share a user or a group, nobody else needs it. */
static int map_file(const char *path, int create)
{
    pthread_mutex_lock(&thread_lock);
    if (region) {
        pthread_mutex_unlock(&thread_lock);
        return 0;
    }
    int rc = -1;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | (create ? O_CREAT : 0), 0660);
    if (fd < 0) {
        if (create || errno == ELOOP)
            GS_ERROR("cannot open the accounting file %s: %s%s", path, strerror(errno),
                     errno == ELOOP ? " (it is a symbolic link; remove it)" : "");
        pthread_mutex_unlock(&thread_lock);
        return -1;
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    while (fcntl(fd, F_SETLKW, &fl) != 0 && errno == EINTR)
        ;
    void *addr = MAP_FAILED;
    if (check_file(fd, path) != 0)
        goto out;
    off_t size = lseek(fd, 0, SEEK_END);
    if (size < 0) {
        GS_ERROR("cannot size up the accounting file %s: %s", path, strerror(errno));
        goto out;
    }
    if ((size_t)size < sizeof(struct gs_region) && ftruncate(fd, sizeof(struct gs_region)) != 0) {
        GS_ERROR("cannot size the accounting file %s: %s", path, strerror(errno));
        goto out;
    }
    addr = mmap(NULL, sizeof(struct gs_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        GS_ERROR("cannot map the accounting file %s: %s", path, strerror(errno));
        goto out;
    }
    struct gs_region *r = addr;
    if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) == 0) {
        r->version = GS_REGION_VERSION;
        __atomic_store_n(&r->magic, GS_REGION_MAGIC, __ATOMIC_RELEASE);
    }
    if (r->magic != GS_REGION_MAGIC || r->version != GS_REGION_VERSION) {
        GS_ERROR("%s is not a version %u accounting file; remove it when no CUDA process runs", path,
                 GS_REGION_VERSION);
        munmap(addr, sizeof(struct gs_region));
        goto out;
    }
    region_fd = fd;
    __atomic_store_n(&region, r, __ATOMIC_RELEASE);
    rc = 0;
out:
    fl.l_type = F_UNLCK;
    fcntl(fd, F_SETLK, &fl);
    if (rc)
        close(fd); /* never region_fd: nobody else can hold a lock through this descriptor */
    pthread_mutex_unlock(&thread_lock);
    return rc;
}

int gs_region_open(const char *path)
{
    return gs_region_ready() ? 0 : map_file(path, 1);
}

int gs_region_open_existing(const char *path)
{
    return gs_region_ready() ? 0 : map_file(path, 0);
}

/* Slot i's lease: 1 while some other process holds it, 0 when nobody does, -1 when the kernel cannot say. */
static int lease_held(uint32_t i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = GS_LEASE_BASE + (off_t)i, .l_len = 1};
    if (fcntl(region_fd, F_GETLK, &fl) != 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

static int take_lease(uint32_t i)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = GS_LEASE_BASE + (off_t)i, .l_len = 1};
    return fcntl(region_fd, F_SETLK, &fl);
}

/* Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot. 0 when unreadable. */
static uint64_t start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p)
        return 0;
    unsigned long long v = 0;
    /* after ")": field 3 (state) ... field 22 (starttime) is the 20th */
    for (int field = 3; field <= 22 && p; field++) {
        p = strchr(p + 1, ' ');
        if (p && field == 22)
            v = strtoull(p + 1, NULL, 10);
    }
    return v;
}

/* A slot is alive while its owner holds its lease: the kernel drops the lease when the owner dies, however
 * it dies, whatever its pid namespace, and a reused pid cannot inherit it. Only when the kernel cannot answer
 * are pid and start time compared, and a process whose start time cannot be read then counts as gone (it is
 * never kept alive forever on a guess). */
static int slot_alive(const struct gs_slot *s, uint32_t i)
{
    int held = lease_held(i);
    if (held >= 0)
        return held;
    pid_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH))
        return 0;
    uint64_t now = start_time(pid);
    return now && s->start_time && now == s->start_time;
}

static int reap_locked(void)
{
    int freed = 0;
    uint32_t n = __atomic_load_n(&region->nslots, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < GS_REGION_SLOTS; i++) {
        struct gs_slot *s = &region->slots[i];
        if (s == my_slot || !__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) || slot_alive(s, i))
            continue;
        for (int d = 0; d < GS_REGION_DEVICES; d++)
            __atomic_store_n(&s->used[d], 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
        freed++;
    }
    return freed;
}

int gs_region_reap(void)
{
    if (!gs_region_ready())
        return 0;
    gs_region_lock();
    int freed = reap_locked();
    gs_region_unlock();
    if (freed)
        GS_INFO("gave back the memory of %d ended process(es)", freed);
    return freed;
}

void gs_region_reap_lazily(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    uint64_t last = __atomic_load_n(&last_reap_ns, __ATOMIC_RELAXED);
    if (now - last < 1000000000ULL || !__atomic_compare_exchange_n(&last_reap_ns, &last, now, 0,
                                                                   __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    gs_region_reap();
}

static struct gs_slot *attach(void)
{
    struct gs_slot *s = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (s || !gs_region_ready())
        return s;
    gs_region_lock();
    if ((s = my_slot)) {
        gs_region_unlock();
        return s;
    }
    reap_locked();
    uint32_t n = __atomic_load_n(&region->nslots, __ATOMIC_ACQUIRE);
    uint32_t i;
    /* A free slot whose lease this process can take (an exiting owner may still hold it for a moment). */
    for (i = 0; i < GS_REGION_SLOTS; i++)
        if (!__atomic_load_n(&region->slots[i].pid, __ATOMIC_ACQUIRE) && take_lease(i) == 0)
            break;
    if (i < GS_REGION_SLOTS) {
        s = &region->slots[i];
        for (int d = 0; d < GS_REGION_DEVICES; d++)
            __atomic_store_n(&s->used[d], 0, __ATOMIC_SEQ_CST);
        s->start_time = start_time(getpid());
        __atomic_store_n(&s->pid, (int32_t)getpid(), __ATOMIC_SEQ_CST);
        if (i >= n)
            __atomic_store_n(&region->nslots, i + 1, __ATOMIC_SEQ_CST);
        __atomic_store_n(&my_slot, s, __ATOMIC_RELEASE);
    } else {
        GS_ERROR("more than %d processes of this container use CUDA at once (or the accounting file cannot be "
                 "locked); allocations are refused", GS_REGION_SLOTS);
    }
    gs_region_unlock();
    return s;
}

uint64_t gs_region_usage(int rd)
{
    if (!gs_region_ready() || rd < 0 || rd >= GS_REGION_DEVICES)
        return 0;
    uint32_t n = __atomic_load_n(&region->nslots, __ATOMIC_SEQ_CST);
    if (n > GS_REGION_SLOTS)
        n = GS_REGION_SLOTS;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += __atomic_load_n(&region->slots[i].used[rd], __ATOMIC_SEQ_CST);
    return total;
}

int gs_region_reserve(int rd, uint64_t bytes, uint64_t limit)
{
    struct gs_slot *s = attach();
    if (!s || rd < 0 || rd >= GS_REGION_DEVICES)
        return -1;
    if (limit && bytes > limit)
        return -1;
    for (int attempt = 0; attempt < 3; attempt++) {
        __atomic_add_fetch(&s->used[rd], bytes, __ATOMIC_SEQ_CST);
        if (!limit)
            return 0;
        uint64_t total = gs_region_usage(rd);
        if (total <= limit)
            return 0;
        __atomic_sub_fetch(&s->used[rd], bytes, __ATOMIC_SEQ_CST);
        /* Over the limit: give back what ended processes held, and retry if that or a racing reservation
         * that has since backed off leaves room. */
        int freed = gs_region_reap();
        if (!freed && gs_region_usage(rd) + bytes > limit)
            return -1;
        sched_yield();
    }
    return -1;
}

void gs_region_release(int rd, uint64_t bytes)
{
    struct gs_slot *s = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (s && rd >= 0 && rd < GS_REGION_DEVICES)
        __atomic_sub_fetch(&s->used[rd], bytes, __ATOMIC_SEQ_CST);
}

int gs_region_device(const char *uuid, int create, uint64_t limit)
{
    if (!gs_region_ready())
        return -1;
    uint32_t n = __atomic_load_n(&region->ndevices, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < GS_REGION_DEVICES; i++) {
        if (!strcasecmp(region->dev[i].uuid, uuid)) {
            if (create)
                __atomic_store_n(&region->dev[i].limit, limit, __ATOMIC_RELAXED);
            return (int)i;
        }
    }
    if (!create)
        return -1;
    gs_region_lock();
    int found = -1;
    n = __atomic_load_n(&region->ndevices, __ATOMIC_ACQUIRE);
    for (uint32_t i = 0; i < n && i < GS_REGION_DEVICES; i++)
        if (!strcasecmp(region->dev[i].uuid, uuid))
            found = (int)i;
    if (found < 0 && n < GS_REGION_DEVICES) {
        snprintf(region->dev[n].uuid, sizeof region->dev[n].uuid, "%s", uuid);
        found = (int)n;
        __atomic_store_n(&region->ndevices, n + 1, __ATOMIC_RELEASE);
    }
    if (found >= 0)
        __atomic_store_n(&region->dev[found].limit, limit, __ATOMIC_RELAXED);
    gs_region_unlock();
    return found;
}

uint64_t gs_region_device_limit(int rd)
{
    if (!gs_region_ready() || rd < 0 || rd >= GS_REGION_DEVICES)
        return 0;
    return __atomic_load_n(&region->dev[rd].limit, __ATOMIC_RELAXED);
}

/* No lock: only this process writes its slot, and clearing the bytes before the pid means a process that picks
 * the freed slot finds it empty. (Taking the lock here could hang the exit of a process whose other thread held
 * it when exit() was called.) */
void gs_region_detach(void)
{
    struct gs_slot *s = __atomic_load_n(&my_slot, __ATOMIC_ACQUIRE);
    if (!s || __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) != (int32_t)getpid())
        return;
    __atomic_store_n(&my_slot, NULL, __ATOMIC_RELEASE);
    for (int d = 0; d < GS_REGION_DEVICES; d++)
        __atomic_store_n(&s->used[d], 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

void gs_region_count_refusal(int rd, uint64_t bytes)
{
    if (!gs_region_ready() || rd < 0 || rd >= GS_REGION_DEVICES)
        return;
    __atomic_add_fetch(&region->stats[rd].refused, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&region->stats[rd].refused_bytes, bytes, __ATOMIC_RELAXED);
}

void gs_region_count_throttled(int rd, uint64_t ns)
{
    if (gs_region_ready() && rd >= 0 && rd < GS_REGION_DEVICES)
        __atomic_add_fetch(&region->stats[rd].throttled_ns, ns, __ATOMIC_RELAXED);
}

struct gs_slot *gs_region_own_slot(void)
{
    return attach();
}

void gs_region_after_fork_child(void)
{
    pthread_mutex_init(&thread_lock, NULL);
    my_slot = NULL;
    last_reap_ns = 0;
}

/* The region registers its own fork handler; a process that ends normally gives its slot back at once (one
 * that is killed is reaped by the others). */
__attribute__((constructor)) static void register_fork_child(void)
{
    pthread_atfork(NULL, NULL, gs_region_after_fork_child);
}

__attribute__((destructor)) static void detach_at_exit(void)
{
    gs_region_detach();
}
