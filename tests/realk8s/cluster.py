"""A whole Kubernetes cluster on loopback, from the real components, for the `realk8s` tests.

What runs (each a local process in its own process group, logs under the cluster's directory):
- etcd (`e2e/bin/etcd`, a single member over `embed`);
- kube-apiserver 1.36 with `--authorization-mode=Node,RBAC`, the default admission plugins and NodeRestriction, as
  every production cluster runs it, its own CA, serving and client certificates (openssl),
  service-account signing keys;
- the project's manifests (`deploy/overlays/with-scheduler`) applied with the real kubectl, adapted only where
  loopback forces it (tests/realk8s/manifests.py says what and why);
- `devplugin scheduler` (extender and webhooks) over HTTPS, with a kubeconfig holding a token of ITS
  ServiceAccount (kube-system/devplugin-scheduler), so the shipped RBAC is what it works with;
- kube-scheduler with the shipped KubeSchedulerConfiguration (the extender at its loopback URL), or the same
  configuration without the extender;
- N nodes, each a node agent (`e2e/bin/nodeagent`: the kubelet's device manager and PodResources server, with a
  node identity `system:node:<name>`) and `devplugin serve` on the fake driver (8 x 80 GiB by default) with a
  token of the node daemon's ServiceAccount (kube-system/gpushare-devplugin);
- the node agents run every admitted pod's containers for real (`--runtime runc`: runc, the images of
  tests/realk8s/images.py, each pod in a network namespace of its own on the cluster's bridge
  (tests/realk8s/podnetwork.py), the NVIDIA container toolkit's rules over the node's fake driver), so a test
  asserts what the workload inside saw (`Cluster.exec`, `Cluster.logs`, `Cluster.probe`).

No kube-controller-manager runs. What its controllers would do, the harness does where the tests need it:
- node lifecycle: the node agent removes the `node.kubernetes.io/not-ready` taint that TaintNodesByCondition puts on
  its new Node once it is Ready; the harness removes it (as admin) if it is still there;
- service accounts: each test namespace gets its `default` ServiceAccount (the ServiceAccount admission plugin
  refuses pods without it);
- namespaces: a test's pods are deleted at its end (a namespace's deletion would never finish without the
  namespace controller);
- garbage collection, ReplicaSets, Jobs: not needed; the tests create bare pods.
Pods that end are finalized by the node agents (the kubelet's job).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from devplugin_sim.fake_driver import FakeDriver, FakeGPU, seed_uuid
from devplugin_sim.mig_layouts import served_mib
from tests.realk8s import books, kubeconfigs, manifests, product_image, product_pods
from tests.realk8s.agent import NodeAgent, cleanup_node
from tests.realk8s.apiserver import start_etcd
from tests.realk8s.certs import Pair, Pki, make_pki, service_account_keys
from tests.realk8s.loopback import (
    BIN,
    SHIM_LIB,
    admin_client,
    apiserver,
    component_logs,
    delete_pods,
    healthy,
    https_get,
    missing_binaries,
    namespace_for_test,
    new_namespace,
    ready_and_untainted,
    running_in_tmp,
)
from tests.realk8s.node_runtime import NodeRuntime
from tests.realk8s.pod_access import PodAccess
from tests.realk8s.podnetwork import PodNetwork
from tests.realk8s.processes import ComponentFailed, Proc, free_port

BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "nodeagent", "containershim",
            "serviceproxy")
MEM, CORE, COUNT = "aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"
ANN_ALLOCATED = "gpushare.io/allocated"
# On top of kube-apiserver's default admission plugins (NamespaceLifecycle, ServiceAccount, TaintNodesByCondition,
# Priority, DefaultTolerationSeconds, ResourceQuota, PodSecurity, the webhooks, ...): NodeRestriction, so a node
# agent may change only its own Node's status and its own pods, as a kubelet. The not-ready taint (the node
# lifecycle controller's job: no controller-manager runs) is removed by the harness as the admin.
EXTRA_ADMISSION_PLUGINS: tuple[str, ...] = ("NodeRestriction",)
SERVICE_DNS = ("devplugin-scheduler.kube-system.svc", "devplugin-scheduler.kube-system.svc.cluster.local")


@dataclass(frozen=True)
class Spec:
    """What to bring up."""

    nodes: int = 4
    gpus: int = 8
    gpu_mib: int = 80 * 1024
    mode: str = "core_mem"
    placement: str = "binpack"
    extender: bool = True  # kube-scheduler calls `devplugin scheduler`; False: the plain kube-scheduler
    status_period: str = "10s"  # the node agents' status period (the kubelet's nodeStatusUpdateFrequency)
    runtime: bool = True  # the node agents run the pods' containers (runc); False: pods are Running at admission
    device_list_strategy: str = "auto"  # the node daemons' --device-list-strategy
    # The nodes' NVIDIA container toolkit: True, the secure setting (the device list from volume mounts, a pod's
    # NVIDIA_VISIBLE_DEVICES ignored); False, the toolkit's defaults (the env names the GPUs: only the webhooks'
    # void guards CPU containers). The node agents play it; the daemons read it from its config file.
    toolkit_volume_mounts: bool = True
    crash_backoff: str = "10s"  # the node agents' first crash-loop back-off
    # The node daemons and the extender as the shipped DaemonSet's and Deployment's pods, from the product's own
    # image (product_pods.py), instead of processes on the host.
    product_in_pods: bool = False
    # Per node (by index), the fake driver's GPUs when they are not `gpus` identical A100s of `gpu_mib` (mixed
    # models, MIG, NVLink islands): empty, every node has the default layout; else one tuple per node.
    node_layouts: tuple[tuple[FakeGPU, ...], ...] = ()

    def gpus_of(self, index: int, name: str) -> list[FakeGPU]:
        """The fake driver's GPUs of node `index` (named `name`)."""
        if not self.node_layouts:
            return node_gpus(name, self.gpus, self.gpu_mib)
        if len(self.node_layouts) != self.nodes:
            raise ValueError(f"Spec.node_layouts has {len(self.node_layouts)} layouts for {self.nodes} nodes: "
                             "give one per node")
        return list(self.node_layouts[index])


