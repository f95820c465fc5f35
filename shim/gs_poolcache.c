/* What stream-ordered pools keep; see gs_poolcache.h. The common case, a pool that keeps nothing (release threshold
 * 0, the default), costs a few loads and no lock or atomic write (nothing at all while no pool has a threshold): its
 * use is not counted then. A pool's use matters
 * only to how much it may keep (threshold - use); counted from 0 when the threshold is raised, it can only make the
 * pool keep, and be charged, more than the driver's. Whatever keeps or reuses memory takes the lock; a fast path
 * racing with it can only charge more, never less (an allocation that misses memory kept a moment earlier reserves
 * anew). */
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
    int dflt[GS_MAX_DEVICES];
    int slots_used; /* slots below this have been used */
} pc = {PTHREAD_MUTEX_INITIALIZER, {{0}}, {0}, 0};
int gs_poolcache_current_ids[GS_MAX_DEVICES];
int gs_poolcache_keepers;

/* A forked child has no pools of its own yet (the parent's belong to the parent's contexts). */
static void child_after_fork(void)
{
    pthread_mutex_init(&pc.lock, NULL);
    for (int i = 0; i < MAX_POOLS; i++)
        __atomic_store_n(&pc.p[i].live, 0, __ATOMIC_RELAXED);
    for (int d = 0; d < GS_MAX_DEVICES; d++)
        pc.dflt[d] = gs_poolcache_current_ids[d] = 0;
    pc.slots_used = 0;
    gs_poolcache_keepers = 0;
}
GS_ON_FORK_CHILD(child_after_fork)

static int id_of(int i)
{
    return (int)((__atomic_load_n(&pc.p[i].gen, __ATOMIC_ACQUIRE) & 0x7fffff) << 8) | (i + 1);
}

/* The pool of an id, NULL when it is gone. */
static struct pool *at(int id)
{
    int i = (id & 0xff) - 1;
    if (id <= 0 || i >= MAX_POOLS || !__atomic_load_n(&pc.p[i].live, __ATOMIC_ACQUIRE) || id_of(i) != id)
        return NULL;
    return &pc.p[i];
}

/* Whether p keeps (or may keep) memory: then its figures change under the lock. */
static int keeping(struct pool *p)
{
    return __atomic_load_n(&p->threshold, __ATOMIC_ACQUIRE) || __atomic_load_n(&p->kept, __ATOMIC_ACQUIRE);
}

static void add_used(struct pool *p, uint64_t bytes)
{
    __atomic_add_fetch(&p->used, bytes, __ATOMIC_RELAXED);
}

