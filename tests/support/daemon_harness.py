"""Run the real daemon in-process (the same `node_daemon.build` path as `devplugin serve`) against the kubelet
emulator and the fake driver, over real unix sockets; optionally linked to the fake apiserver (pod identity,
annotations, Events), through the real `kubernetes` client."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devplugin.app.config import Config
from devplugin.app.health_server import health_server
from devplugin.app.http_serving import BoundedServer
from devplugin.app.metrics import NodeMetrics
from devplugin.app.metrics_server import metrics_server
from devplugin.app.node_daemon import KubeLink, NodeDaemon, build
from devplugin.app.serve import shim_mounts
from devplugin.deviceplugin.daemon import Daemon
from devplugin.gpu.health import HealthWatcher
from devplugin.gpu.inventory import enumerate_gpus
from devplugin.kube.client import load_api_client
from devplugin.kube.pod_cache import PodCache
from devplugin.kube.writer import KubeWriter
from devplugin_sim.fake_apiserver import FakeApiserver
from devplugin_sim.fake_driver import FakeDriver, FakeGPU, load_in_process, seed_node
from devplugin_sim.kubelet import KubeletEmulator
from devplugin_sim.pods import ContainerSpec, PodSpec

DOMAIN = "aliyun.com"
MEM, CORE, COUNT = f"{DOMAIN}/gpu-mem", f"{DOMAIN}/gpu-core.percentage", f"{DOMAIN}/gpu-count"


def short_dir() -> Path:
    """Unix socket paths must stay under 108 bytes: pytest's tmp_path is too long."""
    return Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))


@dataclass
class Running:
    root: Path
    driver: FakeDriver
    kubelet: KubeletEmulator
    daemon: Daemon
    health: HealthWatcher
    plugin_dir: Path
    pod_resources: Path
    daemon_config: Config
    nd: NodeDaemon | None = None
    api: FakeApiserver | None = None
    node_name: str = "gpu-node"
    metrics: NodeMetrics | None = None
    http: BoundedServer | None = None  # /healthz and /readyz, when running(health_port=...) asked for it
    metrics_http: BoundedServer | None = None  # /metrics on loopback, beside them
    whole_gpus: int = 0  # the last N GPUs kept for gpu-count (the node label gpushare.io/whole-gpus)

    @property
    def http_url(self) -> str:
        assert self.http is not None, "start the daemon with running(health_port=0) to serve its endpoints"
        return f"http://127.0.0.1:{self.http.port}"

    @property
    def metrics_url(self) -> str:
        assert self.metrics_http is not None, "start the daemon with running(health_port=0) to serve its endpoints"
        return f"http://127.0.0.1:{self.metrics_http.port}"

    def pod(self, name: str, *, containers: list[dict] | None = None, init: list[dict] | None = None,
            labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            created: str | None = None, **limits: int) -> dict:
        """A pod bound to this node in the fake apiserver: one container "main" with `limits` (mem=, core=,
        count=), or `containers` / `init` as (name, {mem|core|count: n}) dicts."""
        assert self.api is not None
        names = {"mem": MEM, "core": CORE, "count": COUNT}

        def spec(c: dict) -> dict:
            lim = {names[k]: str(v) for k, v in c.get("limits", {}).items()}
            return {"name": c["name"], "image": "busybox", "resources": {"limits": lim, "requests": lim}}

        conts = [spec(c) for c in containers] if containers else [spec({"name": "main", "limits": limits})]
        return self.api.add_pod(name=name, node_name=self.node_name, containers=conts,
                                init_containers=[spec(c) for c in init or []], labels=labels,
                                annotations=annotations, created=created)

    def admit(self, pod: dict) -> object:
        """The kubelet admits this pod (as it would once it sees it bound to the node)."""
        return self.kubelet.admit(pod_spec(pod))

    def wait_cached(self, pod: dict, timeout: float = 5.0) -> bool:
        """The daemon's pod cache has seen the pod."""
        cache = self.nd.link.pods if self.nd else None
        uid = pod["metadata"]["uid"]
        return _until(lambda: cache is not None and cache.get(uid) is not None, timeout)

    def restart_daemon(self) -> None:
        """Stop the daemon and start a new one on the same node, kubelet and cluster link (a daemon restart)."""
        assert self.nd is not None
        self.nd.stop()
        cfg = self.daemon_config
        admission = self.metrics.admission if self.metrics is not None else None
        self.nd = build(cfg, enumerate_gpus(), cfg.mode, cfg.placement, shim_mounts(cfg), self.nd.link, admission,
                        self.whole_gpus)
        self.daemon, self.health = self.nd.daemon, self.nd.health
        self.nd.start()

    def registered_all(self, resources: tuple[str, ...] = (MEM, CORE, COUNT), timeout: float = 10) -> bool:
        return self.kubelet.wait_for(
            lambda k: all(k.allocatable().get(r, 0) > 0 for r in resources), timeout=timeout
        )


