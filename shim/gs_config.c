/* Reading the limits: the daemon's limits file wins; without one, HAMi-core's env names apply. A value that
 * cannot be read is never taken as "no limit": CUDA is refused with a message saying what to fix. */
#include "gs_config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <fcntl.h>
#include <unistd.h>

#include "gpushare_contract.h"
#include "gs_log.h"

struct gs_config gs_cfg;

__attribute__((format(printf, 1, 2))) static void refuse(const char *fmt, ...)
{
    if (gs_cfg.refused)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(gs_cfg.refuse_reason, sizeof gs_cfg.refuse_reason, fmt, ap);
    va_end(ap);
    gs_cfg.refused = 1;
    GS_ERROR("refusing CUDA in this process: %s", gs_cfg.refuse_reason);
}

static int env_size(const char *name, uint64_t *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    if (gs_parse_size(v, out)) {
        refuse("%s=%s is not a size: use bytes or a number with k, m or g (powers of 1024), e.g. 2g", name, v);
        return -1;
    }
    return 1;
}

static int env_percent(const char *name, int *out)
{
    const char *v = getenv(name);
    long long x;
    if (!v || !*v)
        return 0;
    if (gs_parse_int(v, 0, 100, &x)) {
        refuse("%s=%s is not a percentage 0..100 (0 means no limit)", name, v);
        return -1;
    }
    *out = x == 0 ? 100 : (int)x;
    return 1;
}

static void load_env_limits(void)
{
    uint64_t all_mem = 0;
    int all_sm = 100;
    env_size(GS_ENV_MEMORY_LIMIT, &all_mem);
    env_percent(GS_ENV_SM_LIMIT, &all_sm);
    for (int i = 0; i < GS_MAX_DEVICES; i++) {
        char name[64];
        uint64_t mem;
        int sm;
        snprintf(name, sizeof name, "%s_%d", GS_ENV_MEMORY_LIMIT, i);
        gs_cfg.env_memory[i] = env_size(name, &mem) == 1 && mem ? mem : all_mem;
        snprintf(name, sizeof name, "%s_%d", GS_ENV_SM_LIMIT, i);
        gs_cfg.env_sm[i] = env_percent(name, &sm) == 1 ? sm : all_sm;
    }
}

static void note_ignored_env(void)
{
    static const char *const names[] = {GS_ENV_MEMORY_LIMIT, GS_ENV_SM_LIMIT, GS_ENV_CORE_POLICY, NULL};
    for (int i = 0; names[i]; i++)
        if (getenv(names[i]))
            GS_INFO("%s is ignored: the limits file %s wins", names[i], gs_cfg.limits_path);
}

/* The limits file: the daemon's mount at the container path wins over GPUSHARE_LIMITS_FILE, so that a process
 * cannot point the shim elsewhere. Returns 1 when a file is in force, 0 when there is none. */
static int load_limits_file(void)
{
    const char *env_path = getenv(GS_ENV_LIMITS_FILE);
    const char *path = NULL;
    if (access(GS_CONTAINER_LIMITS_PATH, F_OK) == 0) {
        path = GS_CONTAINER_LIMITS_PATH;
        if (env_path && *env_path && strcmp(env_path, path))
            GS_WARN("%s=%s is ignored: the daemon's limits file %s is mounted", GS_ENV_LIMITS_FILE, env_path, path);
    } else if (env_path && *env_path) {
        path = env_path;
    } else {
        return 0;
    }
    snprintf(gs_cfg.limits_path, sizeof gs_cfg.limits_path, "%s", path);
    char err[512];
    int errno_out;
    if (gs_limits_load(path, &gs_cfg.file, err, sizeof err, &errno_out)) {
        refuse("limits file %s: %s (it is written by the gpushare daemon; recreate the pod if it is damaged)",
               path, err);
        return 1;
    }
    gs_cfg.from_file = 1;
    gs_cfg.policy = gs_cfg.file.core_policy;
    note_ignored_env();
    return 1;
}

