/* Graph memory nodes (cuGraphAddMemAllocNode, cuGraphAddNode with a memory-allocation node): the memory is
 * taken when the graph runs and stays reserved in the graph's pool until the driver trims it, which the shim
 * cannot see. So it is charged conservatively: when the node is added, and for as long as the process lives.
 * (Stream-ordered allocations captured into a graph are charged the same way: see gs_memory.c.) */
#include "gs_alloc.h"

/* The GPU a graph allocation goes to, from its pool properties: -1 when nothing is accounted. */
static int graph_target(const CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    if (!p || !gs_devices_ready() || !gs_any_limit || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return -1;
    return p->poolProps.location.id;
}

/* Reserve for the node, add it, keep the charge (never given back) or roll back. */
#define GS_GRAPH_NODE(params, call)                                             \
    do {                                                                        \
        int tracked_, d_ = graph_target(params);                                \
        if (d_ < 0)                                                             \
            return (call);                                                      \
        uint64_t charge_ = gs_charge_size(d_, (params)->bytesize);              \
        CUresult rc_ = gs_alloc_begin(d_, charge_, &tracked_);                  \
        if (rc_)                                                                \
            return rc_;                                                         \
        rc_ = (call);                                                           \
        if (rc_ != CUDA_SUCCESS && tracked_)                                    \
            gs_alloc_undo(d_, charge_);                                         \
        return rc_;                                                             \
    } while (0)

GS_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    GS_ENTER_OR_RETURN(cuGraphAddMemAllocNode);
    GS_GRAPH_NODE(params, gs_cu.cuGraphAddMemAllocNode(node, graph, deps, ndeps, params));
}

/* CUgraphNodeParams: the type, then the node's parameters (for a memory allocation, the same struct as above). */
static CUDA_MEM_ALLOC_NODE_PARAMS *alloc_params(CUgraphNodeParams *p)
{
    if (!p || p->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return NULL;
    return (CUDA_MEM_ALLOC_NODE_PARAMS *)(void *)p->reserved1;
}

GS_EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, size_t ndeps,
                                  CUgraphNodeParams *params)
{
    GS_ENTER_OR_RETURN(cuGraphAddNode);
    CUDA_MEM_ALLOC_NODE_PARAMS *p = alloc_params(params);
    if (!p)
        return gs_cu.cuGraphAddNode(node, graph, deps, ndeps, params);
    GS_GRAPH_NODE(p, gs_cu.cuGraphAddNode(node, graph, deps, ndeps, params));
}

GS_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph graph, const CUgraphNode *deps, const void *edges,
                                     size_t ndeps, CUgraphNodeParams *params)
{
    GS_ENTER_OR_RETURN(cuGraphAddNode_v2);
    CUDA_MEM_ALLOC_NODE_PARAMS *p = alloc_params(params);
    if (!p)
        return gs_cu.cuGraphAddNode_v2(node, graph, deps, edges, ndeps, params);
    GS_GRAPH_NODE(p, gs_cu.cuGraphAddNode_v2(node, graph, deps, edges, ndeps, params));
}
