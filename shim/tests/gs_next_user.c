/* Linked against gs_next_b.so, run with LD_PRELOAD="libgpushare.so gs_next_a.so": prints what A's
 * dlsym(RTLD_NEXT, "gs_next_name") finds ("B" when RTLD_NEXT is kept relative to A). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

const char *gs_next_name(void);

int main(void)
{
    const char *(*after)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "gs_next_after");
    printf("%s %s\n", gs_next_name(), after ? after() : "no-gs_next_after");
    return 0;
}
