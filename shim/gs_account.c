/* Memory accounting around each allocation; see gs_account.h. */
#include "gs_account.h"

#include "gs_log.h"
#include "gs_poolcache.h"
#include "gs_region.h"

struct gs_ptrmap gs_pointers = GS_PTRMAP_INIT;
static int ctx_charged[GS_MAX_DEVICES]; /* this process's context on the GPU has been charged */

/* A forked child owns none of its parent's allocations or contexts. */
static void child_after_fork(void)
{
    for (int d = 0; d < GS_MAX_DEVICES; d++)
        ctx_charged[d] = 0;
    gs_ptrmap_reset(&gs_pointers);
}
GS_ON_FORK_CHILD(child_after_fork)

uint64_t gs_charge_size(int d, uint64_t bytes)
{
    uint64_t g = d >= 0 && d < gs_ndevs && gs_devs[d].granularity ? gs_devs[d].granularity : 1;
    if (bytes > UINT64_MAX - (g - 1))
        return UINT64_MAX;
    return (bytes + g - 1) & ~(g - 1);
}

static void report_oom(int d, uint64_t bytes)
{
    struct gs_dev *dev = &gs_devs[d];
    gs_region_count_refusal(dev->rd, bytes);
    GS_INFO("out of memory on CUDA device %d: %llu bytes requested, %llu of the limit %llu in use", d,
            (unsigned long long)bytes, (unsigned long long)gs_region_usage(dev->rd), (unsigned long long)dev->limit);
}

CUresult gs_ctx_charge(int d, int *charged_now)
{
    *charged_now = 0;
    if (d < 0 || d >= gs_ndevs)
        return gs_any_limit ? CUDA_ERROR_NOT_PERMITTED : CUDA_SUCCESS;
    struct gs_dev *dev = &gs_devs[d];
    if (dev->blocked)
        return CUDA_ERROR_NOT_PERMITTED;
    if (!dev->limit || !gs_cfg.context_reserve)
        return CUDA_SUCCESS;
    int expected = 0;
    if (__atomic_load_n(&ctx_charged[d], __ATOMIC_ACQUIRE) ||
        !__atomic_compare_exchange_n(&ctx_charged[d], &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return CUDA_SUCCESS;
    if (gs_region_reserve(dev->rd, gs_cfg.context_reserve, dev->limit) != 0) {
        __atomic_store_n(&ctx_charged[d], 0, __ATOMIC_RELEASE);
        report_oom(d, gs_cfg.context_reserve);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *charged_now = 1;
    return CUDA_SUCCESS;
}

void gs_ctx_uncharge(int d)
{
    gs_region_release(gs_devs[d].rd, gs_cfg.context_reserve);
    __atomic_store_n(&ctx_charged[d], 0, __ATOMIC_RELEASE);
}

CUresult gs_alloc_begin(int d, uint64_t bytes, int *tracked)
{
    *tracked = 0;
    if (!gs_any_limit)
        return CUDA_SUCCESS;
    if (d < 0 || d >= gs_ndevs)
        return CUDA_ERROR_NOT_PERMITTED;
    struct gs_dev *dev = &gs_devs[d];
    if (dev->blocked)
        return CUDA_ERROR_NOT_PERMITTED;
    if (!dev->limit)
        return CUDA_SUCCESS;
    int charged_now;
    CUresult rc = gs_ctx_charge(d, &charged_now);
    if (rc)
        return rc;
    if (gs_region_reserve(dev->rd, bytes, dev->limit) != 0) {
        report_oom(d, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *tracked = 1;
    return CUDA_SUCCESS;
}

CUresult gs_alloc_end(CUresult rc, int tracked, int d, uint64_t bytes, struct gs_ptrmap *map, uint64_t key)
{
    if (!tracked)
        return CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) {
        gs_region_release(gs_devs[d].rd, bytes);
        return CUDA_SUCCESS;
    }
    if (gs_ptrmap_put(map, key, bytes, d, 0) != 0) {
        gs_region_release(gs_devs[d].rd, bytes);
        GS_WARN("out of host memory: cannot track %llu bytes on CUDA device %d; the allocation is undone",
                (unsigned long long)bytes, d);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

void gs_alloc_undo(int d, uint64_t bytes)
{
    gs_region_release(gs_devs[d].rd, bytes);
}

int gs_free_begin(struct gs_ptrmap *map, uint64_t key, struct gs_ptr_entry *e)
{
    return gs_any_limit ? gs_ptrmap_take(map, key, e) : 0;
}

void gs_free_entry(const struct gs_ptr_entry *e)
{
    /* Freed into a stream-ordered pool: it stays charged for as long as the pool keeps it. */
    uint64_t back = e->pool && gs_poolcache_any_keeps() ? gs_poolcache_freed(e->pool, e->bytes) : e->bytes;
    if (back)
        gs_region_release(gs_devs[e->dev].rd, back);
}

CUresult gs_pool_alloc_begin(int d, int pool, uint64_t bytes, uint64_t *reused, int *tracked)
{
    *reused = pool && gs_poolcache_any_keeps() ? gs_poolcache_take(pool, bytes) : 0;
    CUresult rc = gs_alloc_begin(d, bytes - *reused, tracked);
    if (rc || !*tracked) { /* nothing accounted: the pool's figures stay as they were */
        if (pool && (*reused || gs_poolcache_any_keeps()))
            gs_poolcache_untake(pool, bytes, *reused);
        *reused = 0;
    }
    return rc;
}

CUresult gs_pool_alloc_end(CUresult rc, int tracked, int d, int pool, uint64_t bytes, uint64_t reused,
                           struct gs_ptrmap *map, uint64_t key)
{
    if (!tracked)
        return CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) {
        if (pool && (reused || gs_poolcache_any_keeps()))
            gs_poolcache_untake(pool, bytes, reused);
        if (bytes > reused)
            gs_region_release(gs_devs[d].rd, bytes - reused);
        return CUDA_SUCCESS;
    }
    if (gs_ptrmap_put(map, key, bytes, d, pool) != 0) {
        struct gs_ptr_entry e = {key, bytes, d, pool};
        gs_free_entry(&e); /* the caller frees it again: into its pool */
        GS_WARN("out of host memory: cannot track %llu bytes on CUDA device %d; the allocation is undone",
                (unsigned long long)bytes, d);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

void gs_free_end(CUresult rc, int had, struct gs_ptrmap *map, const struct gs_ptr_entry *e)
{
    if (!had)
        return;
    if (rc == CUDA_SUCCESS)
        gs_free_entry(e);
    else if (gs_ptrmap_put(map, e->key, e->bytes, e->dev, e->pool) != 0)
        GS_WARN("out of host memory: %llu bytes on CUDA device %d stay charged until the process ends",
                (unsigned long long)e->bytes, e->dev);
}
