/* nvidia-smi over the fake driver (fakes/README.md, "nvidia-smi"):
 *
 *   nvidia-smi                                   the summary table
 *   nvidia-smi -L                                GPU <i>: <name> (UUID: GPU-...), MIG devices under it
 *   nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits]
 *   nvidia-smi --query-compute-apps=F,... --format=...
 *   -i, --id=ID,...                              only these GPUs (index, UUID or PCI bus id)
 *
 * Exit codes as nvidia-smi's: 0, 2 bad arguments, 6 no devices, 9 NVML cannot reach the driver, 12 no
 * libnvidia-ml.so.1, 15 a GPU is lost, 255 other.
 */
#include <stdio.h>
#include <string.h>

#include "smi/smi.h"

static const char usage[] =
    "NVIDIA System Management Interface (fake driver edition)\n\n"
    "nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...\n\n"
    "    -h,   --help                Print usage information and exit.\n"
    "    -L,   --list-gpus           Display a list of GPUs connected to the system.\n"
    "    -i,   --id=                 Target a specific GPU (index, UUID or PCI bus id; comma-separated).\n"
    "    --query-gpu=                Information about GPU: index, uuid, name, memory.total, memory.used,\n"
    "                                memory.free, memory.reserved, utilization.gpu, utilization.memory,\n"
    "                                driver_version, pci.bus_id, count, compute_cap.\n"
    "    --query-compute-apps=       List of active compute processes: pid, process_name, used_memory,\n"
    "                                gpu_uuid, gpu_name, gpu_bus_id.\n"
    "    --format=                   csv, with optional noheader and nounits (csv,noheader,nounits).\n";

struct args {
    int list;
    const char *select, *query_gpu, *query_apps, *format;
};

/* "--name=value" or "--name value" (also "-i value"). NULL when argv[*i] is not this option. */
static const char *option(int argc, char **argv, int *i, const char *long_name, const char *short_name, int *bad)
{
    const char *a = argv[*i];
    size_t n = strlen(long_name);
    if (!strncmp(a, long_name, n) && a[n] == '=')
        return a + n + 1;
    if (!strcmp(a, long_name) || (short_name && !strcmp(a, short_name))) {
        if (*i + 1 >= argc) {
            *bad = 1;
            return NULL;
        }
        return argv[++*i];
    }
    return NULL;
}

static int parse(int argc, char **argv, struct args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        int bad = 0;
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return -1;
        } else if (!strcmp(argv[i], "-L") || !strcmp(argv[i], "--list-gpus")) {
            a->list = 1;
        } else if ((v = option(argc, argv, &i, "--id", "-i", &bad))) {
            a->select = v;
        } else if ((v = option(argc, argv, &i, "--query-gpu", NULL, &bad))) {
            a->query_gpu = v;
        } else if ((v = option(argc, argv, &i, "--query-compute-apps", NULL, &bad))) {
            a->query_apps = v;
        } else if ((v = option(argc, argv, &i, "--format", NULL, &bad))) {
            a->format = v;
        } else {
            bad = 1;
        }
        if (bad) {
            printf("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n");
            return SMI_INVALID_ARGUMENT;
        }
    }
    if (a->query_gpu && a->query_apps) {
        printf("Only one of --query-gpu and --query-compute-apps at a time.\n\n");
        return SMI_INVALID_ARGUMENT;
    }
    if (a->query_gpu)
        return smi_query_gpu(NULL, a->query_gpu, a->format);
    if (a->query_apps)
        return smi_query_apps(NULL, a->query_apps, a->format);
    return SMI_OK;
}

/* -L: a MIG-enabled GPU's MIG devices under it, "  MIG <profile> Device <n>: (UUID: MIG-...)". */
static void list_mig_devices(nvmlDevice_t gpu)
{
    unsigned max = 0, n = 0;
    if (!nvml.nvmlDeviceGetMaxMigDeviceCount || !nvml.nvmlDeviceGetMigDeviceHandleByIndex ||
        nvml.nvmlDeviceGetMaxMigDeviceCount(gpu, &max) != NVML_SUCCESS)
        return;
    for (unsigned k = 0; k < max; k++) {
        nvmlDevice_t mig;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if (nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, k, &mig) != NVML_SUCCESS ||
            nvml.nvmlDeviceGetName(mig, name, sizeof name) != NVML_SUCCESS ||
            nvml.nvmlDeviceGetUUID(mig, uuid, sizeof uuid) != NVML_SUCCESS)
            continue;
        const char *profile = strstr(name, " MIG ");
        printf("  MIG %-13s Device %2u: (UUID: %s)\n", profile ? profile + 5 : name, n++, uuid);
    }
}

int main(int argc, char **argv)
{
    static struct smi_node node; /* large: not on the stack */
    struct args a;
    int rc = parse(argc, argv, &a);
    if (rc)
        return rc < 0 ? SMI_OK : rc;
    if ((rc = smi_load()) != SMI_OK)
        return rc;
    rc = smi_read_node(&node, a.select);
    if (rc == SMI_DRIVER_NOT_LOADED)
        return rc;
    if (rc == SMI_NOT_FOUND) {
        nvml.nvmlShutdown();
        return rc;
    }
    if (a.list) {
        for (unsigned i = 0; i < node.count; i++) {
            printf("GPU %u: %s (UUID: %s)\n", node.gpus[i].index, node.gpus[i].name, node.gpus[i].uuid);
            list_mig_devices(node.gpus[i].handle);
        }
    } else if (a.query_gpu) {
        smi_query_gpu(&node, a.query_gpu, a.format);
    } else {
        smi_read_processes(&node);
        if (a.query_apps)
            smi_query_apps(&node, a.query_apps, a.format);
        else
            smi_print_table(&node);
    }
    nvml.nvmlShutdown();
    return rc;
}
