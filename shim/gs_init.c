/* Wiring that belongs to no single layer: the compute share starts when the device table is filled (the
 * device table knows nothing of the compute share, and the compute share reads no device table: it is told
 * each GPU's UUID, share and whether it may be used). */
#include <string.h>

#include "gs_devices.h"
#include "gs_throttle.h"

static int start_compute_share(int ndevs)
{
    struct gs_share_limit limits[GS_MAX_DEVICES];
    for (int d = 0; d < ndevs && d < GS_MAX_DEVICES; d++) {
        _Static_assert(sizeof limits[d].uuid == sizeof gs_devs[d].uuid, "UUID buffers of one size");
        memcpy(limits[d].uuid, gs_devs[d].uuid, sizeof limits[d].uuid);
        limits[d].share = gs_devs[d].sm_limit;
        limits[d].unreserved = gs_config_unreserved(gs_devs[d].uuid);
        limits[d].blocked = gs_devs[d].blocked;
    }
    if (gs_throttle_setup(limits, ndevs, gs_cfg.policy, gs_cfg.cache_path) != 0) {
        gs_refuse("a compute share must be held but the usage file cannot be used (see the message above)");
        return -1;
    }
    return 0;
}

__attribute__((constructor)) static void wire(void)
{
    gs_devices_on_ready(start_compute_share);
}
