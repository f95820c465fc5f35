/* The fake driver's node description: which GPUs exist and what they are. Text, read once at nvmlInit (and at
 * cuInit by the fake libcuda) from the file named by $FAKE_NVML_CONFIG. The format (fakes/README.md):
 *
 *   # comment
 *   driver_version=550.54.15
 *   cuda_version=12040
 *   state=/var/lib/fake-gpu/node.conf.state      # optional: the node's state file (default <config>.state)
 *   driver_socket=/run/fake-gpu/driver.sock      # optional: host pids from the node (fake_gpu_ident.h)
 *   gpu uuid=GPU-0b6a... name="Tesla V100-SXM2-16GB" memory_mib=15360 minor=0 pci=00000000:00:08.0 numa=0 sms=80
 *   gpu ... nvlink=0      # NVLink island 0: NVLink-connected to every other GPU of island 0 (nvml_topology.c)
 *   gpu ... mig=1         # MIG mode (mig_pending= when a reset is pending); its MIG devices on `mig` lines:
 *   mig parent=GPU-... uuid=MIG-... profile=1g.10gb memory_mib=9856 sms=14 gi=9 ci=0   (fake_gpu_mig.h)
 *
 * One `gpu` line per GPU, in NVML index order. `slot=N` on a gpu line names the GPU's entry in the state file
 * (default: its line index), so a container's config can list only its GPUs (index 0..k-1) while each uses the
 * node's entry of that GPU. Static inline only, so each fake compiles its own copy and both read the same file
 * the same way.
 */
#ifndef FAKE_GPU_CONFIG_H
#define FAKE_GPU_CONFIG_H

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_gpu_state.h"

#define FAKE_GPU_UUID_LEN 96     /* NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define FAKE_GPU_NAME_LEN 96     /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define FAKE_GPU_BUSID_LEN 32    /* NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE */
#define FAKE_GPU_VERSION_LEN 80  /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
#define FAKE_GPU_PATH_LEN 4096
#define FAKE_GPU_SOCKET_LEN 108  /* sizeof(sockaddr_un.sun_path) */

struct fake_gpu_info {
    char uuid[FAKE_GPU_UUID_LEN];
    char name[FAKE_GPU_NAME_LEN];
    uint64_t memory_bytes;          /* memory_mib * 2^20 */
    uint64_t reserved_bytes;        /* reserved_mib * 2^20: driver-reserved, never free */
    unsigned minor;                 /* /dev/nvidia<minor> */
    char bus_id[FAKE_GPU_BUSID_LEN];/* "00000000:00:08.0" */
    unsigned pci_domain, pci_bus, pci_device, pci_function;
    unsigned pci_device_id;         /* (device << 16) | vendor, e.g. 0x1DB110DE */
    int numa_node;                  /* -1: not reported (NOT_SUPPORTED) */
    int nvlink_island;              /* -1: no NVLink (NOT_SUPPORTED); else linked to each GPU of the same island */
    unsigned sms;                   /* streaming multiprocessors */
    unsigned cc_major, cc_minor;    /* compute capability */
    int events_supported;           /* 0: XID events cannot be registered (NOT_SUPPORTED) */
    unsigned slot;                  /* its entry in the state file (gpus[], timeline[], procs[].gpu, events) */
    int line;                       /* where it was declared */
    int mig_current, mig_pending;   /* MIG mode (fake_gpu_mig.h): 1 enabled, 0 disabled, -1 no MIG support */
};

#include "fake_gpu_mig.h"

struct fake_gpu_config {
    char driver_version[FAKE_GPU_VERSION_LEN];
    int cuda_version;               /* 1000 * major + 10 * minor, e.g. 12040 */
    unsigned gpu_count;
    struct fake_gpu_info gpus[FAKE_GPU_MAX_GPUS];
    char state_path[FAKE_GPU_PATH_LEN];      /* state=: the node's state file; "" = <config>.state */
    char driver_socket[FAKE_GPU_SOCKET_LEN]; /* driver_socket=: "" = identities are this namespace's pids */
    unsigned mig_count;
    struct fake_mig_info migs[FAKE_GPU_MAX_MIGS];      /* `mig` lines, in file order */
};

#define FAKE_GPU_KEYS "uuid name memory_mib reserved_mib minor pci pci_device_id numa nvlink sms cc events slot mig mig_pending"

static inline int fake_cfg_fail(char *err, size_t errlen, const char *path, int line, const char *fmt,
                                const char *a, const char *b)
{
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, b);
    snprintf(err, errlen, "%s:%d: %s", path, line, msg);
    return -1;
}

static inline int fake_cfg_uint(const char *v, unsigned long long max, unsigned long long *out)
{
    if (!*v || *v == '-' || *v == '+')
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || *end || x > max)
        return -1;
    *out = x;
    return 0;
}