static int is_directory(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

static void choose_cache_path(void)
{
    const char *v = getenv(GS_ENV_SHARED_CACHE);
    if (gs_cfg.from_file && !strcmp(gs_cfg.limits_path, GS_CONTAINER_LIMITS_PATH)) {
        snprintf(gs_cfg.cache_path, sizeof gs_cfg.cache_path, "%s", GS_CONTAINER_SHARED_CACHE);
        if (v && *v && strcmp(v, GS_CONTAINER_SHARED_CACHE))
            GS_INFO("%s=%s is ignored: the daemon's accounting file %s is used", GS_ENV_SHARED_CACHE, v,
                    GS_CONTAINER_SHARED_CACHE);
    } else if (v && *v) {
        snprintf(gs_cfg.cache_path, sizeof gs_cfg.cache_path, "%s", v);
    } else if (is_directory(GS_CONTAINER_STATE_DIR)) {
        snprintf(gs_cfg.cache_path, sizeof gs_cfg.cache_path, "%s", GS_CONTAINER_SHARED_CACHE);
    } else {
        snprintf(gs_cfg.cache_path, sizeof gs_cfg.cache_path, "/tmp/gpushare-usage.cache");
    }
}

/* What a process's CUDA context is charged. Under the daemon's limits file a process may raise it but not
 * lower it: the context's memory is real, and a process that declared it smaller would hold more than its
 * limit. */
static void load_context_reserve(void)
{
    uint64_t v;
    if (env_size(GS_ENV_CONTEXT_RESERVE, &v) != 1)
        return;
    if (gs_cfg.from_file && !strcmp(gs_cfg.limits_path, GS_CONTAINER_LIMITS_PATH) && v < gs_cfg.context_reserve) {
        GS_INFO("%s below %llu bytes is ignored under the daemon's limits file", GS_ENV_CONTEXT_RESERVE,
                (unsigned long long)gs_cfg.context_reserve);
        return;
    }
    gs_cfg.context_reserve = v;
}

void gs_config_load(void)
{
    memset(&gs_cfg, 0, sizeof gs_cfg);
    gs_cfg.policy = GS_POLICY_DEFAULT;
    gs_cfg.context_reserve = GS_DEFAULT_CONTEXT_RESERVE;
    for (int i = 0; i < GS_MAX_DEVICES; i++)
        gs_cfg.env_sm[i] = 100;
    if (!load_limits_file()) {
        load_env_limits();
        const char *p = getenv(GS_ENV_CORE_POLICY);
        if (p && *p) {
            int policy = gs_parse_policy(p, 1);
            if (policy < 0)
                GS_WARN("%s=%s is not default, force or disable; using default", GS_ENV_CORE_POLICY, p);
            else
                gs_cfg.policy = (enum gs_policy)policy;
        }
    }
    load_context_reserve();
    choose_cache_path();
}

int gs_config_unreserved(const char *uuid)
{
    for (int i = 0; gs_cfg.from_file && i < gs_cfg.file.ndevices; i++)
        if (!strcasecmp(gs_cfg.file.dev[i].uuid, uuid))
            return gs_cfg.file.dev[i].sm_unreserved;
    return 0;
}

/* The driver's 16 bytes of a device are the same whether it is a GPU ("GPU-...") or a MIG device ("MIG-...", the
 * UUID NVML and the container runtime name it by); CUDA hands out only the bytes. */
static int same_device(const char *named, const char *uuid)
{
    int prefixed = (!strncasecmp(named, "GPU-", 4) || !strncasecmp(named, "MIG-", 4)) &&
                   (!strncasecmp(uuid, "GPU-", 4) || !strncasecmp(uuid, "MIG-", 4));
    return prefixed ? !strcasecmp(named + 4, uuid + 4) : !strcasecmp(named, uuid);
}

int gs_config_device(int ordinal, char *uuid, uint64_t *memory_limit, int *sm_limit)
{
    if (gs_cfg.from_file) {
        for (int i = 0; i < gs_cfg.file.ndevices; i++) {
            if (same_device(gs_cfg.file.dev[i].uuid, uuid)) {
                *memory_limit = gs_cfg.file.dev[i].memory_limit;
                *sm_limit = gs_cfg.file.dev[i].sm_limit;
                memcpy(uuid, gs_cfg.file.dev[i].uuid, GS_UUID_LEN); /* its name there: MIG-... for a MIG device */
                return 0;
            }
        }
        return -1;
    }
    if (ordinal < 0 || ordinal >= GS_MAX_DEVICES)
        return -1;
    *memory_limit = gs_cfg.env_memory[ordinal];
    *sm_limit = gs_cfg.env_sm[ordinal];
    return 0;
}
