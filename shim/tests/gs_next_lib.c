/* Two tiny libraries (built with -DWHICH='"A"' and '"B"') for the test that the shim's dlsym keeps RTLD_NEXT
 * relative to the caller: library A asks for the next "gs_next_name" and must get B's, not its own. */
#define _GNU_SOURCE
#include <dlfcn.h>

const char *gs_next_name(void)
{
    return WHICH;
}

const char *gs_next_after(void)
{
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "gs_next_name");
    return next ? next() : "none";
}
