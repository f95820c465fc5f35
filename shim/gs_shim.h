/* What the hook units (gs_context, gs_memory, gs_meminfo, gs_launch, gs_procaddr, gs_nvml) build on. The layers,
 * each using only those below it:
 *   gs_log, gs_parse, gs_config, gs_real, gs_region, gs_ptrmap    leaves
 *   gs_state                                                     enter, refuse, fork handler registration
 *   gs_devices                                                   the device table, the current device
 *   gs_account, gs_throttle                                      memory accounting, the compute share
 *   the hooks, gs_init (wires the device table to the compute share)
 */
#ifndef GS_SHIM_H
#define GS_SHIM_H

#include "gs_account.h"
#include "gs_config.h"
#include "gs_cuda_types.h"
#include "gs_devices.h"
#include "gs_ptrmap.h"
#include "gs_real.h"
#include "gs_state.h"

/* The start of a hook: return what gs_enter() refuses with, or CUDA_ERROR_NOT_SUPPORTED when the driver does
 * not have the entry point. */
#define GS_ENTER_OR_RETURN(name)             \
    do {                                     \
        CUresult e_ = gs_enter();            \
        if (e_)                              \
            return e_;                       \
        if (!gs_cu.name)                     \
            return CUDA_ERROR_NOT_SUPPORTED; \
    } while (0)

#endif /* GS_SHIM_H */
