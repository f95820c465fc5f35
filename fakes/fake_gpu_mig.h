/* MIG mode in the fake driver's config (included by fake_gpu_config.h; static inline only, like it).
 *
 * A GPU line says whether the GPU can run MIG and in which mode:
 *   gpu uuid=GPU-... name="NVIDIA A100-SXM4-80GB" ... mig=1              MIG enabled (current and pending)
 *   gpu ... mig=0 mig_pending=1                                          enabling waits for a GPU reset
 *   gpu ... mig=1 mig_pending=0                                          disabling waits for a GPU reset
 * Without mig= the GPU does not support MIG (nvmlDeviceGetMigMode: NOT_SUPPORTED).
 *
 * Each MIG device (a GPU instance with one compute instance) is a line of its own, under a GPU whose current
 * mode is enabled:
 *   mig parent=GPU-... uuid=MIG-... profile=1g.10gb memory_mib=9856 sms=14 gi=9 ci=0 slot=5
 * slot= is its entry in the state file, like a GPU's: a MIG device has its own memory, timeline and processes
 * (default: the first slot no GPU or earlier MIG line uses). The MIG devices of one GPU are numbered 0, 1, ...
 * (nvmlDeviceGetMigDeviceHandleByIndex) in the order of their lines.
 */
#ifndef FAKE_GPU_MIG_H
#define FAKE_GPU_MIG_H

#define FAKE_GPU_MAX_MIGS 16           /* MIG devices in one config */
#define FAKE_GPU_MIG_PER_GPU 7         /* nvmlDeviceGetMaxMigDeviceCount of a MIG-enabled GPU (A100, H100) */
#define FAKE_GPU_PROFILE_LEN 32
#define FAKE_GPU_MIG_KEYS "parent uuid profile memory_mib sms gi ci slot"

struct fake_mig_info {
    char uuid[FAKE_GPU_UUID_LEN];      /* "MIG-..." */
    char parent_uuid[FAKE_GPU_UUID_LEN];
    char profile[FAKE_GPU_PROFILE_LEN]; /* "1g.10gb", "1c.3g.40gb" */
    uint64_t memory_bytes;
    unsigned sms;
    unsigned gi, ci;                   /* GPU instance and compute instance ids */
    unsigned parent;                   /* config index of the parent GPU (resolved after the whole file) */
    unsigned slot;
    int slot_given;
    int line;
};

#endif /* FAKE_GPU_MIG_H */
