/* The devices this process sees, matched to their limits by UUID, and which one the calling thread uses.
 * Above gs_state, gs_config and gs_region; knows nothing of accounting or the compute share: whoever needs to
 * act once the table is filled (the compute share) is told through gs_devices_on_ready. */
#ifndef GS_DEVICES_H
#define GS_DEVICES_H

#include "gs_config.h"
#include "gs_real.h"
#include "gs_state.h"

struct gs_dev {
    char uuid[GS_UUID_LEN];
    int blocked;          /* the limits file does not list this GPU: it must not be used */
    uint64_t limit;       /* bytes, 0 = no memory limit */
    uint64_t phys_total;  /* the GPU's real memory */
    uint64_t granularity; /* the driver's allocation granularity for device memory (bytes, a power of two) */
    int sm_limit;         /* 1..100 */
    int rd;               /* index in the accounting file */
};

extern struct gs_dev gs_devs[GS_MAX_DEVICES];
extern int gs_ndevs;     /* CUDA devices this process sees (table filled), 0 before cuInit */
extern int gs_any_limit; /* any device has a memory limit or is blocked: allocations are accounted */

/* Fill the device table once the driver is initialised. 0 when ready, -1 when the driver is not. */
int gs_devices_setup(void);
static inline int gs_devices_ready(void)
{
    return GS_LIKELY(__atomic_load_n(&gs_ndevs, __ATOMIC_ACQUIRE) > 0) || gs_devices_setup() == 0;
}
/* CUDA ordinal of the calling thread's current context. CUDA_SUCCESS, or the driver's error. */
CUresult gs_current_device(int *d);

/* Called once, with the table filled and before any hook sees it (one listener; set it from a constructor).
 * It returns 0, or -1 after refusing CUDA (gs_refuse): the table then stays unfilled. */
typedef int (*gs_devices_listener)(int ndevs);
void gs_devices_on_ready(gs_devices_listener fn);

#endif /* GS_DEVICES_H */
