"""A paid compute share beside containers that reserved none, on one (fake) GPU of a core_mem node.

The node daemon's allocator places a 70 % container and 1, 2 or 4 containers that ask for gpu-mem only on the same
GPU and writes each one's limits file; every container then runs kernels back to back under the real shim with
that limits file, on the fake GPU's shared timeline (which time-slices busy processes about evenly, as a GPU
does). What each container got is read from the timeline, not from the shim.
"""

from __future__ import annotations

import pytest

from devplugin import contract
from devplugin_sim.gpu_share import make_gpu, measure_steady, require_built
from devplugin_sim.placed_share import paid_beside_memory_only

PAID = 70
KEEPS = 65  # what the paid container must keep, in percent of the GPU
IDLE_BELOW = 90  # the GPU busy less than this over the window: its processes were short of CPU, not of GPU time


@pytest.mark.parametrize("paid_first", [True, False], ids=["paid-placed-first", "paid-placed-last"])
@pytest.mark.parametrize("memory_only", [1, 2, 4])
def test_a_paid_share_keeps_its_compute_beside_containers_that_reserved_none(tmp_path, memory_only, paid_first):
    require_built()
    for attempt in range(2):
        driver = make_gpu(tmp_path / f"node{attempt}")
        try:
            containers = paid_beside_memory_only(tmp_path / f"state{attempt}", driver.gpus[0].uuid, PAID,
                                                 memory_only, paid_first)
            got = measure_steady(driver, tmp_path / f"run{attempt}", containers, settle=2.0, window=2.0)
        finally:
            driver.close()
        if got["paid"] >= KEEPS or sum(got.values()) >= IDLE_BELOW:
            break  # measured, or the GPU was busy: what the paid container lacked, a neighbour took
        # the GPU stood idle: the processes were short of CPU on a loaded machine, not of GPU time; once more
    assert got["paid"] >= KEEPS, got
    assert all(v > 0.5 for v in got.values()), got  # the others still run, on what the paid one leaves


def test_the_limits_of_a_memory_only_container_cap_it_at_the_compute_nobody_reserved(tmp_path):
    containers = paid_beside_memory_only(tmp_path, "GPU-00000000-1111-2222-3333-444444444444", PAID, 2)
    limits = {c.name: contract.parse_limits(open(c.limits_file).read()).devices[0] for c in containers}
    assert (limits["paid"].sm_limit, limits["paid"].sm_unreserved) == (70, False)
    for name in ("memonly0", "memonly1"):
        assert (limits[name].sm_limit, limits[name].sm_unreserved) == (30, True), limits
