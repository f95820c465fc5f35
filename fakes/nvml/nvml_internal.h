/* What nvml.c shares with the other files of the fake libnvidia-ml.so.1 (hidden: not part of NVML's ABI). */
#ifndef FAKE_NVML_INTERNAL_H
#define FAKE_NVML_INTERNAL_H

#include "fake_gpu_config.h"
#include "nvml/fake_nvml.h"

#define FAKE_NVML_HIDDEN __attribute__((visibility("hidden")))

/* The handle checked as every call checks it (UNINITIALIZED, INVALID_ARGUMENT, GPU_IS_LOST); *g its config entry. */
FAKE_NVML_HIDDEN nvmlReturn_t fake_nvml_device(nvmlDevice_t d, const struct fake_gpu_info **g);
/* The config of the current init cycle (valid while NVML is initialised). */
FAKE_NVML_HIDDEN const struct fake_gpu_config *fake_nvml_config(void);
/* The handle of the GPU at config index `index`. */
FAKE_NVML_HIDDEN nvmlDevice_t fake_nvml_handle(unsigned index);

/* NVML's own entry points that other files answer through. */
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci);

#endif /* FAKE_NVML_INTERNAL_H */
