"""`devplugin demo` (what `make demo` runs): the real daemon, linked to the fake apiserver, on the simulated
4 x 15 GiB node. These assert what a user reads in its output and relies on."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest


@pytest.fixture(scope="module")
def demo() -> tuple[str, str, float]:
    """(output, output with whitespace collapsed, seconds taken)."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "devplugin", "demo"], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, " ".join(proc.stdout.split()), took


def per_gpu_tables(out: str) -> list[dict[int, str]]:
    """Each "per GPU" table as {GPU index: the rest of its row}."""
    tables: list[dict[int, str]] = []
    for line in out.splitlines():
        if line.strip().startswith("per GPU"):
            tables.append({})
        m = re.match(r"\s+GPU (\d)  (.*)$", line)
        if m and tables:
            tables[-1][int(m.group(1))] = m.group(2)
    return tables


def pods_on(row: str) -> list[str]:
    return row.split("  ")[-1].split(", ")


def test_demo_is_quick_and_fits_an_80_column_terminal(demo: tuple[str, str, float]) -> None:
    out, _, took = demo
    assert took < 60, f"the demo took {took:.0f} s"  # about 3 s on an idle machine; generous for a loaded one
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, wide


def test_the_node_serves_the_seed_resources_and_the_daemon_becomes_ready(demo: tuple[str, str, float]) -> None:
    out, flat, _ = demo
    assert "aliyun.com/gpu-core.percentage: capacity 400, allocatable 400" in out
    assert "aliyun.com/gpu-mem: capacity 60, allocatable 60" in out
    assert "aliyun.com/gpu-count: capacity 4, allocatable 4" in out
    assert "--node-name gpu-node-1 --kubeconfig" in flat
    assert flat.count("GET /readyz -> 200 ok") == 2  # at start, and after the relabel


def test_the_seed_job_gets_its_limits_mounts_and_record(demo: tuple[str, str, float]) -> None:
    out, flat, _ = demo
    assert "+ cuda-sample" in out
    assert "CUDA_DEVICE_SM_LIMIT=30" in out and "CUDA_DEVICE_MEMORY_LIMIT_0=2048m" in out
    assert "/etc/gpushare/limits (ro)" in flat
    assert re.search(r'gpushare\.io/allocated: \{"version": 1, "node": "gpu-node-1", .*"mem": 2, "core": 30', flat)
    assert "ALIYUN_COM_GPU_MEM_ASSIGNED: true" in flat
    # the shim is built by `make test` before the tests run
    assert "cuMemGetInfo: total 2048 MiB" in out
    assert "NVML (what nvidia-smi shows): total 2048 MiB" in out


def test_pods_by_name_on_each_gpu_from_the_annotations(demo: tuple[str, str, float]) -> None:
    out, _, _ = demo
    binpack, spread = per_gpu_tables(out)
    assert sorted(pods_on(binpack[0])) == ["cuda-sample", "infer-a", "infer-b", "notebook"]
    assert binpack[0].startswith("15/15 GiB  90/100 %")
    assert pods_on(binpack[1]) == ["train"]
    assert "whole (gpu-count)" in binpack[2] and pods_on(binpack[2]) == ["exclusive"]
    assert pods_on(binpack[3]) == ["pinned"]
    # spread puts the four shared pods on four GPUs; Alibaba's ALIYUN_COM_GPU_MEM_IDX=3 is honoured
    assert [pods_on(spread[i])[0] for i in range(4)] == ["cuda-sample-2", "infer-a-2", "infer-b-2", "train-2"]
    assert "ali-pinned" in pods_on(spread[3])
    assert re.search(r"\+ ali-pinned +gpu-mem 2 +-> GPU 3", out)


def test_the_scheduler_chosen_gpu_is_honoured(demo: tuple[str, str, float]) -> None:
    _, flat, _ = demo
    assert re.search(r"\+ pinned .*? Event Normal GPUAssigned: container main: 4 GiB and 20 % of GPU 3 "
                     r"\(GPU-[0-9a-f-]+\) \(gpushare\.io/scheduled\)", flat)


def test_a_whole_gpu_leaves_the_shared_pool_and_comes_back(demo: tuple[str, str, float]) -> None:
    out, _, _ = demo
    rows = {m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^\s+(before exclusive|while exclusive runs|after it ended)\s+(\d+)\s+(\d+)",
                                 out, re.M)}
    assert rows == {"before exclusive": (60, 400), "while exclusive runs": (45, 300), "after it ended": (60, 400)}


def test_refused_pods_say_why_in_a_warning_event(demo: tuple[str, str, float]) -> None:
    _, flat, _ = demo
    bad = re.search(r"x bad-core .*?`kubectl describe pod bad-core` shows: Warning GPUAllocationFailed (.*?) x too-big",
                    flat)
    assert bad and "33 is not a valid compute share; ask for a multiple of 5" in bad.group(1)
    big = re.search(r"`kubectl describe pod too-big` shows: Warning GPUAllocationFailed (.*?) per GPU", flat)
    assert big and "no GPU of this node has room for 16 GiB" in big.group(1)
    assert "lower the request" in big.group(1)


def test_the_relabel_is_followed_and_sigterm_leaves_nothing_behind(demo: tuple[str, str, float]) -> None:
    out, flat, _ = demo
    assert "relabel: ack.node.gpu.placement=spread" in out and "binpack" in out
    assert re.search(r"Warning GPUModeChange GPU mode/placement changed to core_mem/spread \(was core_mem/binpack\); "
                     r"applying now", flat)  # nothing held: applied at once
    assert out.count("its sockets left behind: none") == 1
    assert "daemon exited 0" in flat