static void sub_used(struct pool *p, uint64_t bytes)
{
    uint64_t cur = __atomic_load_n(&p->used, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&p->used, &cur, cur > bytes ? cur - bytes : 0, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

static void set_kept(struct pool *p, uint64_t kept)
{
    __atomic_store_n(&p->kept, kept, __ATOMIC_RELEASE);
}

/* Keep at most what `reserved` (in use + kept) allows; with pc.lock held. Returns what is no longer kept. */
static uint64_t keep_within(struct pool *p, uint64_t reserved)
{
    uint64_t used = __atomic_load_n(&p->used, __ATOMIC_RELAXED);
    uint64_t room = reserved > used ? reserved - used : 0;
    uint64_t excess = p->kept > room ? p->kept - room : 0;
    set_kept(p, p->kept - excess);
    return excess;
}

int gs_poolcache_add(CUmemoryPool handle, int dev)
{
    int id = 0, free_slot = -1;
    pthread_mutex_lock(&pc.lock);
    for (int i = 0; i < MAX_POOLS && !id; i++) {
        if (pc.p[i].live && pc.p[i].handle == handle) {
            __atomic_store_n(&pc.p[i].dev, dev, __ATOMIC_RELAXED);
            id = id_of(i);
        } else if (!pc.p[i].live && free_slot < 0) {
            free_slot = i;
        }
    }
    if (!id && free_slot >= 0) {
        struct pool *p = &pc.p[free_slot];
        __atomic_store_n(&p->handle, handle, __ATOMIC_RELAXED);
        __atomic_store_n(&p->dev, dev, __ATOMIC_RELAXED);
        __atomic_store_n(&p->threshold, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&p->used, 0, __ATOMIC_RELAXED);
        set_kept(p, 0);
        __atomic_store_n(&p->gen, p->gen + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&p->live, 1, __ATOMIC_RELEASE);
        if (free_slot >= pc.slots_used)
            __atomic_store_n(&pc.slots_used, free_slot + 1, __ATOMIC_RELEASE);
        id = id_of(free_slot);
    }
    pthread_mutex_unlock(&pc.lock);
    return id;
}

/* Without the lock (every allocation from a pool asks): a slot is published by its `live` store after its handle
 * and device, and an id read while the slot is being reused no longer matches (at() checks it). */
int gs_poolcache_find(CUmemoryPool handle, int *dev)
{
    int n = __atomic_load_n(&pc.slots_used, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        if (__atomic_load_n(&pc.p[i].live, __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&pc.p[i].handle, __ATOMIC_RELAXED) == handle) {
            int id = id_of(i);
            *dev = __atomic_load_n(&pc.p[i].dev, __ATOMIC_RELAXED);
            return at(id) ? id : 0;
        }
    }
    return 0;
}

void gs_poolcache_set_default(int dev, int id)
{
    if (dev < 0 || dev >= GS_MAX_DEVICES)
        return;
    __atomic_store_n(&pc.dflt[dev], id, __ATOMIC_RELEASE);
    int none = 0;
    __atomic_compare_exchange_n(&gs_poolcache_current_ids[dev], &none, id, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

int gs_poolcache_default(int dev)
{
    return dev >= 0 && dev < GS_MAX_DEVICES ? __atomic_load_n(&pc.dflt[dev], __ATOMIC_ACQUIRE) : 0;
}

void gs_poolcache_set_current(int dev, int id)
{
    if (dev >= 0 && dev < GS_MAX_DEVICES)
        __atomic_store_n(&gs_poolcache_current_ids[dev], id, __ATOMIC_RELEASE);
}


uint64_t gs_poolcache_take(int id, uint64_t bytes)
{
    struct pool *p = at(id);
    if (!p || !keeping(p))
        return 0;
    add_used(p, bytes);
    if (!__atomic_load_n(&p->kept, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&pc.lock);
    uint64_t reused = p->kept < bytes ? p->kept : bytes;
    set_kept(p, p->kept - reused);
    pthread_mutex_unlock(&pc.lock);
    return reused;
}

void gs_poolcache_untake(int id, uint64_t bytes, uint64_t reused)
{
    struct pool *p = at(id);
    if (!p)
        return;
    sub_used(p, bytes);
    if (reused) {
        pthread_mutex_lock(&pc.lock);
        set_kept(p, p->kept + reused);
        pthread_mutex_unlock(&pc.lock);
    }
}

uint64_t gs_poolcache_freed(int id, uint64_t bytes)
{
    struct pool *p = at(id);
    if (!p || !keeping(p))
        return bytes; /* a pool that keeps nothing */
    sub_used(p, bytes);
    pthread_mutex_lock(&pc.lock);
    set_kept(p, p->kept + bytes);
    uint64_t back = keep_within(p, p->threshold);
    pthread_mutex_unlock(&pc.lock);
    return back;
}

uint64_t gs_poolcache_set_threshold(int id, uint64_t threshold)
{
    uint64_t back = 0;
    pthread_mutex_lock(&pc.lock);
    struct pool *p = at(id);
    if (p) {
        uint64_t before = __atomic_exchange_n(&p->threshold, threshold, __ATOMIC_ACQ_REL);
        if (!before != !threshold)
            __atomic_add_fetch(&gs_poolcache_keepers, threshold ? 1 : -1, __ATOMIC_ACQ_REL);
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
        if (__atomic_exchange_n(&p->threshold, 0, __ATOMIC_ACQ_REL))
            __atomic_sub_fetch(&gs_poolcache_keepers, 1, __ATOMIC_ACQ_REL);
        __atomic_store_n(&p->live, 0, __ATOMIC_RELEASE);
        for (int d = 0; d < GS_MAX_DEVICES; d++) {
            int back_to = pc.dflt[d] == id ? 0 : pc.dflt[d]; /* the default pool */
            if (gs_poolcache_current_ids[d] == id)
                __atomic_store_n(&gs_poolcache_current_ids[d], back_to, __ATOMIC_RELEASE);
            if (pc.dflt[d] == id)
                __atomic_store_n(&pc.dflt[d], 0, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&pc.lock);
    return back;
}
