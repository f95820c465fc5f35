/* The exported dlsym. Not including <dlfcn.h> here on purpose: its prototype marks the name non-null, and the
 * shim checks it. libc's dlsym looks at its caller's address for RTLD_NEXT; every lookup the shim does not
 * answer ends in a tail call, so the caller libc sees is the application's, not the shim's. */
#include <string.h>

#include "gs_real.h"

#define GS_RTLD_NEXT ((void *)-1l)

void *gs_dlsym_hook(const char *symbol);

__attribute__((visibility("default"))) void *dlsym(void *handle, const char *symbol)
{
    gs_dlsym_fn real = gs_real_dlsym();
    if (handle != GS_RTLD_NEXT && symbol &&
        ((symbol[0] == 'c' && symbol[1] == 'u') || (symbol[0] == 'n' && !strncmp(symbol, "nvml", 4)))) {
        void *hook = gs_dlsym_hook(symbol);
        if (hook)
            return real(handle, symbol) ? hook : NULL;
    }
    return real(handle, symbol);
}