def node_gpus(node: str, count: int, memory_mib: int) -> list[FakeGPU]:
    """The fake driver's GPUs of one node (UUIDs stable per node name)."""
    return [FakeGPU(index=g, uuid=seed_uuid(g, node), name="NVIDIA A100-SXM4-80GB", memory_mib=memory_mib, minor=g,
                    pci_bus_id=f"00000000:{0x10 + g:02X}:00.0", numa_node=0, sms=108, compute_capability=(8, 0))
            for g in range(count)]


@dataclass
class Node:
    """One node: its node agent (the kubelet's device manager) and its node daemon on the fake driver."""

    name: str
    root: Path
    driver: FakeDriver
    agent: NodeAgent
    daemon: Proc | None  # None: the daemon runs as the DaemonSet's pod (Spec.product_in_pods)
    health_port: int

    @property
    def plugin_dir(self) -> Path:
        return self.agent.plugin_dir

    @property
    def pod_resources_socket(self) -> Path:
        return self.agent.pod_resources_socket

    def start_agent(self) -> None:
        self.agent.start(timeout=60)

    def start_daemon(self) -> None:
        assert self.daemon is not None, "the node's daemon runs as a pod"
        self.daemon.start()

    def wait_daemon_ready(self, timeout: float = 60) -> None:
        """Until the daemon answers /readyz. A port taken between free_port() and the daemon's bind (another
        process of the machine got it first) is replaced by a new one and the daemon started again."""
        assert self.daemon is not None, "the node's daemon runs as a pod"
        for attempt in range(3):
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            try:
                self.daemon.wait_until(lambda u=url: urllib.request.urlopen(u, timeout=2).status == 200, "ready",
                                       timeout)
                return
            except ComponentFailed:
                if attempt == 2 or "Address already in use" not in self.daemon.tail(5):
                    raise
            old, self.health_port = self.health_port, free_port()
            self.daemon.cmd = [str(self.health_port) if a == str(old) else a for a in self.daemon.cmd]
            self.daemon.start()

    def books(self) -> dict[str, Any]:
        """The agent's books: capacity, allocatable, healthy device IDs, and the devices of each pod's containers
        as the kubelet's device manager holds them."""
        return self.agent.books()

    def checkpoint(self) -> dict[str, Any]:
        """The device manager's checkpoint (kubelet_internal_checkpoint): per pod, container and resource, the
        device IDs and the plugin's AllocateResponse as the kubelet stored it."""
        out: dict[str, Any] = json.loads((self.plugin_dir / "kubelet_internal_checkpoint").read_text())
        return out

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.agent.stop()


