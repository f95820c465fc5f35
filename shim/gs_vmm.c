/* The virtual memory API (cuMemCreate and what keeps its memory alive). The driver frees a physical allocation only
 * when every reference to it is gone: its handle references (cuMemCreate, cuMemRetainAllocationHandle and
 * cuMemImportFromShareableHandle give one, cuMemRelease drops one) and its mappings (cuMemMap adds one, cuMemUnmap
 * drops those in its range). NVIDIA's own VMM sample releases the handle right after mapping. So the charge belongs
 * to the allocation, not to the call: reserved at cuMemCreate, given back when its last reference goes.
 *
 * Sharing between processes: a shareable handle (cuMemExportToShareableHandle: a file descriptor, or a fabric
 * handle) is one more reference, which lives wherever it is passed and which the shim cannot see closed; an
 * exported allocation therefore stays charged to the process that made it until that process ends. A shareable
 * handle does not say which allocation it is (a real driver's descriptor is one more open file of the driver's
 * device), so an importing process cannot tell whether a process of its own container holds the same memory:
 * memory imported is charged to the importer too, for what it maps (the driver does not say the size of an
 * imported allocation), for as long as its own references last. */
#include <stdlib.h>
#include <string.h>

#include "gs_alloc.h"
#include "gs_log.h"
#include "gs_table.h"

struct phys {           /* a physical allocation this process refers to */
    uint64_t bytes;     /* charged: cuMemCreate's size; for an imported one, the most it has mapped */
    int dev;            /* CUDA ordinal */
    uint32_t refs;      /* handle references held */
    uint32_t maps;      /* live mappings */
    int exported;       /* charged until the process ends */
    int imported;       /* its charge grows with what is mapped */
};

struct mapping {        /* a mapped range, by its start address */
    uint64_t size;
    uint64_t handle;
};

static struct {
    pthread_mutex_t lock;
    struct gs_table phys;     /* handle -> struct phys */
    struct gs_table mappings; /* address -> struct mapping */
} vmm = {PTHREAD_MUTEX_INITIALIZER, GS_TABLE_INIT(struct phys), GS_TABLE_INIT(struct mapping)};

/* A forked child holds none of its parent's allocations. */
static void child_after_fork(void)
{
    pthread_mutex_init(&vmm.lock, NULL);
    gs_table_reset(&vmm.phys);
    gs_table_reset(&vmm.mappings);
}
GS_ON_FORK_CHILD(child_after_fork)

/* Whether p is still referred to; with vmm.lock held. */
static int alive(const struct phys *p)
{
    return p->refs || p->maps || p->exported;
}

/* Drop handle references and mappings of handle h; with vmm.lock held. When nothing refers to the allocation any
 * more it leaves the table: 1 with *gone (the caller gives its charge back after unlocking). */
static int drop(uint64_t h, uint32_t refs, uint32_t maps, struct phys *gone)
{
    struct phys *p = gs_table_get(&vmm.phys, h);
    if (!p)
        return 0;
    p->refs -= refs <= p->refs ? refs : p->refs;
    p->maps -= maps <= p->maps ? maps : p->maps;
    return !alive(p) && gs_table_take(&vmm.phys, h, gone);
}

static void give_back(const struct phys *p)
{
    if (p->bytes)
        gs_alloc_undo(p->dev, p->bytes);
}

/* Record a new allocation of `bytes` (already reserved) on d under h; with vmm.lock not held. -1 when host memory
 * runs out. A handle value still in the table belongs to an allocation the driver has freed since (it reuses
 * values): its charge goes back. */
static int record(uint64_t h, uint64_t bytes, int d, int imported)
{
    pthread_mutex_lock(&vmm.lock);
    struct phys stale = {0, 0, 0, 0, 0, 0};
    int had = gs_table_take(&vmm.phys, h, &stale);
    struct phys *p = gs_table_put(&vmm.phys, h);
    if (p)
        *p = (struct phys){bytes, d, 1, 0, 0, imported};
    pthread_mutex_unlock(&vmm.lock);
    if (had)
        give_back(&stale);
    return p ? 0 : -1;
}