static inline int fake_cfg_int(const char *v, long long min, long long max, long long *out)
{
    if (!*v)
        return -1;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || x < min || x > max)
        return -1;
    *out = x;
    return 0;
}

/* Split the next `key=value` token off *p (value may be "quoted"). Returns 1 for a token, 0 at the end of the
 * line, -1 for a malformed token (err filled). */
static inline int fake_cfg_token(char **p, char **key, char **val, char *err, size_t errlen, const char *path,
                                 int line)
{
    char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    if (!*s || *s == '#')
        return 0;
    *key = s;
    while (*s && *s != '=' && *s != ' ' && *s != '\t')
        s++;
    if (*s != '=') {
        char tok[64];
        snprintf(tok, sizeof tok, "%.*s", (int)(s - *key), *key);
        return fake_cfg_fail(err, errlen, path, line, "expected key=value, got '%s'%s", tok, "");
    }
    *s++ = '\0';
    if (*s == '"') {
        *val = ++s;
        while (*s && *s != '"')
            s++;
        if (*s != '"')
            return fake_cfg_fail(err, errlen, path, line, "unterminated quote in the value of %s%s", *key, "");
        *s++ = '\0';
        if (*s && *s != ' ' && *s != '\t')
            return fake_cfg_fail(err, errlen, path, line, "expected a space after the quoted value of %s%s",
                                 *key, "");
    } else {
        *val = s;
        while (*s && *s != ' ' && *s != '\t')
            s++;
        if (*s)
            *s++ = '\0';
    }
    *p = s;
    return 1;
}

#include "fake_gpu_mig_config.h"

static inline int fake_cfg_gpu_key(struct fake_gpu_info *g, const char *key, const char *val, char *err,
                                   size_t errlen, const char *path, int line)
{
    unsigned long long u;
    long long i;
    int mig = fake_mig_gpu_key(g, key, val, err, errlen, path, line);
    if (mig <= 0)
        return mig;
    if (!strcmp(key, "uuid")) {
        if (strncmp(val, "GPU-", 4) || strlen(val) < 5 || strlen(val) >= FAKE_GPU_UUID_LEN)
            return fake_cfg_fail(err, errlen, path, line, "uuid must look like GPU-<hex and dashes>, got '%s'%s",
                                 val, "");
        snprintf(g->uuid, sizeof g->uuid, "%s", val);
    } else if (!strcmp(key, "name")) {
        if (!*val || strlen(val) >= FAKE_GPU_NAME_LEN)
            return fake_cfg_fail(err, errlen, path, line, "name must be 1..95 characters, got '%s'%s", val, "");
        snprintf(g->name, sizeof g->name, "%s", val);
    } else if (!strcmp(key, "memory_mib")) {
        if (fake_cfg_uint(val, 1ULL << 30, &u) || u == 0)
            return fake_cfg_fail(err, errlen, path, line, "memory_mib must be a positive integer, got '%s'%s",
                                 val, "");
        g->memory_bytes = u << 20;
    } else if (!strcmp(key, "reserved_mib")) {
        if (fake_cfg_uint(val, 1ULL << 30, &u))
            return fake_cfg_fail(err, errlen, path, line, "reserved_mib must be an integer >= 0, got '%s'%s",
                                 val, "");
        g->reserved_bytes = u << 20;
    } else if (!strcmp(key, "minor")) {
        if (fake_cfg_uint(val, 255, &u))
            return fake_cfg_fail(err, errlen, path, line, "minor must be 0..255, got '%s'%s", val, "");
        g->minor = (unsigned)u;
    } else if (!strcmp(key, "pci")) {
        unsigned dom, bus, dev, fn;
        int n = -1;
        if (strlen(val) >= FAKE_GPU_BUSID_LEN || sscanf(val, "%8x:%2x:%2x.%1x%n", &dom, &bus, &dev, &fn, &n) != 4 ||
            n != (int)strlen(val) || dev > 31 || fn > 7)
            return fake_cfg_fail(err, errlen, path, line, "pci must look like 00000000:00:08.0, got '%s'%s", val,
                                 "");
        g->pci_domain = dom, g->pci_bus = bus, g->pci_device = dev, g->pci_function = fn;
        snprintf(g->bus_id, sizeof g->bus_id, "%08X:%02X:%02X.%X", dom, bus, dev, fn);
    } else if (!strcmp(key, "pci_device_id")) {
        if (fake_cfg_uint(val, 0xFFFFFFFFULL, &u))
            return fake_cfg_fail(err, errlen, path, line, "pci_device_id must be a 32-bit number, got '%s'%s",
                                 val, "");
        g->pci_device_id = (unsigned)u;
    } else if (!strcmp(key, "numa")) {
        if (fake_cfg_int(val, -1, 1023, &i))
            return fake_cfg_fail(err, errlen, path, line, "numa must be -1 (none) or 0..1023, got '%s'%s", val,
                                 "");
        g->numa_node = (int)i;
    } else if (!strcmp(key, "nvlink")) {
        if (fake_cfg_int(val, -1, 255, &i))
            return fake_cfg_fail(err, errlen, path, line, "nvlink must be -1 (no NVLink) or an island id 0..255, "
                                 "got '%s'%s", val, "");
        g->nvlink_island = (int)i;
    } else if (!strcmp(key, "sms")) {
        if (fake_cfg_uint(val, 1024, &u) || u == 0)
            return fake_cfg_fail(err, errlen, path, line, "sms must be 1..1024, got '%s'%s", val, "");
        g->sms = (unsigned)u;
    } else if (!strcmp(key, "cc")) {
        unsigned ma, mi;
        int n = -1;
        if (sscanf(val, "%2u.%1u%n", &ma, &mi, &n) != 2 || n != (int)strlen(val) || ma == 0)
            return fake_cfg_fail(err, errlen, path, line, "cc must look like 8.0, got '%s'%s", val, "");
        g->cc_major = ma, g->cc_minor = mi;
    } else if (!strcmp(key, "events")) {
        if (strcmp(val, "0") && strcmp(val, "1"))
            return fake_cfg_fail(err, errlen, path, line, "events must be 1 or 0, got '%s'%s", val, "");
        g->events_supported = val[0] == '1';
    } else if (!strcmp(key, "slot")) {
        if (fake_cfg_uint(val, FAKE_GPU_MAX_GPUS - 1, &u))
            return fake_cfg_fail(err, errlen, path, line, "slot must be 0..15 (the GPU's index in the node's state "
                                 "file), got '%s'%s", val, "");
        g->slot = (unsigned)u;
    } else {
        return fake_cfg_fail(err, errlen, path, line, "unknown gpu key '%s' (known: %s)", key, FAKE_GPU_KEYS);
    }
    return 0;
}

