/* The fake NVML's interconnect: NVLink islands and the PCIe/NUMA path between two GPUs, from the config's
 * `nvlink=<island>` and `numa=<node>` keys (fakes/README.md).
 *
 * An island is a set of GPUs joined to each other by NVLink: each GPU of an island of k GPUs has k-1 active links,
 * link j reaching the j-th other GPU of its island in index order (a direct GPU-to-GPU link, as on boards without
 * an NVSwitch); its other links, up to NVML_NVLINK_MAX_LINKS, are inactive. A GPU without `nvlink=` has no NVLink:
 * every NVLink call answers NOT_SUPPORTED for it, as NVML does for a PCIe-only card.
 *
 * nvmlDeviceGetTopologyCommonAncestor reports the PCIe path: INTERNAL for a GPU and itself, NODE for two GPUs on
 * the same NUMA node (behind different host bridges of one CPU), SYSTEM across NUMA nodes or where the config does
 * not say (numa=-1). NVLink does not change it, as on a real node (nvidia-smi topo -m shows NV# from the NVLink
 * calls, not from this one).
 */
#include "nvml/nvml_internal.h"

#define NVML_NVLINK_MAX_LINKS 18 /* nvml.h (R535+): links per GPU */
#define NVML_FEATURE_DISABLED 0  /* nvmlEnableState_t, as nvmlDeviceGetNvLinkState reports a link */
#define NVML_FEATURE_ENABLED 1
#define NVML_NVLINK_DEVICE_TYPE_GPU 0x00

typedef enum nvmlGpuLevel_enum {
    NVML_TOPOLOGY_INTERNAL = 0,
    NVML_TOPOLOGY_SINGLE = 10,
    NVML_TOPOLOGY_MULTIPLE = 20,
    NVML_TOPOLOGY_HOSTBRIDGE = 30,
    NVML_TOPOLOGY_NODE = 40,
    NVML_TOPOLOGY_SYSTEM = 50,
} nvmlGpuTopologyLevel_t;

typedef unsigned int nvmlEnableState_t;
typedef unsigned int nvmlIntNvLinkDeviceType_t;

/* The config index of the GPU at the far end of `link` of GPU g; -1 when the link is inactive. */
static int peer_of(const struct fake_gpu_info *g, unsigned link)
{
    const struct fake_gpu_config *cfg = fake_nvml_config();
    unsigned seen = 0;
    for (unsigned i = 0; i < cfg->gpu_count; i++) {
        const struct fake_gpu_info *other = &cfg->gpus[i];
        if (other == g || other->nvlink_island != g->nvlink_island)
            continue;
        if (seen++ == link)
            return (int)i;
    }
    return -1;
}

/* The checks every NVLink call makes, in NVML's order: the handle, the output pointer, whether the GPU has NVLink,
 * the link index. */
static nvmlReturn_t nvlink(nvmlDevice_t dev, unsigned link, const void *out, const struct fake_gpu_info **g)
{
    nvmlReturn_t r = fake_nvml_device(dev, g);
    if (r != NVML_SUCCESS)
        return r;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((*g)->nvlink_island < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return link >= NVML_NVLINK_MAX_LINKS ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, nvmlEnableState_t *isActive)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = nvlink(dev, link, isActive, &g);
    if (r == NVML_SUCCESS)
        *isActive = peer_of(g, link) >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return r;
}

/* The PCI info of the GPU at the far end of an active link; an inactive link has none (NOT_SUPPORTED). */
FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = nvlink(dev, link, pci, &g);
    if (r != NVML_SUCCESS)
        return r;
    int peer = peer_of(g, link);
    if (peer < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return nvmlDeviceGetPciInfo_v3(fake_nvml_handle((unsigned)peer), pci);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, link, pci);
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned int link,
                                                               nvmlIntNvLinkDeviceType_t *type)
{
    const struct fake_gpu_info *g;
    nvmlReturn_t r = nvlink(dev, link, type, &g);
    if (r != NVML_SUCCESS)
        return r;
    if (peer_of(g, link) < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *type = NVML_NVLINK_DEVICE_TYPE_GPU;
    return NVML_SUCCESS;
}

FAKE_NVML_API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                               nvmlGpuTopologyLevel_t *pathInfo)
{
    const struct fake_gpu_info *a, *b;
    nvmlReturn_t r = fake_nvml_device(device1, &a);
    if (r == NVML_SUCCESS)
        r = fake_nvml_device(device2, &b);
    if (r == NVML_SUCCESS && !pathInfo)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r != NVML_SUCCESS)
        return r;
    if (a == b)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (a->numa_node >= 0 && a->numa_node == b->numa_node)
        *pathInfo = NVML_TOPOLOGY_NODE;
    else
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}