def pod_spec(pod: dict) -> PodSpec:
    """The kubelet emulator's view of an apiserver pod (init containers first, as the kubelet admits them)."""
    def limits(c: dict) -> dict[str, int]:
        return {k: int(v) for k, v in ((c.get("resources") or {}).get("limits") or {}).items()}

    meta = pod["metadata"]
    spec = pod["spec"]
    return PodSpec(name=meta["name"], namespace=meta.get("namespace", "default"), uid=meta["uid"],
                   containers=[ContainerSpec(name=c["name"], limits=limits(c)) for c in spec["containers"]],
                   init_containers=[ContainerSpec(name=c["name"], limits=limits(c))
                                    for c in spec.get("initContainers") or []])


def _until(predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())



def config(root: Path, **overrides: object) -> Config:
    cfg = Config(mode="core_mem", plugin_dir=str(root / "dp"), pod_resources_socket=str(root / "pr" / "kubelet.sock"),
                 node_name="", shim="off", recovery_seconds=0.5, shim_state_dir=str(root / "shim"),
                 state_dir=str(root / "state"))
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg.validate()
    return cfg


def link_to(api: FakeApiserver, node_name: str, domain: str = DOMAIN) -> KubeLink:
    """The daemon's cluster link against the fake apiserver (pod cache synced before it returns)."""
    client = load_api_client(str(api.kubeconfig_path))
    pods = PodCache(client, node_name, domain, backoff_start_s=0.05, backoff_max_s=0.5).start()
    writer = KubeWriter(client, node_name, backoff_start_s=0.05, backoff_max_s=0.5).start()
    assert pods.synced.wait(10), "the pod cache did not sync with the fake apiserver"
    return KubeLink(pods=pods, writer=writer)


def close_link(link: KubeLink) -> None:
    for part in (link.pods, link.writer):
        if part is not None:
            part.stop()


@contextmanager
def running(gpus: list[FakeGPU] | None = None, *, seed: int = 1, apiserver: FakeApiserver | None = None,
            node_name: str = "gpu-node", kubelet_pod_resources: Path | None = None, whole_gpus: int = 0,
            **overrides: object) -> Iterator[Running]:
    """The daemon on a fake node with a kubelet emulator; `kubelet_pod_resources` serves the kubelet's PodResources
    somewhere else than where the daemon looks (a kubelet without it). `health_port=` (0: a free one) serves
    /healthz and /readyz (Running.http_url) and, on a free loopback port, /metrics (Running.metrics_url) as
    `devplugin serve` does."""
    serve_http = "health_port" in overrides
    root = short_dir()
    load_in_process()
    driver = FakeDriver.create(root / "drv", gpus or seed_node(4, 15360))
    os.environ["FAKE_NVML_CONFIG"] = str(driver.config_path)
    if apiserver is not None:
        overrides.setdefault("node_name", node_name)
        try:
            apiserver.node(node_name)
        except Exception:  # not there yet
            apiserver.add_node(node_name, labels={"ack.node.gpu.schedule": str(overrides.get("mode", "core_mem"))})
    cfg = config(root, **overrides)
    kubelet = KubeletEmulator(Path(cfg.plugin_dir), kubelet_pod_resources or Path(cfg.pod_resources_socket), seed=seed)
    kubelet.start()
    link = link_to(apiserver, node_name, cfg.resource_domain) if apiserver is not None else KubeLink()
    metrics = NodeMetrics(lambda: link, cfg.node_name)
    nd = build(cfg, enumerate_gpus(), cfg.mode, cfg.placement, shim_mounts(cfg), link, metrics.admission, whole_gpus)
    nd.start()
    r = None
    http = metrics_http = None
    try:
        if serve_http:
            http = health_server(cfg.health_port, lambda: (link.current or nd).ready(),
                                 alive=lambda: (link.current or nd).alive(), host="127.0.0.1").start()
            metrics_http = metrics_server("127.0.0.1", 0, metrics.exposition).start()
        r = Running(root, driver, kubelet, nd.daemon, nd.health, Path(cfg.plugin_dir),
                    Path(kubelet.pod_resources_socket), cfg, nd, apiserver, node_name, metrics, http, metrics_http,
                    whole_gpus)
        yield r
    finally:
        for server in (http, metrics_http):
            if server is not None:
                server.stop()
        (r.nd if r is not None and r.nd is not None else nd).stop()
        close_link(link)
        kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def the_one_event(sup, api, reason: str, timeout: float = 10) -> dict:  # type: ignore[no-untyped-def]
    """The single Event of `reason` the daemon `sup` wrote to the fake apiserver `api`, waiting for it (its writer
    flushed each look); fails when none comes within `timeout` or more than one did."""

    def written() -> list[dict]:
        sup.link.writer.flush(2)
        return [e for e in api.events if e.get("reason") == reason]

    assert _until(lambda: bool(written()), timeout), f"no {reason} Event within {timeout} s"
    [ev] = written()
    return ev
