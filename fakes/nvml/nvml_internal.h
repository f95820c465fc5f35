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

/* MIG devices (nvml_mig.c): handle k of the config's MIG lines is fake_nvml_handle(FAKE_GPU_MAX_GPUS + k). */
FAKE_NVML_HIDDEN void fake_nvml_mig_load(const struct fake_gpu_config *cfg); /* at each 0 -> 1 init */
FAKE_NVML_HIDDEN const struct fake_gpu_info *fake_nvml_mig_info(unsigned k);
FAKE_NVML_HIDDEN nvmlReturn_t fake_nvml_mig_by_uuid(const char *uuid, nvmlDevice_t *dev);
/* A rewritten config's MIG modes and MIG devices, when it describes the same GPUs (nvml.c). 1 when taken. */
FAKE_NVML_HIDDEN int fake_nvml_take_mig_layout(const struct fake_gpu_config *fresh);
/* Handle index `index`: its MIG slice counts into attrs when it is a MIG device. */
FAKE_NVML_HIDDEN void fake_nvml_mig_attributes(unsigned index, nvmlDeviceAttributes_t *attrs);
/* Handle index `index`: the memory its MIG devices use when it is a MIG-enabled GPU, else 0. */
FAKE_NVML_HIDDEN unsigned long long fake_nvml_mig_used(unsigned index, const struct fake_gpu_state *st);

/* NVML's own entry points that other files answer through. */
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci);

#endif /* FAKE_NVML_INTERNAL_H */