/* Parse the config at path into cfg. Returns 0, or -1 with "<path>:<line>: <problem>" in err. */
static inline int fake_gpu_config_load(const char *path, struct fake_gpu_config *cfg, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    snprintf(cfg->driver_version, sizeof cfg->driver_version, "550.54.15");
    cfg->cuda_version = 12040;
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char buf[2048];
    int line = 0, rc = 0;
    while (rc == 0 && fgets(buf, sizeof buf, f)) {
        line++;
        size_t len = strlen(buf);
        if (len == sizeof buf - 1 && buf[len - 1] != '\n' && !feof(f)) {
            rc = fake_cfg_fail(err, errlen, path, line, "line longer than %s characters%s", "2046", "");
            break;
        }
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
            buf[--len] = '\0';
        char *p = buf, *key, *val;
        while (*p == ' ' || *p == '\t')
            p++;
        if (!*p || *p == '#')
            continue;
        if (!strncmp(p, "mig", 3) && (p[3] == ' ' || p[3] == '\t')) {
            if ((rc = fake_mig_line(cfg, p + 3, err, errlen, path, line)))
                break;
            continue;
        }
        if (!strncmp(p, "gpu", 3) && (p[3] == ' ' || p[3] == '\t' || !p[3])) {
            if (cfg->gpu_count == FAKE_GPU_MAX_GPUS) {
                rc = fake_cfg_fail(err, errlen, path, line, "more than %s GPUs%s", "16", "");
                break;
            }
            unsigned idx = cfg->gpu_count;
            struct fake_gpu_info *g = &cfg->gpus[idx];
            memset(g, 0, sizeof *g);
            g->minor = idx;
            g->pci_bus = idx + 1;
            snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", idx + 1);
            g->pci_device_id = 0x1DB110DE;
            g->numa_node = -1;
            g->nvlink_island = -1;
            g->sms = 80;
            g->cc_major = 7, g->cc_minor = 0;
            g->events_supported = 1;
            g->slot = idx;
            g->line = line;
            g->mig_current = g->mig_pending = -1;
            p += 3;
            int t;
            while ((t = fake_cfg_token(&p, &key, &val, err, errlen, path, line)) == 1) {
                if ((rc = fake_cfg_gpu_key(g, key, val, err, errlen, path, line)))
                    break;
            }
            if (t < 0)
                rc = -1;
            if (rc)
                break;
            const char *missing = !g->uuid[0] ? "uuid" : !g->name[0] ? "name" : !g->memory_bytes ? "memory_mib" : NULL;
            if (missing) {
                rc = fake_cfg_fail(err, errlen, path, line, "gpu line without %s (needs uuid, name, memory_mib)%s",
                                   missing, "");
                break;
            }
            if (g->mig_pending >= 0 && g->mig_current < 0) {
                rc = fake_cfg_fail(err, errlen, path, line, "mig_pending= needs mig= (the current MIG mode)%s%s", "",
                                   "");
                break;
            }
            if (g->mig_pending < 0)
                g->mig_pending = g->mig_current;
            if (g->reserved_bytes >= g->memory_bytes) {
                rc = fake_cfg_fail(err, errlen, path, line, "reserved_mib must be below memory_mib%s%s", "", "");
                break;
            }
            for (unsigned j = 0; j < idx; j++) {
                if (!strcmp(cfg->gpus[j].uuid, g->uuid) || !strcmp(cfg->gpus[j].bus_id, g->bus_id)) {
                    char other[32];
                    snprintf(other, sizeof other, "%d", cfg->gpus[j].line);
                    rc = fake_cfg_fail(err, errlen, path, line, "same uuid or pci as the GPU on line %s%s", other,
                                       "");
                    break;
                }
            }
            if (rc)
                break;
            cfg->gpu_count++;
            continue;
        }
        int t = fake_cfg_token(&p, &key, &val, err, errlen, path, line);
        if (t < 0) {
            rc = -1;
            break;
        }
        if (!strcmp(key, "driver_version")) {
            if (!*val || strlen(val) >= FAKE_GPU_VERSION_LEN) {
                rc = fake_cfg_fail(err, errlen, path, line, "driver_version must be 1..79 characters%s%s", "", "");
                break;
            }
            snprintf(cfg->driver_version, sizeof cfg->driver_version, "%s", val);
        } else if (!strcmp(key, "cuda_version")) {
            long long v;
            if (fake_cfg_int(val, 1000, 99999, &v)) {
                rc = fake_cfg_fail(err, errlen, path, line, "cuda_version must look like 12040 (12.4), got '%s'%s",
                                   val, "");
                break;
            }
            cfg->cuda_version = (int)v;
        } else if (!strcmp(key, "state")) {
            if (val[0] != '/' || strlen(val) >= sizeof cfg->state_path) {
                rc = fake_cfg_fail(err, errlen, path, line, "state must be an absolute path (the node's state file), "
                                   "got '%s'%s", val, "");
                break;
            }
            snprintf(cfg->state_path, sizeof cfg->state_path, "%s", val);
        } else if (!strcmp(key, "driver_socket")) {
            if (val[0] != '/' || strlen(val) >= sizeof cfg->driver_socket) {
                rc = fake_cfg_fail(err, errlen, path, line, "driver_socket must be an absolute path of at most 107 "
                                   "characters (a unix socket), got '%s'%s", val, "");
                break;
            }
            snprintf(cfg->driver_socket, sizeof cfg->driver_socket, "%s", val);
        } else {
            rc = fake_cfg_fail(err, errlen, path, line,
                               "unknown setting '%s' (expected driver_version=, cuda_version=, state=, driver_socket= "
                               "or a gpu line)%s", key, "");
            break;
        }
        if (fake_cfg_token(&p, &key, &val, err, errlen, path, line) != 0) {
            rc = fake_cfg_fail(err, errlen, path, line, "one setting per line%s%s", "", "");
            break;
        }
    }
    fclose(f);
    for (unsigned i = 0; rc == 0 && i < cfg->gpu_count; i++) {
        for (unsigned j = 0; j < i; j++) {
            if (cfg->gpus[j].slot == cfg->gpus[i].slot) {
                char other[32], slot[32];
                snprintf(other, sizeof other, "%d", cfg->gpus[j].line);
                snprintf(slot, sizeof slot, "%u", cfg->gpus[i].slot);
                rc = fake_cfg_fail(err, errlen, path, cfg->gpus[i].line,
                                   "slot %s is also the slot of the GPU on line %s (each GPU needs its own)", slot,
                                   other);
                break;
            }
        }
    }
    if (rc == 0)
        rc = fake_mig_finish(cfg, err, errlen, path);
    return rc;
}

/* The state file this config uses: state= when given (it must exist: it is the node's), else <config>.state
 * (created when missing). Returns 1 when the fake may create it, 0 when not, -1 when the path is too long. */
static inline int fake_gpu_config_state_path(const struct fake_gpu_config *cfg, const char *config_path, char *out,
                                             size_t len)
{
    if (cfg->state_path[0])
        return (size_t)snprintf(out, len, "%s", cfg->state_path) >= len ? -1 : 0;
    return (size_t)snprintf(out, len, "%s%s", config_path, FAKE_GPU_STATE_SUFFIX) >= len ? -1 : 1;
}

#endif /* FAKE_GPU_CONFIG_H */
