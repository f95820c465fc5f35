"""What the daemon shares of MIG GPUs and how it tells a changed MIG layout from one only waiting for a reset
(devplugin/gpu/mig.py, devplugin/gpu/layout_watch.py): pure functions over NVML's answers."""

from __future__ import annotations

from devplugin.gpu.device import GPU
from devplugin.gpu.layout_watch import LayoutWatcher, changes
from devplugin.gpu.mig import MigDevice, MigState, profile_of, shared_devices

GiB = 1 << 30


def gpu(i: int) -> GPU:
    return GPU(index=i, uuid=f"GPU-{i}", name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * GiB, minor=i,
               pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=1, nvlink_island=0)


def dev(n: int, profile: str = "1g.10gb", gib: int = 9) -> MigDevice:
    return MigDevice(f"MIG-{n}", f"NVIDIA A100-SXM4-80GB MIG {profile}", gib * GiB, profile, n, 0)


ON = MigState(True, True, (dev(1), dev(2)))


def test_a_mig_gpu_is_shared_as_its_mig_devices_after_the_gpus_and_keeps_its_place() -> None:
    shared = shared_devices([gpu(0), gpu(1), gpu(2)], {"GPU-1": ON}, first_mig_index=3)
    assert [(g.index, g.uuid) for g in shared] == [(0, "GPU-0"), (3, "MIG-1"), (4, "MIG-2"), (2, "GPU-2")]
    mig = shared[1]
    assert (mig.parent_uuid, mig.parent_index, mig.mig_profile, mig.memory_bytes) == ("GPU-1", 1, "1g.10gb", 9 * GiB)
    assert (mig.minor, mig.numa_node, mig.nvlink_island) == (1, 1, 0)  # its GPU's


def test_mig_on_without_devices_shares_nothing_and_mig_off_pending_on_is_shared_whole_but_marked() -> None:
    shared = shared_devices([gpu(0), gpu(1)], {"GPU-0": MigState(True, True, ()),
                                                "GPU-1": MigState(False, True, ())}, first_mig_index=2)
    assert [(g.uuid, g.reset_pending) for g in shared] == [("GPU-1", True)]


def test_changes_tell_a_pending_reset_from_a_layout_that_is_gone() -> None:
    served = shared_devices([gpu(0), gpu(1)], {"GPU-1": ON}, first_mig_index=2)
    assert changes(served, {"GPU-0": MigState(), "GPU-1": ON}) == {}
    pending = changes(served, {"GPU-0": MigState(), "GPU-1": MigState(True, False, ON.devices)})
    assert pending["GPU-1"].affected == ("MIG-1", "MIG-2") and not pending["GPU-1"].differs
    assert "nvidia-smi -r -i 1" in pending["GPU-1"].reason
    seven = MigState(True, True, (dev(3, "7g.80gb", 79),))
    gone = changes(served, {"GPU-0": MigState(False, True, ()), "GPU-1": seven})
    assert gone["GPU-1"].differs and gone["GPU-1"].affected == ("MIG-1", "MIG-2")
    assert gone["GPU-0"].affected == ("GPU-0",) and not gone["GPU-0"].differs


def test_each_change_is_reported_once_per_new_state() -> None:
    served = shared_devices([gpu(0), gpu(1)], {"GPU-1": ON}, first_mig_index=2)
    states = [{"GPU-1": MigState(True, False, ON.devices)}]
    seen: list[str] = []
    watcher = LayoutWatcher(served, lambda c: seen.append(c.gpu_uuid), read=lambda gpus: states[-1])
    watcher.check()
    watcher.check()
    states.append({"GPU-1": MigState(False, False, ())})
    watcher.check()
    assert seen == ["GPU-1", "GPU-1"]


def test_the_profile_comes_from_nvmls_name_else_from_the_slices() -> None:
    class Attrs:
        gpuInstanceSliceCount = 2
        memorySizeMB = 19968

    assert profile_of("NVIDIA H100 80GB HBM3 MIG 1g.10gb", Attrs()) == "1g.10gb"
    assert profile_of("something else", Attrs()) == "2g.20gb"
