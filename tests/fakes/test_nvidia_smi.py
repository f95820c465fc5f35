"""nvidia-smi over the fake driver (build/fakes/nvidia-smi, fakes/smi): what users read, its failures as the real
tool prints them, and the shim's view of memory when the shim is preloaded."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from devplugin import contract
from devplugin_sim.fake_driver import DEFAULT_HOST_PID_OFFSET, FakeDriver, FakeGPU, library_dir
from tests.support.shim_probe import GiB, Node, start, until
from tests.support.shim_probe import node as node  # the fixture: two 16 GiB GPUs

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
             "latest NVIDIA driver is installed and running.")


def smi(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(library_dir() / "nvidia-smi"), *args], env=env, capture_output=True, text=True,
                          timeout=60)


def held(node: Node, env: dict[str, str], size: str):
    """A process of the node holding `size` of GPU 0 until its stdin closes."""
    proc = start(env, "init", "ctx", 0, "alloc", size, "ready")
    until(proc, "ready")
    return proc


def release(proc) -> None:
    proc.stdin.close()
    proc.wait(timeout=10)


def test_the_summary_shows_versions_gpus_memory_utilisation_and_processes(node: Node) -> None:
    node.driver.set_utilization(1, 42)
    idle = smi(node.env(shim=False))
    assert idle.returncode == 0, idle.stdout + idle.stderr
    assert re.search(r"NVIDIA-SMI 550\.54\.15 +Driver Version: 550\.54\.15 +CUDA Version: 12\.4", idle.stdout)
    assert re.search(r"\|   0  Tesla V100-SXM2-16GB .*\|   00000000:00:07\.0 ", idle.stdout)
    assert re.search(r"\|   1  Tesla V100-SXM2-16GB .*\|   00000000:00:08\.0 ", idle.stdout)
    assert re.search(r"\| +0MiB / 16384MiB \| +0% ", idle.stdout)
    assert re.search(r"\| +0MiB / 16384MiB \| +42% ", idle.stdout)
    assert "No running processes found" in idle.stdout

    holder = held(node, node.env(shim=False), "512m")
    try:
        busy = smi(node.env(shim=False)).stdout
    finally:
        release(holder)
    assert re.search(r"\| +512MiB / 16384MiB \|", busy)
    row = re.search(rf"\|\s+0\s+N/A\s+N/A\s+{holder.pid + DEFAULT_HOST_PID_OFFSET}\s+C\s+.*\s(\d+)MiB \|", busy)
    assert row and row.group(1) == "512", busy  # the pid NVML reports, and its memory
    assert "No running processes found" not in busy


def test_list_gpus(node: Node) -> None:
    out = smi(node.env(shim=False), "-L")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [f"GPU {i}: Tesla V100-SXM2-16GB (UUID: {node.uuid(i)})" for i in range(2)]
    only = smi(node.env(shim=False), "-i", node.uuid(1), "-L")
    assert only.stdout.splitlines() == [f"GPU 1: Tesla V100-SXM2-16GB (UUID: {node.uuid(1)})"]


def test_query_gpu_in_csv_with_and_without_header_and_units(node: Node) -> None:
    node.driver.set_memory_used(0, 3 * GiB)
    node.driver.set_utilization(0, 7)
    fields = ("index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu,driver_version,pci.bus_id")
    full = smi(node.env(shim=False), f"--query-gpu={fields}", "--format=csv")
    assert full.returncode == 0, full.stdout
    assert full.stdout.splitlines() == [
        "index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%], "
        "driver_version, pci.bus_id",
        f"0, {node.uuid(0)}, Tesla V100-SXM2-16GB, 16384 MiB, 3072 MiB, 13312 MiB, 7 %, 550.54.15, 00000000:00:07.0",
        f"1, {node.uuid(1)}, Tesla V100-SXM2-16GB, 16384 MiB, 0 MiB, 16384 MiB, 0 %, 550.54.15, 00000000:00:08.0",
    ]
    bare = smi(node.env(shim=False), "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits")
    assert bare.stdout.splitlines() == ["0, 3072, 7", "1, 0, 0"]


def test_query_compute_apps(node: Node) -> None:
    args = ("--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv")
    assert smi(node.env(shim=False), *args).stdout.splitlines() == ["pid, used_gpu_memory [MiB], gpu_uuid"]
    holder = held(node, node.env(shim=False), "256m")
    try:
        out = smi(node.env(shim=False), *args)
        bare = smi(node.env(shim=False), args[0], "--format=csv,noheader,nounits")
    finally:
        release(holder)
    pid = holder.pid + DEFAULT_HOST_PID_OFFSET
    assert out.stdout.splitlines()[1:] == [f"{pid}, 256 MiB, {node.uuid(0)}"]
    assert bare.stdout.splitlines() == [f"{pid}, 256, {node.uuid(0)}"]


def test_bad_arguments_exit_2(node: Node) -> None:
    field = smi(node.env(shim=False), "--query-gpu=index,temperature.hbm", "--format=csv")
    assert (field.returncode, field.stdout.splitlines()[0]) == (
        2, 'Field "temperature.hbm" is not a valid field to query.')
    assert smi(node.env(shim=False), "--query-gpu=index").returncode == 2  # no --format
    assert smi(node.env(shim=False), "--bogus").returncode == 2


def test_no_driver_no_devices_no_library(node: Node, tmp_path: Path) -> None:
    env = node.env(shim=False)
    no_driver = smi({k: v for k, v in env.items() if k != "FAKE_NVML_CONFIG"})
    assert (no_driver.returncode, no_driver.stdout.strip()) == (9, NO_DRIVER)

    empty = FakeDriver.create(tmp_path / "empty", [])
    no_devices = smi({**env, **empty.env()})
    assert (no_devices.returncode, no_devices.stdout.strip()) == (6, "No devices were found")

    no_library = smi({**env, "LD_LIBRARY_PATH": str(tmp_path)})
    assert no_library.returncode == 12
    assert no_library.stdout.startswith("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system.")


def test_a_lost_gpu_is_reported_and_the_others_shown(node: Node) -> None:
    node.driver.set_lost(0, True)
    out = smi(node.env(shim=False), "-L")
    assert out.returncode == 15
    assert out.stdout.splitlines() == [
        "Unable to determine the device handle for GPU 0: GPU is lost",
        f"GPU 1: Tesla V100-SXM2-16GB (UUID: {node.uuid(1)})",
    ]


def test_under_the_shim_it_shows_the_containers_slice(node: Node) -> None:
    limits = contract.Limits(devices=(contract.DeviceLimit(node.uuid(0), 2 * GiB, 100),
                                      contract.DeviceLimit(node.uuid(1), 3 * GiB, 100)))
    env = node.env(GPUSHARE_LIMITS_FILE=node.write_limits(limits))
    holder = held(node, env, "512m")
    try:
        table = smi(env).stdout
        query = smi(env, "--query-gpu=index,memory.total,memory.used,memory.free", "--format=csv,noheader")
        outside = smi(node.env(shim=False), "--query-gpu=index,memory.total,memory.used", "--format=csv,noheader")
    finally:
        release(holder)
    assert re.search(r"\| +512MiB / 2048MiB \|", table) and re.search(r"\| +0MiB / 3072MiB \|", table)
    assert query.stdout.splitlines() == ["0, 2048 MiB, 512 MiB, 1536 MiB", "1, 3072 MiB, 0 MiB, 3072 MiB"]
    assert outside.stdout.splitlines() == ["0, 16384 MiB, 512 MiB", "1, 16384 MiB, 0 MiB"]  # the node's view


def test_a_one_gpu_node_of_another_model(tmp_path: Path) -> None:
    gpu = FakeGPU(index=0, uuid="GPU-a100a100-0000-0000-0000-000000000001", name="NVIDIA A100-SXM4-40GB",
                  memory_mib=40960, minor=0, pci_bus_id="00000000:07:00.0", compute_capability=(8, 0))
    one = Node(FakeDriver.create(tmp_path / "a100", [gpu]), tmp_path)
    out = smi(one.env(shim=False), "--query-gpu=name,memory.total,compute_cap,pci.bus_id", "--format=csv,noheader")
    assert out.stdout.splitlines() == ["NVIDIA A100-SXM4-40GB, 40960 MiB, 8.0, 00000000:07:00.0"]