/* cuMemCreate takes physical memory on an explicit location; only device locations count. */
GS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    GS_ENTER_OR_RETURN(cuMemCreate);
    if (!gs_devices_ready() || !gs_any_limit || !handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return gs_cu.cuMemCreate(handle, size, prop, flags);
    int d = prop->location.id, tracked;
    uint64_t charge = gs_charge_size(d, size);
    CUresult rc = gs_alloc_begin(d, charge, &tracked);
    if (rc)
        return rc;
    rc = gs_cu.cuMemCreate(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS || !tracked) {
        if (tracked)
            gs_alloc_undo(d, charge);
        return rc;
    }
    if (record(*handle, charge, d, 0) != 0) {
        GS_WARN("out of host memory: cannot track %llu bytes on CUDA device %d; the allocation is undone",
                (unsigned long long)charge, d);
        gs_cu.cuMemRelease(*handle);
        gs_alloc_undo(d, charge);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

GS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    GS_ENTER_OR_RETURN(cuMemRelease);
    /* The reference goes first, so that a handle value the driver hands out again cannot meet this one. */
    struct phys gone;
    pthread_mutex_lock(&vmm.lock);
    struct phys *p = gs_table_get(&vmm.phys, handle);
    int had = p && p->refs;
    int last = had && drop(handle, 1, 0, &gone);
    pthread_mutex_unlock(&vmm.lock);
    CUresult rc = gs_cu.cuMemRelease(handle);
    if (rc == CUDA_SUCCESS) {
        if (last)
            give_back(&gone);
        return rc;
    }
    if (had) { /* the driver kept the reference: so does the shim */
        pthread_mutex_lock(&vmm.lock);
        p = last ? gs_table_put(&vmm.phys, handle) : gs_table_get(&vmm.phys, handle);
        if (p && last)
            *p = gone;
        if (p)
            p->refs++;
        pthread_mutex_unlock(&vmm.lock);
        if (!p && last)
            GS_WARN("out of host memory: %llu bytes on CUDA device %d stay charged until the process ends",
                    (unsigned long long)gone.bytes, gone.dev);
    }
    return rc;
}

/* A mapping of an imported allocation may reach further than what it has been charged so far: the growth, to be
 * reserved before the driver maps. With vmm.lock held. */
static uint64_t growth(struct phys *p, size_t offset, size_t size)
{
    if (!p->imported)
        return 0;
    uint64_t reach = gs_charge_size(p->dev, (uint64_t)offset + size);
    return reach > p->bytes ? reach - p->bytes : 0;
}

GS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                            unsigned long long flags)
{
    GS_ENTER_OR_RETURN(cuMemMap);
    if (!gs_any_limit)
        return gs_cu.cuMemMap(ptr, size, offset, handle, flags);
    /* The mapping counts before the driver makes it, so that a release meanwhile cannot take it for the last. */
    pthread_mutex_lock(&vmm.lock);
    struct phys *p = gs_table_get(&vmm.phys, handle);
    uint64_t grow = p ? growth(p, offset, size) : 0;
    int d = p ? p->dev : -1;
    if (p) {
        p->maps++;
        p->bytes += grow;
    }
    pthread_mutex_unlock(&vmm.lock);
    if (!p)
        return gs_cu.cuMemMap(ptr, size, offset, handle, flags); /* not device memory the shim charges */
    int tracked = 0;
    CUresult rc = grow ? gs_alloc_begin(d, grow, &tracked) : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS)
        rc = gs_cu.cuMemMap(ptr, size, offset, handle, flags);
    struct mapping *m = NULL;
    struct phys gone;
    int last = 0;
    pthread_mutex_lock(&vmm.lock);
    if (grow && (rc != CUDA_SUCCESS || !tracked) && (p = gs_table_get(&vmm.phys, handle)) != NULL)
        p->bytes -= grow; /* not reserved after all */
    if (rc == CUDA_SUCCESS) {
        struct mapping stale;
        if (gs_table_take(&vmm.mappings, ptr, &stale)) /* unmapped by a way the shim does not see */
            last = drop(stale.handle, 0, 1, &gone);
        if ((m = gs_table_put(&vmm.mappings, ptr)) != NULL)
            *m = (struct mapping){size, handle};
    }
    if (rc == CUDA_SUCCESS && !m && tracked && (p = gs_table_get(&vmm.phys, handle)) != NULL)
        p->bytes -= grow;
    if (rc != CUDA_SUCCESS || !m) /* undo the count */
        last = drop(handle, 0, 1, &gone);
    pthread_mutex_unlock(&vmm.lock);
    if (last)
        give_back(&gone);
    if (rc == CUDA_SUCCESS && !m) {
        GS_WARN("out of host memory: cannot track a mapping on CUDA device %d; the mapping is undone", d);
        gs_cu.cuMemUnmap(ptr, size);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != CUDA_SUCCESS && tracked)
        gs_alloc_undo(d, grow);
    return rc;
}

