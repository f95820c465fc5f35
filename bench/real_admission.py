"""Admission cost through the kubelet's REAL device manager (e2e/bin/nodeagent --standalone, Kubernetes 1.36.3):
the project's daemon (`devplugin serve` on the fake driver, 8 x 80 GiB) against the kubelet's own stub device
plugin (e2e/bin/stubplugin, two resources with the same device counts: 640 gpu-mem units, 800 core units), each
behind its own agent, admissions interleaved (one pod on the daemon's node, the same-sized pod on the stub's).

A pod asks gpu-mem 1 to 40 GiB and gpu-core.percentage 5 to 60 % (multiples of 5) in one container; pods end at
random so that at most --live stay on a node. The figure is the admit handlers' time inside the agent (the
topology manager's handler calling Allocate for each resource, and the predicate handler), so the HTTP call that
drives the agent is not in it. Needs `make e2e-bin`.

Run: .venv/bin/python bench/real_admission.py [--pods 100 1000] [--live 12] [--seed 7]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CORE, MEM, gpus, percentile, start_daemon, stop, workdir  # noqa: E402
from devplugin_sim.fake_driver import FakeDriver  # noqa: E402
from tests.realk8s.agent import NodeAgent, pod_manifest  # noqa: E402
from tests.realk8s.stub import StubPlugin  # noqa: E402

STUB_MEM, STUB_CORE = "example.com/mem", "example.com/core"


def run(n: int, live: int, seed: int, daemon_agent: NodeAgent, stub_agent: NodeAgent, tag: str) -> None:
    rng = random.Random(seed)
    times: dict[str, list[float]] = {"daemon": [], "stub": []}
    refused = {"daemon": 0, "stub": 0}
    held: list[str] = []
    for i in range(n):
        if len(held) >= live:
            uid = held.pop(rng.randrange(len(held)))
            daemon_agent.end(f"d-{uid}")
            stub_agent.end(f"s-{uid}")
        mem, core = rng.randint(1, 40), 5 * rng.randint(1, 12)
        uid = f"{tag}-{i}"
        for name, agent, limits in (("daemon", daemon_agent, {MEM: mem, CORE: core}),
                                    ("stub", stub_agent, {STUB_MEM: mem, STUB_CORE: core})):
            res = agent.admit(pod_manifest(f"p-{uid}", f"{name[0]}-{uid}", [limits]))
            times[name].append(res["seconds"] * 1000)
            if not res["admitted"]:
                refused[name] += 1
        held.append(uid)
    for uid in held:  # the next run starts on empty nodes
        daemon_agent.end(f"d-{uid}")
        stub_agent.end(f"s-{uid}")
    d50, s50 = percentile(times["daemon"], 50), percentile(times["stub"], 50)
    d99, s99 = percentile(times["daemon"], 99), percentile(times["stub"], 99)
    print(f"{n:5d} pods  daemon p50 {d50:6.2f} ms  p99 {d99:6.2f} ms  (refused {refused['daemon']})   "
          f"stub p50 {s50:6.2f} ms  p99 {s99:6.2f} ms  (refused {refused['stub']})   "
          f"ratio p50 {d50 / s50:4.2f}x  p99 {d99 / s99:4.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--live", type=int, default=12, help="pods kept on a node before one ends")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    root = workdir()
    daemon_agent = NodeAgent(root / "d", "daemon-node")
    stub_agent = NodeAgent(root / "s", "stub-node")
    daemon = None
    stubs: list[StubPlugin] = []
    try:
        daemon_agent.start()
        stub_agent.start()
        driver = FakeDriver.create(root / "drv", gpus(8, 80 * 1024))
        daemon_root = root / "dd"
        daemon_root.mkdir()
        (daemon_root / "dp").symlink_to(daemon_agent.plugin_dir)
        (daemon_root / "pr.sock").symlink_to(daemon_agent.pod_resources_socket)
        daemon = start_daemon(driver, daemon_root)
        stubs = [StubPlugin(stub_agent.plugin_dir, STUB_MEM, 640, socket_name="mem.sock").start(),
                 StubPlugin(stub_agent.plugin_dir, STUB_CORE, 800, socket_name="core.sock").start()]
        daemon_agent.wait_books(lambda b: b["allocatable"].get(MEM) == 640 and b["allocatable"].get(CORE) == 800)
        stub_agent.wait_books(lambda b: b["allocatable"].get(STUB_MEM) == 640
                              and b["allocatable"].get(STUB_CORE) == 800)
        print("admission through the kubelet's device manager (admit handlers' time), daemon vs the kubelet's "
              "stub plugin, interleaved")
        for k, n in enumerate(args.pods):
            run(n, args.live, args.seed + k, daemon_agent, stub_agent, f"r{k}")
    finally:
        for s in stubs:
            s.stop()
        if daemon is not None:
            stop(daemon)
        daemon_agent.stop()
        stub_agent.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
