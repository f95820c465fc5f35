/* Wiring that belongs to no single layer: the compute share starts when the device table is filled (the
 * device table knows nothing of the compute share). */
#include "gs_devices.h"
#include "gs_throttle.h"

static void start_compute_share(int ndevs)
{
    gs_throttle_setup(ndevs);
}

__attribute__((constructor)) static void wire(void)
{
    gs_devices_on_ready(start_compute_share);
}
