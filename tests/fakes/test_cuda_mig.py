"""MIG devices through CUDA: the fake libcuda enumerates a MIG-enabled GPU as its MIG devices, at most one per
process, named by CUDA_VISIBLE_DEVICES as MIG-<uuid>, with the instance's memory, SMs and UUID; the shim caps a
container inside its MIG device when its limits file names the device's MIG UUID."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devplugin import contract
from devplugin_sim.fake_driver import FakeDriver
from devplugin_sim.mig_layouts import mig_node
from tests.support.shim_probe import (
    BUILD,
    CUDA_SUCCESS,
    FAKE_CUDA,
    GiB,
    MiB,
    Node,
    next_step,
    require_built,
    run,
    start,
)

# Prints what CUDA enumerates: [{"name", "uuid" (hex of the 16 bytes), "total", "sms"}...], or {"rc"} on failure.
_ENUMERATE = r"""
import ctypes, json, sys
cu = ctypes.CDLL(sys.argv[1])
rc = cu.cuInit(0)
if rc:
    print(json.dumps({"rc": rc})); sys.exit()
n = ctypes.c_int()
cu.cuDeviceGetCount(ctypes.byref(n))
out = []
for d in range(n.value):
    name = ctypes.create_string_buffer(256)
    cu.cuDeviceGetName(name, 256, d)
    uuid = (ctypes.c_ubyte * 16)()
    cu.cuDeviceGetUuid_v2(uuid, d)
    total = ctypes.c_size_t()
    cu.cuDeviceTotalMem_v2(ctypes.byref(total), d)
    sms = ctypes.c_int()
    cu.cuDeviceGetAttribute(ctypes.byref(sms), 16, d)  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    out.append({"name": name.value.decode(), "uuid": bytes(uuid).hex(), "total": total.value, "sms": sms.value})
print(json.dumps(out))
"""


@pytest.fixture
def mig(tmp_path: Path) -> Node:
    require_built()
    return Node(FakeDriver.create(tmp_path / "node", mig_node()), tmp_path)


def hex_of(uuid: str) -> str:
    return uuid[4:].replace("-", "")


def enumerate_with(env: dict[str, str]) -> list[dict] | dict:
    proc = subprocess.run([sys.executable, "-c", _ENUMERATE, str(FAKE_CUDA)], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def enumerate_devices(node: Node, **env: str) -> list[dict] | dict:
    return enumerate_with(node.env(shim=False, **env))


def test_a_mig_device_named_by_its_uuid_is_the_process_s_one_cuda_device(mig: Node) -> None:
    gpu = mig.driver.gpus[1]
    small = gpu.mig_devices[2]
    seen = enumerate_devices(mig, CUDA_VISIBLE_DEVICES=small.uuid)
    assert seen == [{"name": f"NVIDIA A100-SXM4-80GB MIG {small.profile}", "uuid": hex_of(small.uuid),
                     "total": small.memory_mib * MiB, "sms": small.sms}]


def test_one_mig_device_per_process_however_many_it_is_given(mig: Node) -> None:
    gpu = mig.driver.gpus[1]
    both = ",".join(m.uuid for m in gpu.mig_devices[1:])
    assert [d["uuid"] for d in enumerate_devices(mig, CUDA_VISIBLE_DEVICES=both)] == [hex_of(gpu.mig_devices[1].uuid)]
    # Unset: GPU 0, GPU 1's first MIG device (GPU 1 itself is not a CUDA device), GPU 2.
    seen = enumerate_devices(mig)
    assert [d["uuid"] for d in seen] == [hex_of(mig.driver.gpus[0].uuid), hex_of(gpu.mig_devices[0].uuid),
                                         hex_of(mig.driver.gpus[2].uuid)]
    assert seen[1]["total"] == gpu.mig_devices[0].memory_mib * MiB


def test_the_older_mig_gpu_gi_ci_form_and_a_name_that_matches_nothing(mig: Node) -> None:
    gpu = mig.driver.gpus[1]
    m = gpu.mig_devices[1]
    seen = enumerate_devices(mig, CUDA_VISIBLE_DEVICES=f"MIG-{gpu.uuid}/{m.gi}/{m.ci}")
    assert [d["uuid"] for d in seen] == [hex_of(m.uuid)]
    assert enumerate_devices(mig, CUDA_VISIBLE_DEVICES="MIG-ffffffff") == {"rc": 100}  # CUDA_ERROR_NO_DEVICE


def test_memory_taken_in_a_mig_device_is_the_mig_device_s(mig: Node) -> None:
    small = mig.driver.gpus[1].mig_devices[2]
    steps = run(mig.env(shim=False, CUDA_VISIBLE_DEVICES=small.uuid), "init", "ctx", 0, "fill", "alloc", "1g")
    assert steps[2]["bytes"] == (small.memory_mib * MiB) // GiB * GiB


def test_the_shim_caps_inside_the_mig_device_its_limits_file_names(mig: Node) -> None:
    small = mig.driver.gpus[1].mig_devices[2]
    limits = contract.Limits(devices=(contract.DeviceLimit(small.uuid, 2 * GiB, 100),))
    path = mig.write_limits(limits)
    steps = run(mig.env(GPUSHARE_LIMITS_FILE=path, CUDA_VISIBLE_DEVICES=small.uuid),
                "init", "ctx", 0, "meminfo", "totalmem", 0, "fill", "alloc", "256m")
    assert steps[1]["rc"] == CUDA_SUCCESS
    assert steps[2]["total"] == 2 * GiB
    assert steps[3]["total"] == 2 * GiB
    assert steps[4]["bytes"] == 2 * GiB


def test_nvidia_smi_lists_mig_devices_under_their_gpu(mig: Node) -> None:
    gpus = mig.driver.gpus
    out = subprocess.run([str(BUILD / "fakes" / "nvidia-smi"), "-L"], env=mig.env(shim=False), capture_output=True,
                         text=True, timeout=30, check=True).stdout.splitlines()
    assert out[0] == f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {gpus[0].uuid})"
    assert out[1] == f"GPU 1: NVIDIA A100-SXM4-80GB (UUID: {gpus[1].uuid})"
    assert out[2:5] == [f"  MIG {m.profile:<13} Device {n:2}: (UUID: {m.uuid})"
                        for n, m in enumerate(gpus[1].mig_devices)]
    assert out[5] == f"GPU 2: NVIDIA A100-SXM4-80GB (UUID: {gpus[2].uuid})"


def test_a_container_given_a_mig_device_sees_it_under_its_gpu_and_uses_the_node_s_slot(mig: Node) -> None:
    gpu = mig.driver.gpus[1]
    small = gpu.mig_devices[2]
    slot = mig.driver.mig_slot(small.uuid)
    config = mig.driver.write_container_config(mig.dir / "ctr" / "nvml.conf", [small.uuid], driver_socket=None)
    text = config.read_text()
    assert text.count("\ngpu ") == 1 and text.count("\nmig ") == 1 and f"slot={slot}" in text
    env = {**mig.env(shim=False), "FAKE_NVML_CONFIG": str(config)}
    assert [d["uuid"] for d in enumerate_with(env)] == [hex_of(small.uuid)]
    proc = start(env, "init", "ctx", 0, "alloc", "1g", "ready")
    try:
        assert [next_step(proc)["op"] for _ in range(4)] == ["init", "ctx", "alloc", "ready"]
        assert mig.driver.memory_used(slot) == GiB  # the node sees it in that MIG device
        assert mig.driver.memory_used(1) == 0
    finally:
        proc.kill()
        proc.wait()
