"""The checks of what a container sees (tests/realk8s/inside.py) on views of the workload probe's shape: a view that
matches its grant passes, and each way it can differ from it is named."""

from __future__ import annotations

import copy
from typing import Any

from tests.realk8s.inside import CONTEXT_CHARGE, GiB, View, sees_compute, sees_free, sees_no_gpu, sees_slice, sees_whole

UUID, OTHER = "GPU-0a6c2f1e-0000-4000-8000-000000000001", "GPU-0a6c2f1e-0000-4000-8000-000000000002"
WHOLE = 80 * GiB


def share_view(memory: int = 2 * GiB, sm: int = 30, unreserved: bool = False) -> dict[str, Any]:
    """What the probe prints in a container granted `memory` bytes and `sm` % of one GPU under the shim."""
    limits = f"version=1\ndevices=1\ndevice.0.uuid={UUID}\ndevice.0.memory_limit={memory}\ndevice.0.sm_limit={sm}\n"
    if unreserved:
        limits += "device.0.sm_unreserved=1\n"
    return {
        "env": {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices", "CUDA_DEVICE_SM_LIMIT": str(sm),
                "CUDA_DEVICE_MEMORY_LIMIT_0": f"{memory >> 20}m"},
        "preload": ["/usr/local/gpushare/lib/libgpushare.so"], "shim_loaded": True,
        "limits": limits + "core_policy=default\n", "devices": ["nvidia0", "nvidiactl"],
        "nvml": {"gpus": [{"index": 0, "uuid": UUID, "total": memory, "used": 0, "free": memory}]},
        "runtime": {"driver": True, "rc": 0, "steps": [
            {"op": "init", "rc": 0}, {"op": "meminfo", "rc": 0, "free": memory - CONTEXT_CHARGE, "total": memory}]},
        "smi": {"rc": 0, "rows": [["0", UUID, str(memory >> 20), "0", str(memory >> 20)]]},
    }


def whole_view() -> dict[str, Any]:
    return {
        "env": {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}, "preload": None,
        "shim_loaded": False, "limits": None, "devices": ["nvidia0", "nvidiactl"],
        "nvml": {"gpus": [{"index": 0, "uuid": UUID, "total": WHOLE, "used": 0, "free": WHOLE}]},
        "runtime": {"driver": True, "rc": 0, "steps": [{"op": "meminfo", "rc": 0, "free": WHOLE, "total": WHOLE}]},
        "smi": {"rc": 0, "rows": [["0", UUID, str(WHOLE >> 20), "0", str(WHOLE >> 20)]]},
    }


def slice_checks(raw: dict[str, Any], sm: int | None = 30, unreserved: bool = False) -> list[str]:
    v = View(raw)
    return (sees_slice(v, [UUID], 2 * GiB, sm) + sees_free(v, 2 * GiB)
            + sees_compute(v, [UUID], sm, unreserved=unreserved))


def test_a_view_that_matches_its_grant_passes() -> None:
    assert slice_checks(share_view()) == []
    assert slice_checks(share_view(sm=30, unreserved=True), sm=None, unreserved=True) == []
    assert sees_whole(View(whole_view()), [UUID], {UUID: WHOLE}) == []


def test_each_difference_from_a_share_is_named() -> None:
    raw = share_view()
    raw["nvml"]["gpus"][0]["uuid"] = OTHER
    assert any("NVML shows GPUs" in s for s in slice_checks(raw))
    raw = share_view(memory=4 * GiB)
    assert any("NVML says" in s for s in slice_checks(raw))
    assert any("CUDA runtime" in s for s in slice_checks(raw))
    raw = share_view()
    raw["shim_loaded"] = False
    assert any("shim is not preloaded" in s for s in slice_checks(raw))
    assert any("sm_limit 30, granted 40" in s for s in slice_checks(share_view(), sm=40))
    raw = share_view()
    raw["env"]["CUDA_DEVICE_SM_LIMIT"] = "100"
    assert any("CUDA_DEVICE_SM_LIMIT=100, granted 30" in s for s in slice_checks(raw))
    raw = share_view()
    raw["runtime"]["steps"][1]["free"] -= 1 << 20  # something already held in a fresh container
    assert any("bytes free of a fresh" in s for s in slice_checks(raw))


def test_a_memory_only_container_is_marked_as_reserving_no_compute() -> None:
    assert any("sm_unreserved=0" in s for s in slice_checks(share_view(), sm=None, unreserved=True))
    assert any("sm_unreserved=1" in s for s in slice_checks(share_view(unreserved=True)))
    raw = share_view(sm=30, unreserved=True)
    raw["env"]["CUDA_DEVICE_SM_LIMIT"] = "100"  # the env says more than the limits file caps it at
    assert any("the limits file's sm_limit [30]" in s for s in slice_checks(raw, sm=None, unreserved=True))


def test_whole_gpus_under_a_cap_or_the_shim_are_named() -> None:
    capped = share_view(memory=WHOLE, sm=100)
    found = sees_whole(View(capped), [UUID], {UUID: WHOLE})
    assert any("shim is preloaded" in s for s in found) and any("limits file" in s for s in found)
    assert any("caps in its env" in s for s in found)
    raw = copy.deepcopy(whole_view())
    raw["runtime"]["steps"][0]["free"] = WHOLE - GiB
    assert any("the whole GPU is" in s for s in sees_whole(View(raw), [UUID], {UUID: WHOLE}))
    assert any("granted" in s for s in sees_whole(View(whole_view()), [OTHER], {OTHER: WHOLE}))


def test_a_cpu_container_that_sees_a_gpu_is_named() -> None:
    blind = {"devices": [], "nvml": {"error": "Driver Not Loaded"}, "runtime": {"driver": False},
             "smi": {"rc": 127, "rows": []}}
    assert sees_no_gpu(View(blind)) == []
    assert len(sees_no_gpu(View(whole_view()))) == 4  # the driver, device nodes, NVML, nvidia-smi
