/* nvidia-smi: the default summary (R550 layout): driver and CUDA versions, one block per GPU, the processes.
 * Values the fake driver does not model (fan, temperature, power, persistence, ECC, compute and MIG modes)
 * print as N/A, as nvidia-smi prints what a GPU cannot report. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "smi/smi.h"

#define COL_A 41 /* GPU, name, persistence | fan, temperature, perf, power */
#define COL_B 24 /* bus id, display | memory usage */
#define COL_C 22 /* ECC | utilisation, compute mode | MIG mode */
#define INNER (COL_A + 1 + COL_B + 1 + COL_C)
#define MIB (1ULL << 20)

/* `left` at the left and `right` at the right of a cell `width` wide, one space inside each edge. */
static void cell(char *out, int width, const char *left, const char *right)
{
    int room = width - 2 - (int)strlen(right);
    snprintf(out, (size_t)width + 1, " %-*.*s%s ", room, room, left, right);
}

static void row(const char *a_left, const char *a_right, const char *b_left, const char *b_right, const char *c_left,
                const char *c_right)
{
    char a[COL_A + 1], b[COL_B + 1], c[COL_C + 1];
    cell(a, COL_A, a_left, a_right);
    cell(b, COL_B, b_left, b_right);
    cell(c, COL_C, c_left, c_right);
    printf("|%s|%s|%s|\n", a, b, c);
}

static void line(char edge, char fill, char joint, int split)
{
    char buf[INNER + 3];
    buf[0] = edge;
    memset(buf + 1, fill, INNER);
    if (split)
        buf[1 + COL_A] = buf[1 + COL_A + 1 + COL_B] = joint;
    buf[INNER + 1] = edge;
    buf[INNER + 2] = '\0';
    puts(buf);
}

static void text(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf("|%-*.*s|\n", INNER, INNER, buf);
}

static void gpu_block(const struct smi_gpu *g)
{
    char a[64], b[64], c[64];
    snprintf(a, sizeof a, "%3u  %s", g->index, g->name);
    snprintf(b, sizeof b, "%s %s", g->bus_id, SMI_NA);
    row(a, SMI_NA, "", b, "", SMI_NA);
    if (g->have_mem)
        snprintf(b, sizeof b, "%lluMiB / %lluMiB", g->used / MIB, g->total / MIB);
    else
        snprintf(b, sizeof b, "%s / %s", SMI_NA, SMI_NA);
    if (g->have_util)
        snprintf(c, sizeof c, "%3u%%      %7s", g->util_gpu, SMI_NA);
    else
        snprintf(c, sizeof c, "%4s      %7s", SMI_NA, SMI_NA);
    row("N/A   N/A    N/A", "N/A /  N/A", "", b, "", c);
    row("", "", "", "", "", SMI_NA);
}

static void processes(const struct smi_node *node)
{
    line('+', '-', '-', 0);
    text(" Processes:");
    text("  GPU   GI   CI        PID   Type   Process name%*s", INNER - 48, "GPU Memory ");
    text("        ID   ID%*s", INNER - 15, "Usage      ");
    line('|', '=', '=', 0);
    if (node->nprocs == 0)
        text("  No running processes found");
    for (unsigned i = 0; i < node->nprocs; i++) {
        const struct smi_proc *p = &node->procs[i];
        char head[64], mem[32];
        snprintf(head, sizeof head, "  %4u   %-3s  %-3s  %8u  %5s   ", node->gpus[p->gpu].index, SMI_NA, SMI_NA, p->pid,
                 "C");
        snprintf(mem, sizeof mem, " %9lluMiB ", p->used / MIB);
        int room = INNER - (int)strlen(head) - (int)strlen(mem);
        text("%s%-*.*s%s", head, room, room, p->name, mem);
    }
    line('+', '-', '-', 0);
}

void smi_print_table(const struct smi_node *node)
{
    char when[64];
    time_t now = time(NULL);
    strftime(when, sizeof when, "%a %b %e %H:%M:%S %Y", localtime(&now));
    printf("%s       \n", when);
    line('+', '-', '-', 0);
    text(" NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-8s", node->driver_version, node->driver_version,
         node->cuda_version);
    line('|', '-', '+', 1);
    row("GPU  Name", "Persistence-M", "Bus-Id", "Disp.A", "", "Volatile Uncorr. ECC");
    row("Fan  Temp   Perf", "Pwr:Usage/Cap", "", "Memory-Usage", "GPU-Util", "Compute M.");
    row("", "", "", "", "", "MIG M.");
    line('|', '=', '+', 1);
    for (unsigned i = 0; i < node->count; i++) {
        gpu_block(&node->gpus[i]);
        line('+', '-', '+', 1);
    }
    printf("%*s\n", INNER + 2, "");
    processes(node);
}
