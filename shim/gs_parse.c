/* Parsing of env values and the limits file; see gs_parse.h for the rules. */
#include "gs_parse.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int gs_parse_int(const char *s, long long min, long long max, long long *out)
{
    const char *p = s;
    int neg = 0;
    if (*p == '+' || *p == '-')
        neg = *p++ == '-';
    if (*p < '0' || *p > '9')
        return -1;
    unsigned long long v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        if (v > (0x7fffffffffffffffULL - (unsigned)(*p - '0')) / 10)
            return -1;
        v = v * 10 + (unsigned)(*p - '0');
    }
    long long x = neg ? -(long long)v : (long long)v;
    if (x < min || x > max)
        return -1;
    *out = x;
    return 0;
}

int gs_parse_size(const char *s, uint64_t *out)
{
    size_t n = strlen(s);
    if (n == 0 || n > 30)
        return -1;
    char digits[32];
    memcpy(digits, s, n + 1);
    unsigned shift = 0;
    switch (digits[n - 1]) {
    case 'k': case 'K': shift = 10; break;
    case 'm': case 'M': shift = 20; break;
    case 'g': case 'G': shift = 30; break;
    default: break;
    }
    if (shift)
        digits[--n] = '\0';
    if (n == 0)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (digits[i] < '0' || digits[i] > '9')
            return -1;
        if (v > (UINT64_MAX - (unsigned)(digits[i] - '0')) / 10)
            return -1;
        v = v * 10 + (unsigned)(digits[i] - '0');
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = v << shift;
    return 0;
}

int gs_parse_policy(const char *s, int fold)
{
    static const char *const names[] = {"default", "force", "disable"};
    for (int i = 0; i < 3; i++)
        if (fold ? !strcasecmp(s, names[i]) : !strcmp(s, names[i]))
            return i;
    return -1;
}

const char *gs_policy_name(enum gs_policy p)
{
    return p == GS_POLICY_FORCE ? "force" : p == GS_POLICY_DISABLE ? "disable" : "default";
}

/* --- limits file ------------------------------------------------------------------------------------------ */

#define MAX_KEYS 256

struct kv {
    char *key;
    char *value;
};

struct kvset {
    int n;
    struct kv items[MAX_KEYS];
};

static char *strip(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\r')
        s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

static const char *lookup(const struct kvset *kv, const char *key)
{
    for (int i = 0; i < kv->n; i++)
        if (!strcmp(kv->items[i].key, key))
            return kv->items[i].value;
    return NULL;
}

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Split into key=value pairs, later keys replacing earlier ones (as a Python dict does). */
static int split_lines(char *buf, struct kvset *kv, char *err, size_t errlen)
{
    int line_no = 0;
    char *line = buf;
    while (line) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        line_no++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = strip(line);
        if (*s) {
            char *eq = strchr(s, '=');
            if (!eq)
                return fail(err, errlen, "line %d: expected key=value", line_no);
            *eq = '\0';
            char *key = strip(s), *value = strip(eq + 1);
            int i;
            for (i = 0; i < kv->n && strcmp(kv->items[i].key, key); i++)
                ;
            if (i == kv->n) {
                if (kv->n == MAX_KEYS)
                    return fail(err, errlen, "more than %d keys", MAX_KEYS);
                kv->n++;
            }
            kv->items[i].key = key;
            kv->items[i].value = value;
        }
        line = next;
    }
    return 0;
}

/* Bytes a limits file may hold: printable ASCII, tab, newline, and CR only as part of CRLF. */
static int check_bytes(const char *text, size_t len, char *err, size_t errlen)
{
    long long line = 1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') {
            line++;
            continue;
        }
        if (c == '\t' || (c >= 0x20 && c < 0x7f))
            continue;
        if (c == '\r' && (i + 1 == len || text[i + 1] == '\n'))
            continue;
        return fail(err, errlen, "line %lld: a byte that is not printable ASCII", line);
    }
    return 0;
}

