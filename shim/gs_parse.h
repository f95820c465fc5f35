/* Parsers for the shim's inputs: sizes and numbers from env vars, and the daemon's limits file (the format of
 * devplugin/contract.py: it accepts everything render_limits writes and rejects everything parse_limits
 * rejects; where Python is lenient (underscores in numbers, Unicode digits, empty UUIDs) this is stricter).
 * Pure functions: no globals, no logging; errors come back as text in err. */
#ifndef GS_PARSE_H
#define GS_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "gpushare_contract.h"

#define GS_UUID_LEN 96
#define GS_LIMITS_MAX_BYTES 65536

enum gs_policy { GS_POLICY_DEFAULT = 0, GS_POLICY_FORCE = 1, GS_POLICY_DISABLE = 2 };

struct gs_limits_device {
    char uuid[GS_UUID_LEN];
    uint64_t memory_limit; /* bytes, 0 = no limit */
    int sm_limit;          /* 1..100 */
    int sm_unreserved;     /* 1: no compute reserved here: sm_limit caps it and it gives way to its neighbours */
};

struct gs_limits {
    int ndevices;
    struct gs_limits_device dev[GS_LIMITS_MAX_DEVICES];
    enum gs_policy core_policy;
};

/* "123", "512k", "2g" (powers of 1024, either case) -> bytes. 0 on success, -1 when not a size. */
int gs_parse_size(const char *s, uint64_t *out);
/* A whole decimal integer with an optional sign, within [min, max]. 0 on success, -1 otherwise. */
int gs_parse_int(const char *s, long long min, long long max, long long *out);
/* "default" / "force" / "disable" (case-insensitive when `fold`), or -1. */
int gs_parse_policy(const char *s, int fold);
const char *gs_policy_name(enum gs_policy p);

/* Parse limits-file text. 0 on success; -1 with the reason (naming the line or key) in err. */
int gs_limits_parse(const char *text, size_t len, struct gs_limits *out, char *err, size_t errlen);
/* Read and parse the file at path. -1 with the reason in err; errno_out gets errno for open failures
 * (ENOENT lets the caller tell "absent" from "broken"), 0 otherwise. */
int gs_limits_load(const char *path, struct gs_limits *out, char *err, size_t errlen, int *errno_out);

#endif /* GS_PARSE_H */
