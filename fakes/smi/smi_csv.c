/* nvidia-smi: --query-gpu=... and --query-compute-apps=... with --format=csv[,noheader][,nounits]. Values
 * joined by ", ", one line per GPU or process; a value NVML cannot give prints as [N/A]; the header keeps the
 * units even with nounits, as nvidia-smi does. */
#include <stdio.h>
#include <string.h>

#include "smi/smi.h"

#define MIB (1ULL << 20)
#define CSV_NA "[N/A]"

enum gpu_field {
    F_COUNT, F_INDEX, F_NAME, F_UUID, F_DRIVER, F_BUS_ID, F_MEM_TOTAL, F_MEM_USED, F_MEM_FREE, F_MEM_RESERVED,
    F_UTIL_GPU, F_UTIL_MEM, F_CC,
};

enum app_field { A_PID, A_NAME, A_USED, A_GPU_UUID, A_GPU_NAME, A_GPU_BUS_ID };

struct field {
    const char *name;   /* what the user writes */
    const char *header; /* what the header says */
    const char *unit;   /* "MiB", "%" or NULL */
    int id;
};

static const struct field gpu_fields[] = {
    {"count", "count", NULL, F_COUNT},
    {"index", "index", NULL, F_INDEX},
    {"name", "name", NULL, F_NAME},
    {"gpu_name", "name", NULL, F_NAME},
    {"uuid", "uuid", NULL, F_UUID},
    {"gpu_uuid", "uuid", NULL, F_UUID},
    {"driver_version", "driver_version", NULL, F_DRIVER},
    {"pci.bus_id", "pci.bus_id", NULL, F_BUS_ID},
    {"gpu_bus_id", "pci.bus_id", NULL, F_BUS_ID},
    {"memory.total", "memory.total", "MiB", F_MEM_TOTAL},
    {"memory.used", "memory.used", "MiB", F_MEM_USED},
    {"memory.free", "memory.free", "MiB", F_MEM_FREE},
    {"memory.reserved", "memory.reserved", "MiB", F_MEM_RESERVED},
    {"utilization.gpu", "utilization.gpu", "%", F_UTIL_GPU},
    {"utilization.memory", "utilization.memory", "%", F_UTIL_MEM},
    {"compute_cap", "compute_cap", NULL, F_CC},
};

static const struct field app_fields[] = {
    {"pid", "pid", NULL, A_PID},
    {"process_name", "process_name", NULL, A_NAME},
    {"name", "process_name", NULL, A_NAME},
    {"used_memory", "used_gpu_memory", "MiB", A_USED},
    {"used_gpu_memory", "used_gpu_memory", "MiB", A_USED},
    {"gpu_uuid", "gpu_uuid", NULL, A_GPU_UUID},
    {"gpu_name", "gpu_name", NULL, A_GPU_NAME},
    {"gpu_bus_id", "gpu_bus_id", NULL, A_GPU_BUS_ID},
};

#define MAX_FIELDS 32

struct format {
    int header, units;
};

static int parse_format(const char *text, struct format *f)
{
    char buf[128];
    int csv = 0;
    *f = (struct format){1, 1};
    if (!text) {
        printf("--format=csv[,noheader][,nounits] is required with --query-gpu and --query-compute-apps.\n");
        return SMI_INVALID_ARGUMENT;
    }
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "csv"))
            csv = 1;
        else if (!strcmp(tok, "noheader"))
            f->header = 0;
        else if (!strcmp(tok, "nounits"))
            f->units = 0;
        else {
            printf("\"%s\" is not a valid format option: use --format=csv[,noheader][,nounits].\n", tok);
            return SMI_INVALID_ARGUMENT;
        }
    }
    if (!csv) {
        printf("Only CSV output is supported: use --format=csv[,noheader][,nounits].\n");
        return SMI_INVALID_ARGUMENT;
    }
    return SMI_OK;
}

/* Split `text` into fields known in `table`; SMI_INVALID_ARGUMENT (message printed) on an unknown one. */
static int parse_fields(const char *text, const struct field *table, size_t n, const struct field **out,
                        int *count)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    *count = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        const struct field *found = NULL;
        for (size_t i = 0; i < n && !found; i++)
            if (!strcmp(table[i].name, tok))
                found = &table[i];
        if (!found) {
            printf("Field \"%s\" is not a valid field to query.\n\n", tok);
            return SMI_INVALID_ARGUMENT;
        }
        if (*count == MAX_FIELDS) {
            printf("At most %d fields can be queried at once.\n", MAX_FIELDS);
            return SMI_INVALID_ARGUMENT;
        }
        out[(*count)++] = found;
    }
    if (!*count) {
        printf("No fields to query: name them, e.g. --query-gpu=index,name,memory.used.\n");
        return SMI_INVALID_ARGUMENT;
    }
    return SMI_OK;
}

