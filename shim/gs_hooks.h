/* The names the shim answers for, shared by its two lookup doors (cuGetProcAddress in gs_procaddr.c, dlsym in
 * gs_dlsym.c). */
#ifndef GS_HOOKS_H
#define GS_HOOKS_H

/* The shim's hook for a driver or NVML entry point named exactly `symbol`, or NULL. */
void *gs_hook_by_name(const char *symbol);
/* 1 when `symbol` names a way to take device memory that the shim does not account (an entry point newer than
 * the shim, or an old version it does not hook): such lookups are refused, with a message naming it. */
int gs_unaccounted_allocation(const char *symbol);

#endif /* GS_HOOKS_H */
