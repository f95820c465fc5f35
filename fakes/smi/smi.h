/* A small nvidia-smi: what users read from the real one (the summary table, -L, --query-gpu and
 * --query-compute-apps in CSV), over whatever libnvidia-ml.so.1 the dynamic linker finds, loaded with dlopen as
 * the real tool does (so an LD_PRELOAD shim that hooks NVML through dlsym shows its view). fakes/README.md
 * ("nvidia-smi") lists what it prints.
 */
#ifndef SMI_H
#define SMI_H

#include "nvml/fake_nvml.h"

/* nvidia-smi's exit codes (nvidia-smi(1), RETURN VALUE). */
#define SMI_OK 0
#define SMI_INVALID_ARGUMENT 2
#define SMI_NOT_FOUND 6           /* "No devices were found" */
#define SMI_DRIVER_NOT_LOADED 9   /* NVML could not talk to the driver */
#define SMI_LIBRARY_NOT_FOUND 12  /* no libnvidia-ml.so.1 */
#define SMI_GPU_LOST 15
#define SMI_OTHER 255

#define SMI_MAX_GPUS 64
#define SMI_MAX_PROCS 256
#define SMI_NA "N/A"

/* The NVML entry points used: X(name, return type, parameters, required). Optional ones may be missing (an old
 * library); what they would show prints as N/A. */
#define SMI_NVML(X)                                                                                          \
    X(nvmlInit_v2, nvmlReturn_t, (void), 1)                                                                  \
    X(nvmlShutdown, nvmlReturn_t, (void), 1)                                                                 \
    X(nvmlErrorString, const char *, (nvmlReturn_t), 1)                                                      \
    X(nvmlDeviceGetCount_v2, nvmlReturn_t, (unsigned int *), 1)                                             \
    X(nvmlDeviceGetHandleByIndex_v2, nvmlReturn_t, (unsigned int, nvmlDevice_t *), 1)                       \
    X(nvmlSystemGetDriverVersion, nvmlReturn_t, (char *, unsigned int), 0)                                  \
    X(nvmlSystemGetCudaDriverVersion, nvmlReturn_t, (int *), 0)                                             \
    X(nvmlDeviceGetName, nvmlReturn_t, (nvmlDevice_t, char *, unsigned int), 0)                             \
    X(nvmlDeviceGetUUID, nvmlReturn_t, (nvmlDevice_t, char *, unsigned int), 0)                             \
    X(nvmlDeviceGetPciInfo_v3, nvmlReturn_t, (nvmlDevice_t, nvmlPciInfo_t *), 0)                            \
    X(nvmlDeviceGetMemoryInfo, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_t *), 0)                             \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlReturn_t, (nvmlDevice_t, nvmlMemory_v2_t *), 0)                       \
    X(nvmlDeviceGetUtilizationRates, nvmlReturn_t, (nvmlDevice_t, nvmlUtilization_t *), 0)                  \
    X(nvmlDeviceGetCudaComputeCapability, nvmlReturn_t, (nvmlDevice_t, int *, int *), 0)                    \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlReturn_t, (nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *), 0) \
    X(nvmlDeviceGetMaxMigDeviceCount, nvmlReturn_t, (nvmlDevice_t, unsigned int *), 0)                      \
    X(nvmlDeviceGetMigDeviceHandleByIndex, nvmlReturn_t, (nvmlDevice_t, unsigned int, nvmlDevice_t *), 0)

#define SMI_FIELD(name, ret, params, required) ret(*name) params;
struct smi_nvml {
    SMI_NVML(SMI_FIELD)
};
#undef SMI_FIELD

extern struct smi_nvml nvml;

/* What one GPU answered; have_* = 0: NVML could not say (printed as N/A). */
struct smi_gpu {
    unsigned index;
    nvmlDevice_t handle;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char bus_id[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    int have_mem, have_reserved, have_util, have_cc;
    unsigned long long total, used, free, reserved; /* bytes */
    unsigned util_gpu, util_mem;
    int cc_major, cc_minor;
};

struct smi_proc {
    unsigned gpu;                 /* index into the smi_gpu array */
    unsigned pid;                 /* as NVML reports it */
    unsigned long long used;      /* bytes */
    char name[256];               /* /proc/<pid>/cmdline's first word, or N/A */
};

struct smi_node {
    char driver_version[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    char cuda_version[16];        /* "12.4" or N/A */
    unsigned count;
    struct smi_gpu gpus[SMI_MAX_GPUS];
    unsigned nprocs;
    struct smi_proc procs[SMI_MAX_PROCS];
};

/* smi_nvml.c: load the library (exit code and message on failure), read the node. */
int smi_load(void);
int smi_read_node(struct smi_node *node, const char *select);
void smi_read_processes(struct smi_node *node);

/* smi_table.c: the default summary. */
void smi_print_table(const struct smi_node *node);

/* smi_csv.c: --query-gpu / --query-compute-apps; SMI_OK or SMI_INVALID_ARGUMENT (message printed). node NULL:
 * only check the fields and the format. */
int smi_query_gpu(const struct smi_node *node, const char *fields, const char *format);
int smi_query_apps(const struct smi_node *node, const char *fields, const char *format);

#endif /* SMI_H */