static void print_header(const struct field **fields, int n)
{
    for (int i = 0; i < n; i++)
        printf("%s%s%s%s%s", i ? ", " : "", fields[i]->header, fields[i]->unit ? " [" : "",
               fields[i]->unit ? fields[i]->unit : "", fields[i]->unit ? "]" : "");
    printf("\n");
}

/* A number with its unit ("1024 MiB", "7 %") or without. */
static void number(char *out, size_t len, unsigned long long v, const struct field *f, const struct format *fmt)
{
    if (fmt->units && f->unit)
        snprintf(out, len, "%llu %s", v, f->unit);
    else
        snprintf(out, len, "%llu", v);
}

static void gpu_value(const struct smi_node *node, const struct smi_gpu *g, const struct field *f,
                      const struct format *fmt, char *out, size_t len)
{
    snprintf(out, len, CSV_NA);
    switch (f->id) {
    case F_COUNT: number(out, len, node->count, f, fmt); break;
    case F_INDEX: number(out, len, g->index, f, fmt); break;
    case F_NAME: snprintf(out, len, "%s", g->name); break;
    case F_UUID: snprintf(out, len, "%s", g->uuid); break;
    case F_DRIVER: snprintf(out, len, "%s", node->driver_version); break;
    case F_BUS_ID: snprintf(out, len, "%s", g->bus_id); break;
    case F_MEM_TOTAL: if (g->have_mem) number(out, len, g->total / MIB, f, fmt); break;
    case F_MEM_USED: if (g->have_mem) number(out, len, g->used / MIB, f, fmt); break;
    case F_MEM_FREE: if (g->have_mem) number(out, len, g->free / MIB, f, fmt); break;
    case F_MEM_RESERVED: if (g->have_reserved) number(out, len, g->reserved / MIB, f, fmt); break;
    case F_UTIL_GPU: if (g->have_util) number(out, len, g->util_gpu, f, fmt); break;
    case F_UTIL_MEM: if (g->have_util) number(out, len, g->util_mem, f, fmt); break;
    case F_CC: if (g->have_cc) snprintf(out, len, "%d.%d", g->cc_major, g->cc_minor); break;
    }
}

static void app_value(const struct smi_node *node, const struct smi_proc *p, const struct field *f,
                      const struct format *fmt, char *out, size_t len)
{
    const struct smi_gpu *g = &node->gpus[p->gpu];
    switch (f->id) {
    case A_PID: snprintf(out, len, "%u", p->pid); break;
    case A_NAME: snprintf(out, len, "%s", p->name); break;
    case A_USED: number(out, len, p->used / MIB, f, fmt); break;
    case A_GPU_UUID: snprintf(out, len, "%s", g->uuid); break;
    case A_GPU_NAME: snprintf(out, len, "%s", g->name); break;
    case A_GPU_BUS_ID: snprintf(out, len, "%s", g->bus_id); break;
    default: snprintf(out, len, CSV_NA);
    }
}

int smi_query_gpu(const struct smi_node *node, const char *text, const char *format_text)
{
    const struct field *fields[MAX_FIELDS];
    struct format fmt;
    int n, rc = parse_format(format_text, &fmt);
    if (rc == SMI_OK)
        rc = parse_fields(text, gpu_fields, sizeof gpu_fields / sizeof gpu_fields[0], fields, &n);
    if (rc != SMI_OK || !node)
        return rc;
    if (fmt.header)
        print_header(fields, n);
    for (unsigned i = 0; i < node->count; i++) {
        for (int k = 0; k < n; k++) {
            char v[256];
            gpu_value(node, &node->gpus[i], fields[k], &fmt, v, sizeof v);
            printf("%s%s", k ? ", " : "", v);
        }
        printf("\n");
    }
    return SMI_OK;
}

int smi_query_apps(const struct smi_node *node, const char *text, const char *format_text)
{
    const struct field *fields[MAX_FIELDS];
    struct format fmt;
    int n, rc = parse_format(format_text, &fmt);
    if (rc == SMI_OK)
        rc = parse_fields(text, app_fields, sizeof app_fields / sizeof app_fields[0], fields, &n);
    if (rc != SMI_OK || !node)
        return rc;
    if (fmt.header)
        print_header(fields, n);
    for (unsigned i = 0; i < node->nprocs; i++) {
        for (int k = 0; k < n; k++) {
            char v[300];
            app_value(node, &node->procs[i], fields[k], &fmt, v, sizeof v);
            printf("%s%s", k ? ", " : "", v);
        }
        printf("\n");
    }
    return SMI_OK;
}
