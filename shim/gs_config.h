/* What the shim enforces, from the daemon's read-only limits file or, without one, from HAMi-core's env names.
 * Read once, at the first intercepted call. */
#ifndef GS_CONFIG_H
#define GS_CONFIG_H

#include <limits.h>
#include <stdint.h>

#include "gs_parse.h"

#define GS_MAX_DEVICES GS_LIMITS_MAX_DEVICES
#define GS_DEFAULT_CONTEXT_RESERVE (256ULL << 20)

struct gs_config {
    int refused;               /* a limit was meant to hold but cannot be read: CUDA is refused */
    char refuse_reason[768];
    int from_file;             /* limits come from the file (devices matched by UUID) */
    char limits_path[PATH_MAX];
    struct gs_limits file;     /* when from_file */
    uint64_t env_memory[GS_MAX_DEVICES]; /* env mode, by CUDA ordinal; 0 = no limit */
    int env_sm[GS_MAX_DEVICES];          /* env mode, by CUDA ordinal; 1..100 */
    enum gs_policy policy;
    uint64_t context_reserve;  /* charged once per process and device with a memory limit */
    char cache_path[PATH_MAX]; /* the container's accounting file */
};

extern struct gs_config gs_cfg;

/* Fill gs_cfg from the environment and the limits file. Problems are logged; a broken limit sets refused. */
void gs_config_load(void);

/* The limits for CUDA ordinal `ordinal` whose UUID is `uuid` (GS_UUID_LEN bytes: "GPU-" and CUDA's 16 bytes).
 * Returns 0, or -1 when the limits file does not list that GPU (the device must not be used). A limits file
 * entry matches by those 16 bytes whether it names a GPU or a MIG device ("MIG-..."), and `uuid` is rewritten
 * to the entry's name. */
int gs_config_device(int ordinal, char *uuid, uint64_t *memory_limit, int *sm_limit);

/* Whether the container reserved no compute on the GPU with this UUID (the limits file's sm_unreserved; never
 * without the file): its sm_limit is then a cap, and it gives way to its neighbours (gs_throttle.h). */
int gs_config_unreserved(const char *uuid);

#endif /* GS_CONFIG_H */
