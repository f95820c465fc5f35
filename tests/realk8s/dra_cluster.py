"""A Dynamic Resource Allocation cluster on loopback, from the real components, for the `realk8s` DRA tests.

What runs (each a local process in its own process group, logs under the cluster's directory):
- etcd and kube-apiserver 1.36 (`--authorization-mode=Node,RBAC`, the feature gates as 1.36 ships them: DRA on,
  consumable capacity beta and on), as in tests/realk8s/cluster.py, with the project's DRA objects applied by
  `kubectl apply`: deploy/components/dra (the DeviceClasses, the claim admission policies) and
  deploy/components/dra-node (the plugin's ServiceAccount and RBAC, the policy keeping each node's plugin to its
  own node's ResourceSlices, the DaemonSet, whose pods the harness creates, as its controller would);
- kube-controller-manager with only the controllers DRA needs: `resourceclaim-controller` (creates a pod's
  ResourceClaims from its templates, drops a claim's reservation and allocation when its pods are done) and
  `garbage-collector-controller` (deletes a generated claim once its pod is gone), with its own client
  certificate (`system:kube-controller-manager`) and each controller's own service account
  (`--use-service-account-credentials`), as the shipped RBAC expects;
- kube-scheduler with its default configuration (its DynamicResources plugin allocates claims against the
  ResourceSlices: structured parameters, consumable capacity);
- N nodes, labelled `gpushare.io/allocation=dra`, each a node agent (`e2e/bin/nodeagent`: the kubelet's DRA
  manager and plugin watcher, node identity `system:node:<name>`) with its plugins-registry and CDI directories,
  and a DRA kubelet plugin serving driver gpu.gpushare.io on them: `devplugin dra` on the fake driver (2 x 16 GiB
  GPUs by default) with the shim delivered (build/shim/libgpushare.so) and a token of its ServiceAccount bound to
  the node's DaemonSet pod (so the shipped RBAC and slice policy are what it works with), or with
  `plugin="stub"` e2e/bin/stubdra (Kubernetes' kubeletplugin helper, with the admin's kubeconfig).

The node agents finalize the pods that end (the kubelet's job) and unprepare their claims through the plugin.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devplugin import contract
from devplugin_sim.fake_driver import FakeDriver, FakeGPU
from tests.realk8s import kubeconfigs, loopback, manifests
from tests.realk8s.agent import NodeAgent
from tests.realk8s.apiserver import start_etcd
from tests.realk8s.certs import Pair, Pki, make_pki, service_account_keys
from tests.realk8s.cluster import node_gpus
from tests.realk8s.loopback import BIN, REPO, SHIM_LIB
from tests.realk8s.node_runtime import NodeRuntime
from tests.realk8s.pod_access import PodAccess
from tests.realk8s.processes import ComponentFailed, Proc, free_port

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "nodeagent", "containershim",
            "stubdra")
COMPONENTS = [REPO / "deploy" / "components" / "dra" / f for f in ("deviceclasses.yaml", "claim-policies.yaml")] + [
    REPO / "deploy" / "components" / "dra-node" / f for f in ("rbac.yaml", "slice-policy.yaml", "daemonset.yaml")]
PLUGIN_SA, PLUGIN_NS = "gpushare-dra-plugin", "kube-system"
SHARE_CLASS, WHOLE_CLASS = "gpu.gpushare.io", "whole.gpu.gpushare.io"
DRIVER = contract.DRA_DRIVER
MODE_LABEL, MODE_DRA = contract.LABEL_ALLOCATION, contract.ALLOCATION_DRA  # a node's mode: device plugin or DRA
KCM_CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller",
                   "root-ca-certificate-publisher-controller")  # the last: kube-root-ca.crt for pods' tokens


@dataclass(frozen=True)
class DraSpec:
    """What to bring up: `gpus` GPUs of `gpu_mib` per node, served by `devplugin dra` ("devplugin") or by
    e2e/bin/stubdra ("stub")."""

    nodes: int = 2
    gpus: int = 2
    gpu_mib: int = 16 * 1024
    plugin: str = "devplugin"
    runtime: bool = True  # the node agents run the pods' containers (runc; tests/realk8s/node_runtime.py)
    toolkit_volume_mounts: bool = True  # the nodes' NVIDIA container toolkit: its secure setting
    # Per node (by index), the fake driver's GPUs when they are not `gpus` identical GPUs of `gpu_mib` (MIG, ...)
    node_layouts: tuple[tuple[FakeGPU, ...], ...] = ()


@dataclass
class DraNode:
    """One node: its agent (the kubelet's DRA manager, plugin watcher, device manager) and its DRA plugin."""

    name: str
    root: Path
    agent: NodeAgent
    plugin: Proc
    driver: FakeDriver | None = None  # the fake NVIDIA driver `devplugin dra` reads

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugin"

    def books(self) -> dict[str, Any]:
        """The agent's books; each container lists `cdi` (its CDI device IDs and what they injected) and `envs`."""
        return self.agent.books()

    def claims(self) -> list[dict[str, Any]]:
        """The claims the node's DRA manager holds prepared (from its checkpoint)."""
        out: list[dict[str, Any]] = self.agent._call("GET", "/claims")
        return out

    def registered(self, driver: str = DRIVER) -> bool:
        return bool(self.agent._call("GET", f"/drivers/{driver}")["registered"])


@dataclass
class DraCluster(PodAccess):
    root: Path
    spec: DraSpec
    procs: dict[str, Proc] = field(default_factory=dict)
    nodes: list[DraNode] = field(default_factory=list)
    pki: Pki | None = None
    admin: Path = Path()
    admin_cert: Pair | None = None
    server: str = ""
    api_client: k8s.ApiClient | None = None
    took: float = 0.0
    applied: str = ""  # kubectl apply's output for the project's DRA objects
    scheduler_port: int = 0
    controller_manager_port: int = 0
    _extra_flags: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per component, the restart's flags
    runtime: NodeRuntime | None = None  # what the node agents run pods with (images, pod network, toolkit)

    # --- bring-up ------------------------------------------------------------------------------------------------
    def start(self) -> DraCluster:
        missing = loopback.missing_binaries(BINARIES)
        if missing:
            raise ComponentFailed(f"missing {', '.join(missing)} in {BIN}: run `make e2e-bin` (e2e/README.md has "
                                  "what a first build costs)")
        t0 = time.monotonic()
        pki = self.pki = make_pki(self.root / "pki")
        sa = service_account_keys(pki.dir)
        etcd, etcd_url = start_etcd(BIN / "etcd", self.root / "etcd", self.root / "logs" / "etcd.log")
        self.procs["etcd"] = etcd
        self._start_apiserver(pki, sa, etcd_url)
        for ns in ("default", "kube-system"):  # the service-account controller's job (not run)
            self.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
        self.applied = manifests.apply([d for f in COMPONENTS for d in yaml.safe_load_all(f.read_text()) if d],
                                       self.admin)
        self._start_controller_manager(pki, sa)
        self._start_scheduler(pki)
        if self.spec.runtime:
            self.runtime = NodeRuntime.create(self.root, volume_mounts=self.spec.toolkit_volume_mounts)
        self._start_nodes(pki)
        self.took = time.monotonic() - t0
        return self

    def _proc(self, name: str, cmd: list[str]) -> Proc:
        proc = Proc(name, cmd, self.root / "logs" / f"{name}.log")
        self.procs[name] = proc
        return proc

    def _start_apiserver(self, pki: Pki, sa: Pair, etcd_url: str) -> None:
        a = loopback.apiserver(pki, sa, etcd_url, self.root / "apiserver", ("NodeRestriction",))
        self.server, self.admin, self.admin_cert = a.server, a.admin, a.admin_cert
        api = self._proc("kube-apiserver", a.cmd)
        api.start()
        api.wait_until(a.ready, "ready (/readyz)", timeout=90)
        self.api_client = loopback.admin_client(self.admin)

    def _start_controller_manager(self, pki: Pki, sa: Pair) -> None:
        cert = pki.issue("kube-controller-manager", "system:kube-controller-manager")
        kc = kubeconfigs.write(pki.dir / "kube-controller-manager.kubeconfig", self.server, pki.ca.cert,
                               "kube-controller-manager", cert=cert)
        port = self.controller_manager_port = free_port()
        kcm = self._proc("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--use-service-account-credentials=true",
            f"--controllers={','.join(KCM_CONTROLLERS)}", "--leader-elect=false",
            f"--service-account-private-key-file={sa.key}", f"--root-ca-file={pki.ca.cert}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={self.root / 'kcm'}", "--v=2"])
        kcm.start()
        kcm.wait_until(lambda: loopback.healthy(port), "healthy", timeout=90)

    def _start_scheduler(self, pki: Pki) -> None:
        cert = pki.issue("kube-scheduler", "system:kube-scheduler")
        kc = kubeconfigs.write(pki.dir / "kube-scheduler.kubeconfig", self.server, pki.ca.cert, "kube-scheduler",
                               cert=cert)
        self.scheduler_port = free_port()
        self._proc("kube-scheduler", [
            str(BIN / "kube-scheduler"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--leader-elect=false", "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}", "--v=2"])
        self.restart_scheduler()

    def restart_scheduler(self, flags: Sequence[str] = ()) -> None:
        """(Re)start kube-scheduler with its base flags plus `flags` (e.g. `--kube-api-qps=500`)."""
        self._restart("kube-scheduler", self.scheduler_port, flags)

    def restart_controller_manager(self, flags: Sequence[str] = ()) -> None:
        """Restart kube-controller-manager with its base flags plus `flags` (e.g. `--kube-api-qps=500`)."""
        self._restart("kube-controller-manager", self.controller_manager_port, flags)

    def _restart(self, name: str, port: int, flags: Sequence[str]) -> None:
        proc = self.procs[name]
        proc.stop()
        proc.cmd = [*(c for c in proc.cmd if c not in self._extra_flags.get(name, ())), *flags]
        self._extra_flags[name] = tuple(flags)
        proc.start()
        proc.wait_until(lambda: loopback.healthy(port), "healthy", timeout=90)

    def _start_nodes(self, pki: Pki) -> None:
        assert self.pki is not None
        for i in range(self.spec.nodes):
            name = f"dra-node-{i}"
            root = self.root / f"n{i}"
            root.mkdir(parents=True)
            cert = pki.issue(f"node-{i}", f"system:node:{name}", orgs=("system:nodes",))
            node_kc = kubeconfigs.write(root / "node.kubeconfig", self.server, pki.ca.cert, f"system:node:{name}",
                                        cert=cert)
            driver = (None if self.spec.plugin == "stub"
                      else FakeDriver.create(root / "drv", list(self.spec.node_layouts[i]) if self.spec.node_layouts
                                             else node_gpus(name, self.spec.gpus, self.spec.gpu_mib)))
            if self.runtime is not None and driver is not None:
                self.runtime.serve_driver_socket(root)
            agent = NodeAgent(root, name, kubeconfig=node_kc, log_path=self.root / "logs" / f"{name}-agent.log",
                              extra_args=["--plugins-registry-dir", str(root / "plugins_registry"),
                                          "--cdi-dir", str(root / "cdi"), "--status-period", "10s",
                                          *(self.runtime.agent_args(i, driver) if self.runtime else [])],
                              binary_dir=BIN)
            plugin_kc = root / "plugin.kubeconfig"  # devplugin dra's: written once the Node exists (below)
            if self.spec.plugin == "stub":
                plugin = self._proc(f"{name}-plugin", [
                    str(BIN / "stubdra"), "--node-name", name, "--kubeconfig", str(self.admin),
                    "--plugins-registry-dir", str(root / "plugins_registry"), "--plugin-dir", str(root / "plugin"),
                    "--cdi-dir", str(root / "cdi"), "--gpus", str(self.spec.gpus),
                    "--gpu-memory", f"{self.spec.gpu_mib}Mi"])
            else:
                assert driver is not None
                plugin = Proc(f"{name}-plugin", [
                    sys.executable, "-m", "devplugin", "dra", "--node-name", name, "--kubeconfig", str(plugin_kc),
                    "--plugins-registry-dir", str(root / "plugins_registry"), "--plugin-dir", str(root / "plugin"),
                    "--cdi-dir", str(root / "cdi"), "--shim", "on", "--shim-lib", str(SHIM_LIB),
                    "--shim-state-dir", str(root / "shim"), "--state-dir", str(root / "state"),
                    "--health-port", "0"], self.root / "logs" / f"{name}-plugin.log",
                    env={**os.environ, **driver.env()})
                self.procs[plugin.name] = plugin
            self.nodes.append(DraNode(name, root, agent, plugin, driver))
        for node in self.nodes:
            node.agent.start(timeout=60)
        for node in self.nodes:
            self._wait(lambda n=node: self._ready_untainted(n.name), f"node {node.name} Ready, untainted", 60)
            self.core.patch_node(node.name, {"metadata": {"labels": {MODE_LABEL: MODE_DRA}}})
            if self.spec.plugin != "stub":
                self._plugin_token(node)
            node.plugin.start()
        for node in self.nodes:
            self.wait_plugin(node)

    def _plugin_token(self, node: DraNode) -> None:
        """The DaemonSet's pod on the node, as its controller would create it, and a token of the plugin's
        ServiceAccount bound to that pod (the token then names the node: the slice policy checks it)."""
        assert self.pki is not None
        ds = next(d for f in COMPONENTS for d in yaml.safe_load_all(f.read_text())
                  if d and d["kind"] == "DaemonSet" and d["metadata"]["name"] == PLUGIN_SA)
        spec = {**ds["spec"]["template"]["spec"], "nodeName": node.name}
        spec.pop("nodeSelector")  # the controller chose the node (nodeName); the agent may not see the label yet
        body = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
                "metadata": {**ds["spec"]["template"].get("metadata", {}), "name": f"{PLUGIN_SA}-{node.name}"}}
        pod = self.core.create_namespaced_pod(PLUGIN_NS, body)
        token = kubeconfigs.service_account_token(self.admin, PLUGIN_NS, PLUGIN_SA,
                                                  (pod.metadata.name, pod.metadata.uid))
        kubeconfigs.write(node.root / "plugin.kubeconfig", self.server, self.pki.ca.cert, PLUGIN_SA, token=token)

    def wait_plugin(self, node: DraNode, timeout: float = 60) -> None:
        """Until the node's DRA manager has the driver registered and the node's ResourceSlice is published. After
        a restart the agent may still show the killed process's registration (its socket file outlives it) until
        the plugin watcher sees the new socket: `devplugin dra` is waited for until the kubelet has told this
        process, the one started last, that it is registered."""
        if self.spec.plugin != "stub":
            since = max(node.plugin.text().rfind("===== start "), 0)
            node.plugin.wait_for_line(r"the kubelet registered DRA driver", timeout, since=since)
        node.plugin.wait_until(lambda: node.registered() and bool(self.slices(node.name)),
                               f"registered with {node.name}'s DRA manager and its ResourceSlice published",
                               timeout)

    # --- helpers -------------------------------------------------------------------------------------------------
    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api_client)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        """resource.k8s.io/v1 objects (DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice)."""
        return k8s.CustomObjectsApi(self.api_client)

    def resource(self, plural: str, namespace: str | None = None, name: str | None = None) -> Any:
        """GET resource.k8s.io/v1 objects: one by name, or the list's items (namespaced or cluster-wide)."""
        c = self.custom
        if name is not None:
            if namespace is None:
                return c.get_cluster_custom_object("resource.k8s.io", "v1", plural, name)
            return c.get_namespaced_custom_object("resource.k8s.io", "v1", namespace, plural, name)
        if namespace is None:
            return c.list_cluster_custom_object("resource.k8s.io", "v1", plural)["items"]
        return c.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, plural)["items"]

    def create_resource(self, plural: str, body: dict[str, Any], namespace: str | None = None) -> Any:
        c = self.custom
        if namespace is None:
            return c.create_cluster_custom_object("resource.k8s.io", "v1", plural, body)
        return c.create_namespaced_custom_object("resource.k8s.io", "v1", namespace, plural, body)

    def slices(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.resource("resourceslices")
                if s["spec"].get("nodeName") == node and s["spec"]["driver"] == DRIVER]

    def agent_on(self, node: str) -> NodeAgent:
        return next(n.agent for n in self.nodes if n.name == node)

    def _ready_untainted(self, name: str) -> bool:
        try:
            n = self.core.read_node(name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return loopback.ready_and_untainted(self.core, n)  # no node lifecycle controller among those run here

    def _wait(self, cond: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise ComponentFailed(f"not {what} within {timeout:.0f} s\n{self.logs(20)}")
            time.sleep(0.2)

    def wait(self, cond: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        """Poll `cond` until it returns something true (returned); fail with the components' logs otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            got = cond()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} within {timeout:.0f} s\n{self.logs(30)}")
            time.sleep(0.2)

    def node(self, name: str) -> DraNode:
        return next(n for n in self.nodes if n.name == name)

    def namespace(self, prefix: str = "dra") -> str:
        """A fresh namespace with its default ServiceAccount (the service-account controller's job)."""
        return loopback.new_namespace(self.core, prefix)

    def clear_namespace(self, ns: str, timeout: float = 60) -> None:
        """Delete the namespace's pods and wait until no node agent holds them nor any claim of the namespace, and
        nothing of them is left on the nodes (containers, mounts, network namespaces, processes)."""
        uids = loopback.delete_pods(self.core, ns)
        self._wait(lambda: not any(p["namespace"] == ns for n in self.nodes for p in n.books()["pods"])
                   and not any(c["namespace"] == ns for n in self.nodes for c in n.claims()),
                   f"pods and claims of {ns} gone from the node agents", timeout)
        self._wait(lambda: not self.leftovers(uids), f"nothing of the pods of {ns} left on the nodes", 30)

    def logs(self, lines: int = 40) -> str:
        return "\n".join(loopback.component_logs(self.procs, [(n.name, n.agent) for n in self.nodes], lines))

    def stop(self) -> None:
        for node in self.nodes:
            node.plugin.stop()
            node.agent.stop()
        if self.runtime is not None:
            self.runtime.cleanup([n.root for n in self.nodes])
        for name in ["kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"]:
            if name in self.procs:
                self.procs[name].stop()


def cdi_specs(node: DraNode) -> list[dict[str, Any]]:
    """The CDI spec files the node's plugin has written, parsed."""
    return [json.loads(p.read_text()) for p in sorted(node.cdi_dir.glob("*.json"))]


# --- pytest fixtures -----------------------------------------------------------------------------------------
def running_dra(spec: DraSpec | None = None) -> AbstractContextManager[DraCluster]:
    """A started DRA cluster, stopped (every process group) and removed at the end."""
    return loopback.running_in_tmp("dk-", lambda root: DraCluster(root, spec or DraSpec()))


@pytest.fixture(scope="session")
def dra_cluster() -> Iterator[DraCluster]:
    """The session's DRA cluster: 2 nodes x 2 GPUs x 16 GiB served by `devplugin dra`, kube-controller-manager,
    kube-scheduler."""
    with running_dra() as cluster:
        yield cluster


@pytest.fixture
def dra_ns(dra_cluster: DraCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the session's DRA cluster for one test; its pods are deleted at the end (and their claims
    unprepared), and the components' logs printed when the test failed."""
    yield from loopback.namespace_for_test(dra_cluster, request, prefix="dra")
