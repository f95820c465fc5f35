/* Fake driver: the cuGetProcAddress rows of the entry points real clients need beyond the ones the shim hooks
 * (fake_cuda_procaddr.c): the CUDA runtime looks up about 440 names at start and tolerates the missing ones until
 * a call needs them. Base name, the CUDA version its current form appeared in, and the implementation; every one
 * is also exported under its versioned name (FAKE_EXPORT), so a lookup never hands out an address the exported
 * symbols do not have. */
#include <string.h>

#include "fake_cuda_api.h"

#pragma GCC visibility push(hidden)
#define R(base, since, fn) CUresult impl_##fn();
#include "fake_cuda_procs.def"
#undef R
#pragma GCC visibility pop

static const struct {
    const char *name;
    int since;
    void *fn;
} rows[] = {
#define R(base, since, fn) {base, since, (void *)&impl_##fn},
#include "fake_cuda_procs.def"
#undef R
};

void *fake_proc_lookup_more(const char *symbol, int version, int *version_too_low)
{
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (strcmp(rows[i].name, symbol))
            continue;
        if (version < rows[i].since) {
            *version_too_low = 1;
            continue;
        }
        *version_too_low = 0;
        return rows[i].fn;
    }
    return NULL;
}
