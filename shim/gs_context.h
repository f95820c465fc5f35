/* The steps around every driver call that may create a context: charge the process's first context on the GPU
 * against its limit (GPUSHARE_CONTEXT_RESERVE) before it is created, and learn the process's NVML pid while it
 * is (gs_pidmap.h). Used by the context hooks (gs_context.c) and by the runtime's private way to the primary
 * context (gs_export.c). A call nested in another's steps (the driver's private slot calling the exported
 * cuDevicePrimaryCtxRetain) takes none of its own. */
#ifndef GS_CONTEXT_H
#define GS_CONTEXT_H

#include "gs_shim.h"
#include "gs_throttle.h"

#define GS_CONTEXT_HOOK(name, dev, call)                   \
    do {                                                   \
        GS_ENTER_OR_RETURN(name);                          \
        int charged_ = 0;                                  \
        CUresult rc_;                                      \
        if (gs_devices_ready()) {                          \
            rc_ = gs_ctx_charge((dev), &charged_);         \
            if (rc_)                                       \
                return rc_;                                \
        }                                                  \
        struct gs_pidmap_scope map_;                       \
        gs_throttle_context_begin(&map_, (dev));           \
        rc_ = (call);                                      \
        gs_throttle_context_end(&map_, rc_);               \
        if (rc_ != CUDA_SUCCESS && charged_)               \
            gs_ctx_uncharge(dev);                          \
        return rc_;                                        \
    } while (0)

#endif /* GS_CONTEXT_H */
