/* Fake driver: what a device says about itself. cuDeviceGetAttribute answers every attribute of cuda.h with an
 * A100-like value (cudaGetDeviceProperties reads about a hundred of them and fails on any error); the
 * multiprocessor count, compute capability and PCI location come from the fake NVML config, so NVML, the driver
 * and the runtime's integrity check agree. */
#include <stdio.h>
#include <string.h>

#include "fake_cuda_export.h"

#define ATTR_MAX 150 /* past the newest attribute of cuda.h 13 */

static const int a100[ATTR_MAX + 1] = {
    [1] = 1024, [2] = 1024, [3] = 1024, [4] = 64, [5] = 2147483647, [6] = 65535, [7] = 65535,
    [8] = 49152, [9] = 65536, [10] = 32, [11] = 2147483647, [12] = 65536, [13] = 1410000, [14] = 512,
    [15] = 1, [17] = 0, [18] = 0, [19] = 1, [20] = 0, [21] = 131072, [22] = 131072, [23] = 65536,
    [24] = 16384, [25] = 16384, [26] = 16384, [27] = 32768, [28] = 32768, [29] = 2048, [30] = 512, [31] = 1,
    [32] = 1, [35] = 0, [36] = 1215000, [37] = 5120, [38] = 41943040, [39] = 2048, [40] = 3, [41] = 1,
    [42] = 32768, [43] = 2048, [45] = 32768, [46] = 32768, [47] = 8192, [48] = 8192, [49] = 32768, [51] = 32,
    [52] = 32768, [53] = 32768, [54] = 2046, [55] = 32768, [56] = 131072, [57] = 65536, [58] = 16384,
    [59] = 16384, [60] = 16384, [61] = 32768, [62] = 2048, [63] = 32768, [64] = 32768, [65] = 2048,
    [66] = 32768, [67] = 32768, [68] = 2046, [69] = 268435456, [70] = 131072, [71] = 65000, [72] = 2097120,
    [73] = 32768, [74] = 32768, [77] = 32768, [78] = 1, [79] = 1, [80] = 1, [81] = 167936, [82] = 65536,
    [83] = 1, [84] = 0, [85] = 0, [86] = 0, [87] = 2, [88] = 0, [89] = 1, [90] = 1, [91] = 1, [92] = 1,
    [93] = 1, [94] = 1, [95] = 1, [96] = 1, [97] = 166912, [98] = 0, [99] = 1, [100] = 0, [101] = 0,
    [102] = 1, [103] = 1, [106] = 32, [107] = 1, [108] = 31457280, [109] = 134213632, [110] = 1, [111] = 1024,
    [112] = 1, [113] = 1, [114] = 1, [115] = 1, [116] = 1, [117] = 1, [118] = 0, [119] = 1, [120] = 0,
    [121] = 1, [122] = 1, [123] = 1, [124] = 1, [125] = 1, [126] = 1, [131] = -1, [134] = -1,
};

CUresult impl_cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!value || attrib < 1 || attrib > ATTR_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_gpu_info *g = &fake_devices[dev].info;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = (int)g->sms; break;
    case 75: *value = (int)(g->cc_major ? g->cc_major : 8); break;
    case 76: *value = (int)g->cc_minor; break;
    case FAKE_ATTR_PCI_BUS_ID: *value = (int)g->pci_bus; break;
    case FAKE_ATTR_PCI_DEVICE_ID: *value = (int)g->pci_device; break;
    case FAKE_ATTR_PCI_DOMAIN_ID: *value = (int)g->pci_domain; break;
    case 139: *value = (int)g->pci_device_id; break; /* GPU_PCI_DEVICE_ID */
    case 140: *value = 0x121210DE; break;              /* GPU_PCI_SUBSYSTEM_ID, as the fake NVML says */
    default: *value = a100[attrib];
    }
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetAttribute)

CUresult impl_cuDeviceGetPCIBusId(char *bus_id, int len, CUdevice dev)
{
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!bus_id || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fake_gpu_info *g = &fake_devices[dev].info;
    snprintf(bus_id, (size_t)len, "%04x:%02x:%02x.%x", g->pci_domain, g->pci_bus, g->pci_device, g->pci_function);
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetPCIBusId)

CUresult impl_cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus_id)
{
    unsigned dom, bus, d, fn;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dev || !bus_id || sscanf(bus_id, "%x:%x:%x.%x", &dom, &bus, &d, &fn) != 4)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < fake_device_count; i++) {
        const struct fake_gpu_info *g = &fake_devices[i].info;
        if (g->pci_domain == dom && g->pci_bus == bus && g->pci_device == d && g->pci_function == fn) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}
FAKE_EXPORT(cuDeviceGetByPCIBusId)

CUresult impl_cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = impl_cuDeviceGetAttribute(major, 75, dev);
    return rc ? rc : impl_cuDeviceGetAttribute(minor, 76, dev);
}
FAKE_EXPORT(cuDeviceComputeCapability)

CUresult impl_cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fake_initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= fake_device_count || peer < 0 || peer >= fake_device_count)
        return CUDA_ERROR_INVALID_DEVICE;
    *can = 0; /* no NVLink or P2P between fake GPUs */
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceCanAccessPeer)

CUresult impl_cuDeviceGetP2PAttribute(int *value, int attrib, CUdevice src, CUdevice dst)
{
    (void)attrib;
    int can;
    CUresult rc = impl_cuDeviceCanAccessPeer(&can, src, dst);
    if (rc == CUDA_SUCCESS && value)
        *value = 0;
    return value ? rc : CUDA_ERROR_INVALID_VALUE;
}
FAKE_EXPORT(cuDeviceGetP2PAttribute)

CUresult impl_cuDeviceGetExecAffinitySupport(int *pi, int type, CUdevice dev)
{
    (void)type, (void)dev;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = 0;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetExecAffinitySupport)

CUresult impl_cuDeviceGetTexture1DLinearMaxWidth(size_t *w, int format, unsigned channels, CUdevice dev)
{
    (void)format, (void)channels, (void)dev;
    if (!w)
        return CUDA_ERROR_INVALID_VALUE;
    *w = 268435456;
    return CUDA_SUCCESS;
}
FAKE_EXPORT(cuDeviceGetTexture1DLinearMaxWidth)
