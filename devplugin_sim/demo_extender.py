"""`make demo-cluster`: the fragmentation case, on two simulated nodes with real node daemons.

gpu-node-1 has 12 GiB free as 3 on each of its four GPUs; gpu-node-2 has 8 GiB free, all on GPU 3. A pod asks for
6 GiB. The default scheduler, which sees node totals, picks gpu-node-1 (more free memory), and the kubelet there
fails the pod: no GPU has 6 GiB. The extender filters gpu-node-1 out with the reason, binds the pod to gpu-node-2
with its GPU choice, and the node daemon there admits it on that GPU. `devplugin inspect -d` shows the result.

Everything real but the edges: a fake apiserver, two kubelet emulators, fake NVIDIA drivers; the node daemons
(`devplugin serve`) run as processes; the extender is the HTTP app of `devplugin scheduler`, fed by its watches.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from devplugin import contract as c
from devplugin.inspect.cli import main as inspect_main
from devplugin.scheduler.cluster import KubeCluster
from devplugin.scheduler.informer import Informer, start_informers
from devplugin.scheduler.state import ClusterState
from devplugin_sim.demo_cluster import pod_spec
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, seed_node
from devplugin_sim.kubelet import AdmissionError, KubeletEmulator

MEM = f"{c.DEFAULT_RESOURCE_DOMAIN}/{c.RESOURCE_MEM}"
GPU_MIB = 15 * 1024
FILL = {"gpu-node-1": [12, 12, 12, 12], "gpu-node-2": [15, 15, 15, 7]}
ASK = 6


def _say(text: str = "", indent: int = 0) -> None:
    print(" " * indent + text, flush=True)


def _until(probe: Callable[[], object], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if probe():
            return True
        time.sleep(0.05)
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SimNode:
    """One simulated GPU node: a fake driver, a kubelet emulator and `devplugin serve` linked to the apiserver."""

    def __init__(self, name: str, root: Path, api: FakeApiserver) -> None:
        self.name = name
        self.root = root / name
        self.api = api
        self.driver = FakeDriver.create(self.root / "driver", seed_node(4, GPU_MIB))
        self.kubelet = KubeletEmulator(self.root / "dp", self.root / "pr" / "kubelet.sock", seed=5)
        self.kubelet.start()
        self.log = self.root / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def serve(self) -> None:
        args = ["--node-name", self.name, "--kubeconfig", self.api.kubeconfig_path, "--health-port",
                str(_free_port()), "--state-dir", str(self.root / "state"), "--plugin-dir",
                str(self.kubelet.plugin_dir), "--pod-resources-socket", str(self.kubelet.pod_resources_socket),
                "--shim", "off"]
        env = {**os.environ, **self.driver.env(), "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "devplugin", "serve", *args], env=env,
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        ann = self.api.node(self.name)["metadata"].get("annotations") or {}
        return c.ANN_NODE_GPUS in ann and self.kubelet.allocatable().get(MEM, 0) > 0

    def admit(self, name: str, namespace: str = "default") -> str:
        """Admit the pod as this node's kubelet; the GPU index the container got."""
        got = self.kubelet.admit(pod_spec(self.api.pod(namespace, name))).containers[0]
        return got.envs.get(c.ENV_ALIYUN_MEM_IDX, "?")

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=15)
        self.kubelet.stop()
        self.driver.close()


def default_scheduler_pick(api: FakeApiserver, nodes: list[SimNode], ask: int) -> tuple[str, dict[str, int]]:
    """What kube-scheduler does without the extender: node allocatable minus the requests of its pods (node
    totals only), the node with the most free memory among those where the total fits (LeastAllocated)."""
    from kubernetes import client

    core = client.CoreV1Api(api.client())
    free = {}
    for n in nodes:
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={n.name}").items
        held = sum(int((ct.resources.limits or {}).get(MEM, 0)) for p in pods
                   if p.status.phase not in ("Succeeded", "Failed") for ct in p.spec.containers)
        free[n.name] = n.kubelet.allocatable().get(MEM, 0) - held
    fits = {k: v for k, v in free.items() if v >= ask}
    return max(fits, key=lambda k: fits[k]), free


