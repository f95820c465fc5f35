"""`devplugin serve` as a process serves /metrics on its metrics port: the figures follow what the kubelet
admitted (the wiring of the real entry point, not only of the test harness)."""

from __future__ import annotations

import shutil
import signal
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.app.test_serve_process import serve
from tests.support.daemon_harness import COUNT, MEM, _until, short_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_serve_exports_what_the_kubelet_admitted() -> None:
    root = short_dir()
    port = free_port()
    try:
        driver = FakeDriver.create(root / "drv", seed_node(2, 15360))
        with KubeletEmulator(root / "dp", root / "pr.sock") as kubelet:
            proc = serve(driver, root, "--mode", "cgpu", "--node-name", "", "--metrics-port", str(port))
            try:
                assert kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 2, timeout=20)
                got = kubelet.admit(PodSpec(name="p", namespace="default", uid="uid-p",
                                            containers=[ContainerSpec(name="main", limits={MEM: 6})]))
                uuid = got.containers[0].envs["NVIDIA_VISIBLE_DEVICES"]
                assert _until(lambda: all(v == 1 for _, v in scrape(port)["gpushare_resource_registered"]), 10)
                m = scrape(port)
                mem = {lab["uuid"]: v for lab, v in m["gpushare_gpu_memory_allocated_units"]}
                assert mem == {u: (6 if u == uuid else 0) for u in mem} and len(mem) == 2
                # cgpu serves no compute shares: no capacity to allocate against
                assert {v for _, v in m["gpushare_gpu_core_capacity_percent"]} == {0}
                calls = {(lab["call"], lab["resource"]): v for lab, v in m["gpushare_admission_duration_seconds_count"]}
                assert calls[("Allocate", MEM)] == 1 and calls[("Allocate", COUNT)] == 0
            finally:
                proc.send_signal(signal.SIGTERM)
                out, _ = proc.communicate(timeout=15)
            assert proc.returncode == 0, out
    finally:
        shutil.rmtree(root, ignore_errors=True)