int gs_limits_parse(const char *text, size_t len, struct gs_limits *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (len > GS_LIMITS_MAX_BYTES)
        return fail(err, errlen, "longer than %d bytes", GS_LIMITS_MAX_BYTES);
    if (check_bytes(text, len, err, errlen))
        return -1;
    char *buf = malloc(len + 1);
    struct kvset *kv = calloc(1, sizeof *kv);
    int rc = -1;
    if (!buf || !kv) {
        snprintf(err, errlen, "out of host memory");
        goto out;
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    if (split_lines(buf, kv, err, errlen))
        goto out;

    long long v;
    const char *s = lookup(kv, "version");
    if (!s || gs_parse_int(s, -0x7fffffffffffffffLL, 0x7fffffffffffffffLL, &v) || v != GS_LIMITS_VERSION) {
        fail(err, errlen, "version must be %d", GS_LIMITS_VERSION);
        goto out;
    }
    s = lookup(kv, "devices");
    if (!s) {
        fail(err, errlen, "missing key devices");
        goto out;
    }
    if (gs_parse_int(s, 1, GS_LIMITS_MAX_DEVICES, &v)) {
        fail(err, errlen, "devices must be 1..%d", GS_LIMITS_MAX_DEVICES);
        goto out;
    }
    out->ndevices = (int)v;
    for (int i = 0; i < out->ndevices; i++) {
        char key[64];
        struct gs_limits_device *d = &out->dev[i];
        snprintf(key, sizeof key, "device.%d.uuid", i);
        if (!(s = lookup(kv, key)) || !*s || strlen(s) >= GS_UUID_LEN) {
            fail(err, errlen, "%s must be a GPU UUID of 1..95 characters", key);
            goto out;
        }
        snprintf(d->uuid, sizeof d->uuid, "%s", s);
        snprintf(key, sizeof key, "device.%d.memory_limit", i);
        uint64_t bytes = 0;
        if (!(s = lookup(kv, key)) || gs_parse_int(s, 0, 0x7fffffffffffffffLL, &v)) {
            fail(err, errlen, "%s must be a number of bytes >= 0", key);
            goto out;
        }
        bytes = (uint64_t)v;
        d->memory_limit = bytes;
        snprintf(key, sizeof key, "device.%d.sm_limit", i);
        d->sm_limit = 100;
        if ((s = lookup(kv, key))) {
            if (gs_parse_int(s, 1, 100, &v)) {
                fail(err, errlen, "%s must be 1..100", key);
                goto out;
            }
            d->sm_limit = (int)v;
        }
        snprintf(key, sizeof key, "device.%d.sm_unreserved", i);
        if ((s = lookup(kv, key))) {
            if (gs_parse_int(s, 0, 1, &v)) {
                fail(err, errlen, "%s must be 0 or 1", key);
                goto out;
            }
            d->sm_unreserved = (int)v;
        }
    }
    out->core_policy = GS_POLICY_DEFAULT;
    if ((s = lookup(kv, "core_policy"))) {
        int p = gs_parse_policy(s, 0);
        if (p < 0) {
            fail(err, errlen, "core_policy must be default, force or disable, not '%s'", s);
            goto out;
        }
        out->core_policy = (enum gs_policy)p;
    }
    rc = 0;
out:
    free(buf);
    free(kv);
    return rc;
}

int gs_limits_load(const char *path, struct gs_limits *out, char *err, size_t errlen, int *errno_out)
{
    *errno_out = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *errno_out = errno;
        snprintf(err, errlen, "cannot open: %s", strerror(errno));
        return -1;
    }
    char *buf = malloc(GS_LIMITS_MAX_BYTES + 1);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, GS_LIMITS_MAX_BYTES + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, errlen, "cannot read: %s", strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > GS_LIMITS_MAX_BYTES)
            break;
    }
    close(fd);
    int rc = gs_limits_parse(buf, len, out, err, errlen);
    free(buf);
    return rc;
}