def run(keep: bool = False) -> int:
    root = Path(tempfile.mkdtemp(prefix="gsdemo-cl-", dir="/tmp"))  # short: unix socket paths
    nodes: list[SimNode] = []
    informers: list[Informer] = []
    try:
        with FakeApiserver() as api:
            for name in FILL:
                api.add_node(name, labels={c.LABEL_MODE: "core_mem", c.LABEL_PLACEMENT: "binpack"})
                nodes.append(SimNode(name, root, api))
            for n in nodes:
                n.serve()
            _say("=== two simulated nodes, 4 x 15 GiB GPUs each, real node daemons ===")
            if not _until(lambda: all(n.ready() for n in nodes), 60):
                return _failed(nodes, "the node daemons did not publish their GPUs in 60 s")
            _say("pods already running (placed by the node daemons, binpack):", 2)
            for n in nodes:
                for i, mem in enumerate(FILL[n.name]):
                    pname = f"{n.name[-1]}-fill-{i}"
                    api.add_pod(name=pname, node_name=n.name, limits={MEM: mem}, phase="Running")
                    n.admit(pname)
                _say(f"{n.name}: " + ", ".join(f"{m} GiB" for m in FILL[n.name]), 4)
            state = ClusterState()
            informers = start_informers(api.client(), state)
            _until(lambda: all((v := state.view(n.name)) is not None and sum(g.mem_used for g in v.gpus)
                               == sum(FILL[n.name]) for n in nodes), 20)
            _say()
            _say(f"=== a pod asks for {ASK} GiB ===")
            pick, free = default_scheduler_pick(api, nodes, ASK)
            _say("the default scheduler sees node totals: "
                 + ", ".join(f"{k[-6:]} {v} GiB free" for k, v in free.items()), 2)
            _say(f"and picks {pick} (the most free memory);", 2)
            api.add_pod(name="train-default", node_name=pick, limits={MEM: ASK})
            try:
                gpu = next(n for n in nodes if n.name == pick).admit("train-default")
                _say(f"the kubelet on {pick} admitted it on GPU {gpu} (unexpected)", 2)
            except AdmissionError as exc:
                _say(f"the kubelet on {pick} fails it (UnexpectedAdmissionError):", 2)
                print(textwrap.fill(str(exc), 80, initial_indent=" " * 6, subsequent_indent=" " * 6), flush=True)
            api.delete_pod("default", "train-default")
            _say()
            _say("with the extender (devplugin scheduler), as kube-scheduler calls it:", 2)
            with warnings.catch_warnings():  # Starlette's note about its test client's transport
                warnings.simplefilter("ignore")
                from starlette.testclient import TestClient

            from devplugin.scheduler.http import Service, build_app

            http = TestClient(build_app(Service(state, KubeCluster(api.client()))))
            created = api.add_pod(name="train", limits={MEM: ASK})
            _until(lambda: state.pod("default", "train"), 10)
            reply = http.post("/scheduler/filter", json={"Pod": created, "NodeNames": [n.name for n in nodes]}).json()
            _say(f"POST /scheduler/filter -> NodeNames {reply['NodeNames']}, FailedNodes:", 4)
            for name, why in reply["FailedNodes"].items():
                _say(f"{name}: {why}", 8)
            chosen = reply["NodeNames"][0]
            bound = http.post("/scheduler/bind", json={"PodName": "train", "PodNamespace": "default",
                                                       "PodUID": created["metadata"]["uid"], "Node": chosen}).json()
            if bound["Error"]:
                return _failed(nodes, f"bind failed: {bound['Error']}")
            ann = api.pod("default", "train")["metadata"]["annotations"]
            scheduled = c.parse_assignment(ann[c.ANN_SCHEDULED])
            gpus = [s.index for s in scheduled.containers["main"]]
            _say(f"POST /scheduler/bind -> bound to {chosen}, {c.ANN_SCHEDULED}: GPU {gpus}", 4)
            gpu = next(n for n in nodes if n.name == chosen).admit("train")
            _say(f"the kubelet on {chosen} admits it; the node daemon puts it on GPU {gpu}", 2)
            _until(lambda: c.ANN_ALLOCATED in (api.pod("default", "train")["metadata"].get("annotations") or {}), 10)
            _until(lambda: sum(g.mem_used for g in state.view(chosen).gpus) == sum(FILL[chosen]) + ASK, 10)
            _say()
            _say("=== devplugin inspect -d ===")
            inspect_main(["-d", "--kubeconfig", api.kubeconfig_path])
            status = 0 if [str(i) for i in gpus] == [gpu] else 1
            for inf in informers:
                inf.stop()
            if keep:
                _say(f"daemon logs: {', '.join(str(n.log) for n in nodes)}")
                _say(json.dumps({"scheduled": ann[c.ANN_SCHEDULED]}))
            return status
    finally:
        for inf in informers:
            inf.stop()
        for n in nodes:
            n.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _failed(nodes: list[SimNode], why: str) -> int:
    _say(why)
    for n in nodes:
        _say(f"--- {n.log} ---")
        _say(n.log.read_text(errors="replace")[-2000:] if n.log.exists() else "(no log)")
    return 1


if __name__ == "__main__":
    sys.exit(run(keep="--keep" in sys.argv))
