/* Bind the few libc and libm functions whose default symbol version moved in recent glibc releases (2.29 for
 * exp, 2.33/2.34 for the others) to their original versions, so a shim built on a new distribution still loads
 * in containers with an older glibc (down to 2.17). A library in /etc/ld.so.preload that fails to load is skipped with a warning, which would
 * leave the container unlimited. Included first by every source of the library (Makefile: -include). */
#ifndef GS_GLIBC_COMPAT_H
#define GS_GLIBC_COMPAT_H

#if defined(__x86_64__)
#define GS_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define GS_GLIBC_BASE "GLIBC_2.17"
#endif

#ifdef GS_GLIBC_BASE
__asm__(".symver dlopen,dlopen@" GS_GLIBC_BASE);
__asm__(".symver dlerror,dlerror@" GS_GLIBC_BASE);
__asm__(".symver dlvsym,dlvsym@" GS_GLIBC_BASE);
__asm__(".symver pthread_create,pthread_create@" GS_GLIBC_BASE);
__asm__(".symver pthread_once,pthread_once@" GS_GLIBC_BASE);
__asm__(".symver exp,exp@" GS_GLIBC_BASE);
#endif

#endif /* GS_GLIBC_COMPAT_H */
