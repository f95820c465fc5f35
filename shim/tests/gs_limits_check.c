/* The shim's limits-file and env parsers, run from the command line so tests can hold them against
 * devplugin/contract.py.
 *   gs_limits_check file PATH     parse the file, print {"ok":true,...} or {"ok":false,"error":...}
 *   gs_limits_check batch         stdin: records of <u32 little-endian length><bytes>; one JSON line each
 *   gs_limits_check size VALUE    an env size ("2g"), print {"ok":true,"bytes":N} or {"ok":false} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gs_parse.h"

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void report(int rc, const struct gs_limits *l, const char *err)
{
    if (rc) {
        printf("{\"ok\":false,\"error\":");
        json_string(err);
        printf("}\n");
        return;
    }
    printf("{\"ok\":true,\"core_policy\":\"%s\",\"devices\":[", gs_policy_name(l->core_policy));
    for (int i = 0; i < l->ndevices; i++) {
        printf("%s{\"uuid\":", i ? "," : "");
        json_string(l->dev[i].uuid);
        printf(",\"memory_limit\":%llu,\"sm_limit\":%d,\"sm_unreserved\":%s}",
               (unsigned long long)l->dev[i].memory_limit, l->dev[i].sm_limit,
               l->dev[i].sm_unreserved ? "true" : "false");
    }
    printf("]}\n");
}

int main(int argc, char **argv)
{
    static struct gs_limits limits;
    char err[512];
    if (argc == 3 && !strcmp(argv[1], "file")) {
        int e;
        report(gs_limits_load(argv[2], &limits, err, sizeof err, &e), &limits, err);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "size")) {
        uint64_t v;
        if (gs_parse_size(argv[2], &v))
            printf("{\"ok\":false}\n");
        else
            printf("{\"ok\":true,\"bytes\":%llu}\n", (unsigned long long)v);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "batch")) {
        unsigned char hdr[4];
        while (fread(hdr, 1, 4, stdin) == 4) {
            size_t len = hdr[0] | hdr[1] << 8 | hdr[2] << 16 | (size_t)hdr[3] << 24;
            char *buf = malloc(len + 1);
            if (!buf || fread(buf, 1, len, stdin) != len)
                return 1;
            report(gs_limits_parse(buf, len, &limits, err, sizeof err), &limits, err);
            free(buf);
        }
        return 0;
    }
    fprintf(stderr, "usage: gs_limits_check file PATH | batch | size VALUE\n");
    return 2;
}