@dataclass
class Cluster(PodAccess):
    """The components, their identities and the admin's client; `exec`, `container_logs` and `probe` look inside
    its pods."""

    root: Path
    spec: Spec
    pki: Pki | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    api_port: int = 0
    extender_port: int = 0
    scheduler_port: int = 0
    admin: Path = Path()
    admin_cert: Pair | None = None
    sa_keys: Pair | None = None
    api_client: k8s.ApiClient | None = None
    applied: str = ""  # kubectl apply's output for the project's manifests
    etcd_url: str = ""
    server: str = ""  # https://127.0.0.1:PORT (kube-apiserver)
    extender_base: str = ""  # https://127.0.0.1:PORT (devplugin scheduler)
    scheduler_configs: dict[bool, Path] = field(default_factory=dict)
    extender_in_use: bool = True
    took: float = 0.0  # seconds the bring-up took
    objects: list[dict[str, Any]] = field(default_factory=list)  # the project's manifests as applied
    service_args: list[str] = field(default_factory=list)  # the Deployment's `devplugin scheduler` arguments
    runtime: NodeRuntime | None = None  # what the node agents run pods with (images, pod network, toolkit)

    # --- bring-up ------------------------------------------------------------------------------------------------
    def start(self) -> Cluster:
        missing = missing_binaries(BINARIES)
        if missing:
            raise ComponentFailed(f"missing {', '.join(missing)} in {BIN}: run `make e2e-bin` (the first build of "
                                  "Kubernetes takes about 5 minutes on 2 cores)")
        t0 = time.monotonic()
        pki = self.pki = make_pki(self.root / "pki")
        sa = self.sa_keys = service_account_keys(pki.dir)
        self._start_etcd()
        self._start_apiserver(pki, sa)
        self._apply_manifests(pki)
        if self.spec.product_in_pods and not self.spec.runtime:
            raise ValueError("Spec(product_in_pods=True) needs runtime=True: the product's pods must run")
        if not self.spec.product_in_pods:
            self._start_extender(pki)
        self._start_scheduler(pki, self.spec.extender)
        if self.spec.runtime:
            self.runtime = NodeRuntime.create(self.root, volume_mounts=self.spec.toolkit_volume_mounts,
                                              crash_backoff=self.spec.crash_backoff)
            if self.spec.product_in_pods:
                self.runtime.add_image(product_image.REFERENCE, product_image.build(product_image.DEFAULT_CACHE))
            self._start_service_plane(pki, sa)
        self._start_nodes(pki)
        if self.spec.product_in_pods:
            self._start_extender_pod(pki)
        self.took = time.monotonic() - t0
        return self

    def _proc(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, cmd, self.root / "logs" / f"{name}.log", env=env or dict(os.environ))
        self.procs[name] = proc
        return proc

    def _start_etcd(self) -> None:
        etcd, self.etcd_url = start_etcd(BIN / "etcd", self.root / "etcd", self.root / "logs" / "etcd.log")
        self.procs["etcd"] = etcd

    def _start_apiserver(self, pki: Pki, sa: Pair) -> None:
        a = apiserver(pki, sa, self.etcd_url, self.root / "apiserver", EXTRA_ADMISSION_PLUGINS)
        self.api_port, self.server, self.admin, self.admin_cert = a.port, a.server, a.admin, a.admin_cert
        api = self._proc("kube-apiserver", a.cmd)
        api.start()
        api.wait_until(a.ready, "ready (/readyz)", timeout=90)
        self.api_client = self.new_client()

    def new_client(self, pool: int = 32) -> k8s.ApiClient:
        """An admin client of its own (its own connection pool)."""
        return admin_client(self.admin, pool)

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api_client)

    def _apply_manifests(self, pki: Pki) -> None:
        self.extender_port = free_port()
        self.extender_base = f"https://127.0.0.1:{self.extender_port}"
        objects = manifests.adapt(manifests.render(), self.extender_base, pki.ca.cert.read_bytes())
        self.applied = manifests.apply(objects, self.admin)
        for ns in ("default", "kube-system"):  # the service-account controller's and root-ca-cert-publisher's job
            self.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
            self.core.create_namespaced_config_map(ns, {"metadata": {"name": "kube-root-ca.crt"},
                                                        "data": {"ca.crt": pki.ca.cert.read_text()}})
        self.service_args = manifests.scheduler_service_args(objects)
        self.objects = objects

    def _start_extender(self, pki: Pki) -> None:
        serving = pki.issue("devplugin-scheduler", "devplugin-scheduler", server=True, dns=SERVICE_DNS,
                            ips=("127.0.0.1",))
        token = kubeconfigs.service_account_token(self.admin, "kube-system", "devplugin-scheduler")
        kc = kubeconfigs.write(pki.dir / "devplugin-scheduler.kubeconfig", self.server, pki.ca.cert,
                               "devplugin-scheduler", token=token)
        args = manifests.with_flags(self.service_args, {
            "--address": "127.0.0.1", "--port": str(self.extender_port), "--tls-cert-file": str(serving.cert),
            "--tls-private-key-file": str(serving.key), "--client-ca-file": str(pki.ca.cert),
            "--kubeconfig": str(kc), "--log-format": "text"})
        self._proc("devplugin-scheduler", [sys.executable, "-m", "devplugin", *args],
                   env={**os.environ, "POD_NAME": "devplugin-scheduler-0"})
        self.start_extender()

    def restart_apiserver(self, down_s: float = 10.0) -> None:
        """Stop kube-apiserver, leave it down `down_s` seconds, start it again on the same port and wait for it."""
        assert self.pki is not None and self.admin_cert is not None
        api = self.procs["kube-apiserver"]
        api.stop()
        time.sleep(down_s)
        api.start()
        api.wait_until(lambda: https_get(self.server + "/readyz", self.pki.ca.cert, self.admin_cert)[0] == 200,  # type: ignore[union-attr]
                       "ready (/readyz) again", timeout=90)

    def start_extender(self) -> None:
        assert self.pki is not None
        ext = self.procs["devplugin-scheduler"]
        ext.start()
        ext.wait_until(lambda: https_get(self.extender_base + "/readyz", self.pki.ca.cert)[0] == 200,  # type: ignore[union-attr]
                       "ready (/readyz)", timeout=60)

    def _start_scheduler(self, pki: Pki, extender: bool) -> None:
        cert = pki.issue("kube-scheduler", "system:kube-scheduler")
        kc = kubeconfigs.write(pki.dir / "kube-scheduler.kubeconfig", self.server, pki.ca.cert,
                               "kube-scheduler", cert=cert)
        client = pki.issue("kube-scheduler-extender-client", "kube-scheduler")  # for the extender's verbs
        for with_ext in (True, False):
            cfg = manifests.scheduler_config(kc, self.extender_base if with_ext else None, pki.ca.cert,
                                             (client.cert, client.key))
            path = self.root / f"kube-scheduler-{'extender' if with_ext else 'plain'}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            self.scheduler_configs[with_ext] = path
        self.scheduler_port = free_port()
        self._proc("kube-scheduler", [])
        self.use_scheduler(extender)

    def use_scheduler(self, extender: bool) -> None:
        """(Re)start kube-scheduler with the shipped configuration (extender True) or without its extender."""
        sched = self.procs["kube-scheduler"]
        sched.stop()
        sched.cmd = [str(BIN / "kube-scheduler"), f"--config={self.scheduler_configs[extender]}",
                     "--bind-address=127.0.0.1", f"--secure-port={self.scheduler_port}", "--v=2"]
        self.extender_in_use = extender
        sched.start()
        sched.wait_until(lambda: healthy(self.scheduler_port), "healthy", timeout=60)

    def _start_nodes(self, pki: Pki) -> None:
        for i in range(self.spec.nodes):
            name = f"gpu-node-{i}"
            root = self.root / f"n{i}"
            (root / "device-plugins").mkdir(parents=True, exist_ok=True)
            (root / "pod-resources").mkdir(parents=True, exist_ok=True)
            driver = FakeDriver.create(root / "drv", self.spec.gpus_of(i, name))
            cert = pki.issue(f"node-{i}", f"system:node:{name}", orgs=("system:nodes",))
            node_kc = kubeconfigs.write(root / "node.kubeconfig", self.server, pki.ca.cert, f"system:node:{name}",
                                        cert=cert)
            if self.runtime is not None:
                self.runtime.serve_driver_socket(root)
            agent = NodeAgent(root, name, kubeconfig=node_kc, log_path=self.root / "logs" / f"{name}-agent.log",
                              extra_args=["--status-period", self.spec.status_period,
                                          "--control-addr", "127.0.0.1:0",
                                          *(self.runtime.agent_args(i, driver) if self.runtime else [])],
                              binary_dir=BIN)
            daemon_kc = root / "gpushare-devplugin.kubeconfig"  # written once the Node exists (below)
            health = free_port()
            if self.spec.product_in_pods:
                assert self.runtime is not None
                self.runtime.toolkit_config(root)  # the daemon's pod reads it through its hostPath
                self.nodes.append(Node(name, root, driver, agent, None, 0))
                continue
            daemon = self._proc(f"{name}-daemon", [
                sys.executable, "-m", "devplugin", "serve", "--node-name", name, "--kubeconfig", str(daemon_kc),
                "--plugin-dir", str(root / "device-plugins"),
                "--pod-resources-socket", str(root / "pod-resources" / "kubelet.sock"),
                "--mode", self.spec.mode, *self._shim_args(), "--state-dir", str(root / "state"),
                "--device-list-strategy", self.spec.device_list_strategy,
                *(["--toolkit-config", str(self.runtime.toolkit_config(root))] if self.runtime else []),
                "--shim-state-dir", str(root / "shim"), "--health-port", str(health)],
                env={**os.environ, **driver.env()})
            self.nodes.append(Node(name, root, driver, agent, daemon, health))
        for node in self.nodes:
            node.start_agent()
        for node in self.nodes:
            self._wait(lambda n=node: self._node_or_none(n.name) is not None, f"Node {node.name} registered", 30)
            self.label_node(node.name, {"ack.node.gpu.schedule": self.spec.mode,
                                        "ack.node.gpu.placement": self.spec.placement})
            if self.spec.product_in_pods:  # the DaemonSet's pod runs the daemon, from the product's image
                self.core.create_namespaced_pod("kube-system", product_pods.daemon_pod(self.objects, node.name,
                                                                                       node.root))
                continue
            body = manifests.daemonset_pod(self.objects, node.name)
            dpod = self.core.create_namespaced_pod("kube-system", body)
            token = kubeconfigs.service_account_token(self.admin, "kube-system", "gpushare-devplugin",
                                                      (dpod.metadata.name, dpod.metadata.uid))
            kubeconfigs.write(node.root / "gpushare-devplugin.kubeconfig", self.server, pki.ca.cert,
                              "gpushare-devplugin", token=token)
        for node in self.nodes:
            if node.daemon is not None:
                node.start_daemon()
        for node in self.nodes:
            if node.daemon is not None:
                node.wait_daemon_ready()
        for node in self.nodes:
            self.wait_node_serving(node, timeout=45 if node.daemon is not None else 120)

    def _start_extender_pod(self, pki: Pki) -> None:
        """The extender as one replica of the shipped Deployment, from the product's image, on the first node (the
        control-plane node here), its TLS Secret from the harness's PKI; kube-scheduler and the apiserver reach its
        Service on the loopback port the Service proxy exposes it at."""
        first = self.nodes[0].name
        self.label_node(first, {product_pods.CONTROL_PLANE_LABEL: ""})
        serving = pki.issue("devplugin-scheduler", "devplugin-scheduler", server=True, dns=SERVICE_DNS,
                            ips=("127.0.0.1",))
        self.core.create_namespaced_secret("kube-system", product_pods.tls_secret(
            self.objects, serving.cert, serving.key, pki.ca.cert))
        self.core.create_namespaced_pod("kube-system", product_pods.extender_pod(self.objects, first))
        deadline = time.monotonic() + 120
        while True:
            try:
                if https_get(self.extender_base + "/readyz", pki.ca.cert)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                p = self.core.read_namespaced_pod("devplugin-scheduler-0", "kube-system")
                raise ComponentFailed(f"the extender's pod did not become ready within 120 s: {p.status.phase}, "
                                      f"{p.status.container_statuses}\n{self.nodes[0].agent.tail(30)}")
            time.sleep(0.5)

    def _start_service_plane(self, pki: Pki, sa: Pair) -> None:
        """What makes Services work for pods: kube-controller-manager's endpointslice controller (its own
        identity, each controller with its service account's credentials; with the root CA publisher, which puts
        kube-root-ca.crt in every namespace for the pods' service-account volumes), the Service proxy (every ClusterIP
        served in the pod network, default/kubernetes leading to the apiserver), and the node agents allowed to
        read Services and EndpointSlices (the ClusterRole kube-proxy has: the agents write the Services' names into
        their pods' hosts files)."""
        assert self.network is not None
        rbac = k8s.RbacAuthorizationV1Api(self.api_client)
        rbac.create_cluster_role_binding({
            "metadata": {"name": "realk8s:nodes-resolve-services"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}]})
        cert = pki.issue("kube-controller-manager", "system:kube-controller-manager")
        kc = kubeconfigs.write(pki.dir / "kube-controller-manager.kubeconfig", self.server, pki.ca.cert,
                               "kube-controller-manager", cert=cert)
        port = free_port()
        kcm = self._proc("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}", "--use-service-account-credentials=true",
            "--controllers=endpointslice-controller,root-ca-certificate-publisher-controller", "--leader-elect=false",
            f"--service-account-private-key-file={sa.key}", f"--root-ca-file={pki.ca.cert}",
            "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={self.root / 'kcm'}", "--v=1"])
        kcm.start()
        kcm.wait_until(lambda: healthy(port), "healthy", timeout=90)
        expose = ([f"--expose=kube-system/devplugin-scheduler:443=127.0.0.1:{self.extender_port}"]
                  if self.spec.product_in_pods else [])  # the extender's Service, for kube-scheduler and the webhooks
        proxy = self._proc("serviceproxy", [
            str(BIN / "serviceproxy"), f"--kubeconfig={self.admin}", f"--netns={self.network.name}",
            f"--apiserver=127.0.0.1:{self.api_port}", *expose])
        proxy.start().wait_for_line(r"serviceproxy: serving", timeout=60)

    @property
    def network(self) -> PodNetwork | None:
        return self.runtime.network if self.runtime is not None else None

    def netns_prefix(self, i: int) -> str:
        assert self.runtime is not None
        return self.runtime.netns_prefix(i)

    def _shim_args(self) -> list[str]:
        """The node daemon delivers the shim when pods run (their containers preload it); off otherwise."""
        if self.spec.runtime and SHIM_LIB.exists():
            return ["--shim", "on", "--shim-lib", str(SHIM_LIB)]
        return ["--shim", "off"]

    def agent_on(self, node: str) -> NodeAgent:
        return self.node(node).agent

    # --- nodes -------------------------------------------------------------------------------------------------
    def _node_or_none(self, name: str) -> k8s.V1Node | None:
        try:
            return self.core.read_node(name)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def label_node(self, name: str, labels: dict[str, str | None]) -> None:
        self.core.patch_node(name, {"metadata": {"labels": labels}})

    def wait_node_serving(self, node: Node, timeout: float = 45) -> None:
        """Until the Node is Ready, publishes every GPU in allocatable and the daemon's inventory, and carries no
        not-ready taint (removed here as the node lifecycle controller would)."""
        served = served_mib(self.spec.gpus_of(self.nodes.index(node), node.name))  # MIG GPUs as their MIG devices
        want = {MEM: str(sum(mib // 1024 for mib in served)), COUNT: str(len(served))}
        if self.spec.mode == "core_mem":
            want[CORE] = str(len(served) * 100)

        def serving() -> bool:
            n = self.core.read_node(node.name)
            if not ready_and_untainted(self.core, n):
                return False
            alloc = n.status.allocatable or {}
            return (all(alloc.get(k) == v for k, v in want.items())
                    and "gpushare.io/gpus" in (n.metadata.annotations or {}))

        self._wait(serving, f"node {node.name} serving {want}", timeout, node)

    def _wait(self, cond: Callable[[], bool], what: str, timeout: float, node: Node | None = None) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                logs = "" if node is None else f"\n{node.agent.tail(30)}\n{node.daemon.tail(30) if node.daemon else ''}"
                raise ComponentFailed(f"not {what} within {timeout:.0f} s{logs}")
            time.sleep(0.2)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def books(self) -> dict[str, dict[str, Any]]:
        return {n.name: n.books() for n in self.nodes}

    def audit(self, settle: float = 10.0) -> list[str]:
        """What the kubelets' books and checkpoints show against the promises: nothing held twice, no GPU whole
        and sliced at once, no container split, every container's devices and envs equal to its pod's
        gpushare.io/allocated record. Retried for `settle` seconds (records are written just after admission);
        the violations still there then."""
        deadline = time.monotonic() + settle
        while True:
            pods = self.core.list_pod_for_all_namespaces().items
            allocated = {p.metadata.uid: (p.metadata.annotations or {})[ANN_ALLOCATED] for p in pods
                         if ANN_ALLOCATED in (p.metadata.annotations or {})}
            multi = {p.metadata.uid: int((p.metadata.labels or {})["aliyun.com/gpu-count"]) for p in pods
                     if "aliyun.com/gpu-count" in (p.metadata.labels or {})}
            b = self.books()
            checkpoints = {n.name: n.checkpoint() for n in self.nodes}
            bad = (books.double_allocations(b) + books.splits(b, multi) + books.records_agree(b, allocated)
                   + books.envs_agree(b, checkpoints, allocated))
            if not bad or time.monotonic() > deadline:
                return bad
            time.sleep(0.5)

    # --- namespaces --------------------------------------------------------------------------------------------
    def namespace(self, prefix: str = "t") -> str:
        """A fresh namespace with its default ServiceAccount (the service-account controller's job); kube-root-ca.crt,
        which pods' service-account volumes read, comes from the CA publisher."""
        return new_namespace(self.core, prefix)

    def clear_namespace(self, ns: str, timeout: float = 60) -> None:
        """Delete the namespace's pods (at once) and wait until no node agent holds any of them, and nothing of
        them is left on the nodes (containers, mounts, network namespaces, processes)."""
        uids = delete_pods(self.core, ns)
        self._wait(lambda: not any(p["namespace"] == ns for b in self.books().values() for p in b["pods"]),
                   f"pods of {ns} gone from the node agents", timeout)
        deadline = time.monotonic() + 30
        while (left := self.leftovers(uids)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left:
            raise ComponentFailed(f"the pods of {ns} are gone but the nodes still hold: {left}")
        self.core.delete_namespace(ns)

    # --- logs and teardown ---------------------------------------------------------------------------------------
    def logs(self, lines: int = 40) -> str:
        parts = component_logs(self.procs, [(n.name, n.agent) for n in self.nodes], lines)
        if self.spec.product_in_pods:
            parts += self._product_pod_logs(lines)
        return "\n".join(parts)

    def _product_pod_logs(self, lines: int) -> list[str]:
        """The node daemons' and the extender's containers' output, when they run as pods."""
        out = []
        try:
            pods = self.core.list_namespaced_pod("kube-system").items
        except Exception as exc:  # noqa: BLE001 - logs for a failed test: say why there are none
            return [f"===== kube-system pods: not listed: {exc}"]
        for p in pods:
            for c in p.spec.containers:
                try:
                    text = "\n".join(self.container_logs("kube-system", p.metadata.name, c.name).splitlines()[-lines:])
                except Exception as exc:  # noqa: BLE001
                    text = f"(no logs: {exc})"
                out.append(f"===== pod kube-system/{p.metadata.name} container {c.name} =====\n{text}")
        return out

    def stop(self) -> None:
        for name in [n for n in self.procs if n.endswith("-daemon")]:
            self.procs[name].stop()
        for node in self.nodes:
            node.agent.stop()
        if self.runtime is not None:
            for i, node in enumerate(self.nodes):
                cleanup_node(node.root, self.netns_prefix(i))
        for name in ["serviceproxy", "kube-controller-manager", "kube-scheduler", "devplugin-scheduler",
                     "kube-apiserver", "etcd"]:
            if name in self.procs:
                self.procs[name].stop()
        if self.runtime is not None:
            self.runtime.stop_driver_sockets()
            self.runtime.network.delete()


# --- pytest fixtures -----------------------------------------------------------------------------------------
def running(spec: Spec | None = None) -> AbstractContextManager[Cluster]:
    """A started cluster, stopped (every process group) and removed at the end."""
    return running_in_tmp("rk-", lambda root: Cluster(root, spec or Spec()))


@pytest.fixture(scope="session")
def realk8s() -> Iterator[Cluster]:
    """The session's cluster: 4 nodes x 8 GPUs x 80 GiB, kube-scheduler with the extender."""
    with running() as cluster:
        yield cluster


@pytest.fixture
def ns(realk8s: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the session's cluster for one test; its pods are deleted at the end, and the components'
    logs printed when the test failed."""
    yield from namespace_for_test(realk8s, request)


@pytest.fixture
def make_cluster(request: pytest.FixtureRequest) -> Iterator[Callable[..., Cluster]]:
    """Start a cluster of the test's own (`make_cluster(nodes=2, extender=False)`), for tests that break things;
    stopped at the end, its logs printed when the test failed."""
    stack = ExitStack()
    made: list[Cluster] = []
    failed = request.session.testsfailed

    def make(**spec: Any) -> Cluster:
        made.append(stack.enter_context(running(Spec(**spec))))
        return made[-1]

    with stack:
        yield make
        if request.session.testsfailed > failed:
            for cluster in made:
                print(cluster.logs())
