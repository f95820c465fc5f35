/* What stream-ordered pools keep; see gs_poolcache.h. */
#include "gs_poolcache.h"

#include <pthread.h>

#include "gs_config.h"
#include "gs_state.h"

#define MAX_POOLS 64

struct pool {
    CUmemoryPool handle;
    int dev;            /* CUDA ordinal, -1 = not device memory */
    int live;
    uint32_t gen;       /* bumped when the slot is reused: an old id no longer matches */
    uint64_t threshold; /* release threshold */
    uint64_t used;      /* bytes of its allocations in use */
    uint64_t kept;      /* bytes freed into it that it keeps */
};

static struct {
    pthread_mutex_t lock;
    struct pool p[MAX_POOLS];
    int dflt[GS_MAX_DEVICES], current[GS_MAX_DEVICES];
} pc = {PTHREAD_MUTEX_INITIALIZER, {{0}}, {0}, {0}};

/* A forked child has no pools of its own yet (the parent's belong to the parent's contexts). */
static void child_after_fork(void)
{
    pthread_mutex_init(&pc.lock, NULL);
    for (int i = 0; i < MAX_POOLS; i++)
        pc.p[i].live = 0;
    for (int d = 0; d < GS_MAX_DEVICES; d++)
        pc.dflt[d] = pc.current[d] = 0;
}
GS_ON_FORK_CHILD(child_after_fork)

static int id_of(int i)
{
    return (int)((pc.p[i].gen & 0x7fffff) << 8) | (i + 1);
}

/* The pool of an id; with pc.lock held. NULL when it is gone. */
static struct pool *at(int id)
{
    int i = (id & 0xff) - 1;
    if (id <= 0 || i >= MAX_POOLS || !pc.p[i].live || id_of(i) != id)
        return NULL;
    return &pc.p[i];
}

/* Keep at most what `reserved` (in use + kept) allows; with pc.lock held. Returns what is no longer kept. */
static uint64_t keep_within(struct pool *p, uint64_t reserved)
{
    uint64_t room = reserved > p->used ? reserved - p->used : 0;
    uint64_t excess = p->kept > room ? p->kept - room : 0;
    p->kept -= excess;
    return excess;
}

int gs_poolcache_add(CUmemoryPool handle, int dev)
{
    int id = 0, free_slot = -1;
    pthread_mutex_lock(&pc.lock);
    for (int i = 0; i < MAX_POOLS && !id; i++) {
        if (pc.p[i].live && pc.p[i].handle == handle) {
            pc.p[i].dev = dev;
            id = id_of(i);
        } else if (!pc.p[i].live && free_slot < 0) {
            free_slot = i;
        }
    }
    if (!id && free_slot >= 0) {
        struct pool *p = &pc.p[free_slot];
        *p = (struct pool){handle, dev, 1, p->gen + 1, 0, 0, 0};
        id = id_of(free_slot);
    }
    pthread_mutex_unlock(&pc.lock);
    return id;
}

int gs_poolcache_find(CUmemoryPool handle, int *dev)
{
    int id = 0;
    pthread_mutex_lock(&pc.lock);
    for (int i = 0; i < MAX_POOLS && !id; i++) {
        if (pc.p[i].live && pc.p[i].handle == handle) {
            id = id_of(i);
            *dev = pc.p[i].dev;
        }
    }
    pthread_mutex_unlock(&pc.lock);
    return id;
}

void gs_poolcache_set_default(int dev, int id)
{
    if (dev >= 0 && dev < GS_MAX_DEVICES)
        __atomic_store_n(&pc.dflt[dev], id, __ATOMIC_RELEASE);
}

int gs_poolcache_default(int dev)
{
    return dev >= 0 && dev < GS_MAX_DEVICES ? __atomic_load_n(&pc.dflt[dev], __ATOMIC_ACQUIRE) : 0;
}

void gs_poolcache_set_current(int dev, int id)
{
    if (dev >= 0 && dev < GS_MAX_DEVICES)
        __atomic_store_n(&pc.current[dev], id, __ATOMIC_RELEASE);
}

int gs_poolcache_current(int dev)
{
    return dev >= 0 && dev < GS_MAX_DEVICES ? __atomic_load_n(&pc.current[dev], __ATOMIC_ACQUIRE) : 0;
}

uint64_t gs_poolcache_take(int id, uint64_t bytes)
{
    uint64_t reused = 0;
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p) {
        reused = p->kept < bytes ? p->kept : bytes;
        p->kept -= reused;
        p->used += bytes;
    }
    pthread_mutex_unlock(&pc.lock);
    return reused;
}

void gs_poolcache_untake(int id, uint64_t bytes, uint64_t reused)
{
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p) {
        p->used -= bytes <= p->used ? bytes : p->used;
        p->kept += reused;
    }
    pthread_mutex_unlock(&pc.lock);
}

uint64_t gs_poolcache_freed(int id, uint64_t bytes)
{
    uint64_t back = bytes;
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p) {
        p->used -= bytes <= p->used ? bytes : p->used;
        p->kept += bytes;
        back = keep_within(p, p->threshold);
    }
    pthread_mutex_unlock(&pc.lock);
    return back;
}

uint64_t gs_poolcache_set_threshold(int id, uint64_t threshold)
{
    uint64_t back = 0;
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p) {
        p->threshold = threshold;
        back = keep_within(p, threshold);
    }
    pthread_mutex_unlock(&pc.lock);
    return back;
}

uint64_t gs_poolcache_trim(int id, uint64_t keep)
{
    uint64_t back = 0;
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p)
        back = keep_within(p, keep);
    pthread_mutex_unlock(&pc.lock);
    return back;
}

uint64_t gs_poolcache_remove(int id)
{
    uint64_t back = 0;
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p) {
        back = p->kept;
        p->live = 0;
        for (int d = 0; d < GS_MAX_DEVICES; d++)
            if (pc.current[d] == id)
                pc.current[d] = 0;
    }
    pthread_mutex_unlock(&pc.lock);
    return back;
}

int gs_poolcache_dev(int id)
{
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    int dev = p ? p->dev : -1;
    pthread_mutex_unlock(&pc.lock);
    return dev;
}