GS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    GS_ENTER_OR_RETURN(cuMemUnmap);
    if (!gs_any_limit)
        return gs_cu.cuMemUnmap(ptr, size);
    /* The mappings of the range leave the table first (a range may hold many, mapped side by side), so that an
     * address mapped again meanwhile cannot meet them; they are put back if the driver refuses. */
    struct taken {
        uint64_t addr;
        struct mapping m;
    } *taken = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&vmm.lock);
    for (uint64_t a = ptr, end = ptr + size; a < end;) {
        struct mapping m;
        if (n == cap) {
            struct taken *more = realloc(taken, (cap = cap ? cap * 2 : 16) * sizeof *taken);
            if (!more)
                break; /* the rest stays counted: charged too long, never too short */
            taken = more;
        }
        if (!gs_table_take(&vmm.mappings, a, &m))
            break;
        taken[n++] = (struct taken){a, m};
        a += m.size ? m.size : 1;
    }
    pthread_mutex_unlock(&vmm.lock);
    CUresult rc = gs_cu.cuMemUnmap(ptr, size);
    for (size_t i = 0; i < n; i++) {
        struct phys gone;
        pthread_mutex_lock(&vmm.lock);
        int last = 0;
        if (rc == CUDA_SUCCESS) {
            last = drop(taken[i].m.handle, 0, 1, &gone);
        } else {
            struct mapping *m = gs_table_put(&vmm.mappings, taken[i].addr);
            if (m)
                *m = taken[i].m;
            else /* cannot remember it: then nothing will drop its reference, and its charge stays */
                GS_WARN("out of host memory: a mapping stays charged until the process ends");
        }
        pthread_mutex_unlock(&vmm.lock);
        if (last)
            give_back(&gone);
    }
    free(taken);
    return rc;
}

GS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    GS_ENTER_OR_RETURN(cuMemRetainAllocationHandle);
    CUresult rc = gs_cu.cuMemRetainAllocationHandle(handle, addr);
    if (rc != CUDA_SUCCESS || !gs_any_limit || !handle)
        return rc;
    pthread_mutex_lock(&vmm.lock);
    struct phys *p = gs_table_get(&vmm.phys, *handle);
    if (p)
        p->refs++; /* one more reference, to be released */
    pthread_mutex_unlock(&vmm.lock);
    return rc;
}

GS_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                                unsigned long long flags)
{
    GS_ENTER_OR_RETURN(cuMemExportToShareableHandle);
    CUresult rc = gs_cu.cuMemExportToShareableHandle(shareable, handle, type, flags);
    if (rc != CUDA_SUCCESS || !gs_any_limit)
        return rc;
    pthread_mutex_lock(&vmm.lock);
    struct phys *p = gs_table_get(&vmm.phys, handle);
    if (p && !p->exported) {
        p->exported = 1;
        GS_DEBUG("an allocation of %llu bytes on CUDA device %d was exported: it stays charged until this "
                 "process ends", (unsigned long long)p->bytes, p->dev);
    }
    pthread_mutex_unlock(&vmm.lock);
    return rc;
}

/* Memory another process shares: a handle of this process's own, charged for what it maps. */
GS_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *shareable, int type)
{
    GS_ENTER_OR_RETURN(cuMemImportFromShareableHandle);
    CUresult rc = gs_cu.cuMemImportFromShareableHandle(handle, shareable, type);
    if (rc != CUDA_SUCCESS || !gs_devices_ready() || !gs_any_limit || !handle)
        return rc;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if (!gs_cu.cuMemGetAllocationPropertiesFromHandle ||
        gs_cu.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) != CUDA_SUCCESS) {
        GS_ERROR("cannot tell where memory imported through cuMemImportFromShareableHandle lies; refused");
        gs_cu.cuMemRelease(*handle);
        return CUDA_ERROR_NOT_PERMITTED;
    }
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return rc;
    int d = prop.location.id, tracked;
    rc = gs_alloc_begin(d, 0, &tracked); /* a GPU this container may use (and its context charge) */
    if (rc == CUDA_SUCCESS && tracked) {
        pthread_mutex_lock(&vmm.lock);
        struct phys *p = gs_table_get(&vmm.phys, *handle);
        int known = p != NULL; /* this process holds it already: the same handle, one more reference */
        if (known)
            p->refs++;
        pthread_mutex_unlock(&vmm.lock);
        if (!known && record(*handle, 0, d, 1) != 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc != CUDA_SUCCESS) {
        gs_cu.cuMemRelease(*handle);
        *handle = 0;
    }
    return rc;
}
