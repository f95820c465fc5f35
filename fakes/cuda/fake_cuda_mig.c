/* Fake driver: which devices a process enumerates, MIG devices included (fake_gpu_mig.h).
 *
 * As NVIDIA's MIG user guide describes CUDA on MIG: a GPU in MIG mode is not a CUDA device itself; its MIG devices
 * are (a GPU instance with its compute instance is one CUDA device, with the instance's memory and SMs), and one
 * CUDA process enumerates at most one MIG device, however many it is given: the first in the visible order.
 * CUDA_VISIBLE_DEVICES names GPUs by index or UUID (prefix), and MIG devices by `MIG-<uuid>` (prefix) or the
 * older `MIG-GPU-<gpu uuid>/<gi>/<ci>`; the list stops at the first entry that matches nothing. Unset: every GPU
 * of the config in order, each MIG-enabled one as its MIG devices.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_mem.h"

static int mig_taken; /* a MIG device is already in the list */

static void add(const struct fake_gpu_info *info)
{
    if (fake_device_count >= FAKE_CUDA_MAX_DEVICES)
        return;
    fake_devices[fake_device_count].slot = (int)info->slot;
    fake_devices[fake_device_count++].info = *info;
}

static void add_mig(const struct fake_gpu_config *cfg, unsigned k)
{
    if (mig_taken)
        return;
    struct fake_gpu_info info;
    fake_mig_as_gpu(cfg, k, &info);
    add(&info);
    mig_taken = 1;
}

static void add_gpu(const struct fake_gpu_config *cfg, unsigned i)
{
    if (cfg->gpus[i].mig_current != 1) {
        add(&cfg->gpus[i]);
        return;
    }
    for (unsigned k = 0; k < cfg->mig_count; k++)
        if (cfg->migs[k].parent == i)
            add_mig(cfg, k);
}

/* A MIG token: "MIG-<uuid prefix>" or "MIG-GPU-<gpu uuid>/<gi>/<ci>". The MIG line, or -1. */
static int find_mig(const struct fake_gpu_config *cfg, const char *tok)
{
    const char *slash = strchr(tok, '/');
    if (!strncmp(tok, "MIG-GPU-", 8) && slash) {
        unsigned gi, ci;
        char tail;
        if (sscanf(slash, "/%u/%u%c", &gi, &ci, &tail) != 2)
            return -1;
        for (unsigned k = 0; k < cfg->mig_count; k++) {
            const struct fake_mig_info *m = &cfg->migs[k];
            const char *parent = cfg->gpus[m->parent].uuid;
            if (strlen(parent) == (size_t)(slash - tok - 4) && !strncmp(parent, tok + 4, (size_t)(slash - tok - 4)) &&
                m->gi == gi && m->ci == ci)
                return (int)k;
        }
        return -1;
    }
    for (unsigned k = 0; k < cfg->mig_count; k++)
        if (!strncmp(cfg->migs[k].uuid, tok, strlen(tok)))
            return (int)k;
    return -1;
}

void fake_cuda_pick_devices(const struct fake_gpu_config *cfg)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    fake_device_count = 0;
    mig_taken = 0;
    if (!v) {
        for (unsigned i = 0; i < cfg->gpu_count; i++)
            add_gpu(cfg, i);
        return;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        int found = -1;
        if (!strncmp(tok, "MIG-", 4)) {
            int k = find_mig(cfg, tok);
            if (k < 0)
                break;
            add_mig(cfg, (unsigned)k);
            continue;
        }
        if (isdigit((unsigned char)*tok)) {
            char *end;
            long idx = strtol(tok, &end, 10);
            if (!*end && idx >= 0 && idx < (long)cfg->gpu_count)
                found = (int)idx;
        } else if (!strncmp(tok, "GPU-", 4)) {
            for (unsigned i = 0; i < cfg->gpu_count; i++)
                if (!strncmp(cfg->gpus[i].uuid, tok, strlen(tok)))
                    found = (int)i;
        }
        if (found < 0)
            break;
        add_gpu(cfg, (unsigned)found);
    }
}
