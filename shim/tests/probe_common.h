/* What the shim's CUDA test programs (gs_probe, gs_vmm) share: how they fail on bad input, how they read a size
 * argument, and the type of cuGetProcAddress_v2 they reach the driver through. Define PROBE_NAME (the program's
 * name, the prefix of its error messages) before including. */
#ifndef GS_TESTS_PROBE_COMMON_H
#define GS_TESTS_PROBE_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "gs_cuda_types.h"

#ifndef PROBE_NAME
#error "define PROBE_NAME before including probe_common.h"
#endif

typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Exits with status 2 after printing "<program>: <fmt % arg>" on stderr. */
static void die(const char *fmt, const char *arg)
{
    fprintf(stderr, PROBE_NAME ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(2);
}

/* A byte count with an optional k, m or g suffix (powers of 1024); anything else dies. */
static uint64_t size_arg(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end || end == s)
        die("not a size: %s", s);
    return v;
}

#endif
