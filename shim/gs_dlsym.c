/* The exported dlsym. libc's dlsym looks at its caller's return address for RTLD_NEXT, so every lookup the
 * shim does not answer must reach libc with the application's return address. That is not left to the
 * compiler (a tail call is an optimisation, absent from -O0 and sanitizer builds): on x86-64 and AArch64 the
 * exported dlsym is a few instructions of assembly that ask gs_dlsym_answer and then either return its answer
 * or jump to libc's dlsym with the original arguments and return address. Other architectures get the C
 * version below, correct only where the compiler makes the final call a tail call.
 * <dlfcn.h> is not included on purpose: its prototype marks the name non-null, and the shim checks it. */
#include <string.h>

#include "gs_hooks.h"
#include "gs_log.h"
#include "gs_real.h"

#define GS_RTLD_NEXT ((void *)-1l)

/* The answer to dlsym(handle, symbol): *answered = 1 and the value to return, or *answered = 0 and libc's
 * dlsym, to be called in the application's place. */
__attribute__((used)) GS_NO_SANITIZE void *gs_dlsym_answer(void *handle, const char *symbol, int *answered)
{
    gs_dlsym_fn real = gs_real_dlsym();
    *answered = 0;
    if (!real) {
        *answered = 1;
        return NULL;
    }
    if (handle != GS_RTLD_NEXT && symbol &&
        ((symbol[0] == 'c' && symbol[1] == 'u') || (symbol[0] == 'n' && !strncmp(symbol, "nvml", 4)))) {
        void *hook = gs_hook_by_name(symbol);
        if (hook) {
            *answered = 1;
            return real(handle, symbol) ? hook : NULL;
        }
        if (gs_unaccounted_allocation(symbol) && real(handle, symbol)) {
            GS_ERROR("dlsym(%s): an allocation entry point the shim does not account; refused", symbol);
            *answered = 1;
            return NULL;
        }
    }
    return (void *)real;
}

#if defined(__x86_64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    .cfi_startproc\n"
        "    endbr64\n"
        "    pushq %rdi\n"                /* rsp is 16-byte aligned after these two pushes and the sub */
        "    .cfi_adjust_cfa_offset 8\n"
        "    pushq %rsi\n"
        "    .cfi_adjust_cfa_offset 8\n"
        "    subq $24, %rsp\n"
        "    .cfi_adjust_cfa_offset 24\n"
        "    movl $0, (%rsp)\n"
        "    movq %rsp, %rdx\n"           /* &answered */
        "    call gs_dlsym_answer\n"
        "    movl (%rsp), %ecx\n"
        "    addq $24, %rsp\n"
        "    .cfi_adjust_cfa_offset -24\n"
        "    popq %rsi\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    popq %rdi\n"
        "    .cfi_adjust_cfa_offset -8\n"
        "    testl %ecx, %ecx\n"
        "    jnz 1f\n"
        "    jmp *%rax\n"                 /* libc's dlsym, returning straight to the application */
        "1:  ret\n"
        "    .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        "dlsym:\n"
        "    .cfi_startproc\n"
        "    stp x29, x30, [sp, #-48]!\n"
        "    .cfi_def_cfa_offset 48\n"
        "    .cfi_offset 29, -48\n"
        "    .cfi_offset 30, -40\n"
        "    mov x29, sp\n"
        "    stp x0, x1, [sp, #16]\n"
        "    str wzr, [sp, #32]\n"
        "    add x2, sp, #32\n"           /* &answered */
        "    bl gs_dlsym_answer\n"
        "    ldr w3, [sp, #32]\n"
        "    mov x16, x0\n"
        "    ldp x0, x1, [sp, #16]\n"
        "    ldp x29, x30, [sp], #48\n"
        "    .cfi_def_cfa_offset 0\n"
        "    cbnz w3, 1f\n"
        "    br x16\n"                    /* libc's dlsym, returning straight to the application */
        "1:  mov x0, x16\n"
        "    ret\n"
        "    .cfi_endproc\n"
        ".size dlsym, .-dlsym\n");
#else
__attribute__((visibility("default"))) void *dlsym(void *handle, const char *symbol)
{
    int answered;
    void *r = gs_dlsym_answer(handle, symbol, &answered);
    if (answered)
        return r;
    return ((gs_dlsym_fn)r)(handle, symbol);
}
#endif
