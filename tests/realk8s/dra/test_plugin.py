"""`devplugin dra` as a process on the fake NVIDIA driver, against the real kube-apiserver and kube-scheduler
(1.36, e2e/bin), called over its sockets as the kubelet's plugin watcher and DRA manager call it: it publishes
nothing until the node is labelled for DRA, then the node's slices; it prepares the claim the scheduler allocated
(limits and CDI spec), answers the same after SIGKILL and a restart, unprepares; an XID taints the GPU; leaving
DRA mode deletes the slices once nothing is prepared, and a start out of DRA mode removes an earlier run's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devplugin import contract
from devplugin.api.dra.v1 import api_pb2 as dra_pb2
from devplugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplugin.api.pluginregistration.v1 import api_pb2 as reg_pb2
from devplugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.slices import build_slices
from devplugin.gpu.facts import GpuFacts
from devplugin_sim.fake_driver import FakeDriver, FakeGPU
from tests.dra.objects import GPUS
from tests.dra.realk8s_dra import DraCluster, add_node, dra_cluster, pod_with_claims, share_claim, wait_for
from tests.realk8s.processes import free_port

pytestmark = pytest.mark.realk8s
NODE = "n-plugin"
NS = "default"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cluster() -> Iterator[DraCluster]:
    root = Path(tempfile.mkdtemp(prefix="dra-plug-"))
    with dra_cluster(root) as dc:
        yield dc
    shutil.rmtree(root, ignore_errors=True)


class Plugin:
    """The `devplugin dra` process and the kubelet's side of its sockets."""

    def __init__(self, root: Path, kubeconfig: Path, driver: FakeDriver) -> None:
        self.root = root
        self.port = free_port()
        lib = root / "libgpushare.so"
        lib.write_bytes(b"\x7fELF")  # delivered by path only; no container runs here
        self.cmd = [sys.executable, "-m", "devplugin", "dra", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
                    "--plugins-registry-dir", str(root / "reg"), "--plugin-dir", str(root / "plug"),
                    "--cdi-dir", str(root / "cdi"), "--shim", "on", "--shim-lib", str(lib),
                    "--shim-state-dir", str(root / "shim"), "--state-dir", str(root / "state"),
                    "--health-port", str(self.port), "--resync-seconds", "1", "--recovery-seconds", "3600"]
        self.env = {**os.environ, **driver.env()}
        self.proc: subprocess.Popen | None = None
        self.log = root / "plugin.log"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)

    def readyz(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError:
            return 0, ""

    def register(self) -> None:
        """What the plugin watcher does with the registration socket."""
        sock = self.root / "reg" / "gpu.gpushare.io-reg.sock"
        wait_for(sock.exists, "the registration socket")
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=10, wait_for_ready=True)
            assert info.endpoint == str(self.root / "plug" / "dra.sock")
            stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=10)

    def call(self, method: str, claims: list[dra_pb2.Claim]) -> Any:
        with grpc.insecure_channel(f"unix://{self.root / 'plug' / 'dra.sock'}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            if method == "prepare":
                return stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=20,
                                                 wait_for_ready=True)
            return stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=20,
                                               wait_for_ready=True)


def slices(dc: DraCluster) -> dict[str, dict]:
    data = dc.resource.list_resource_slice(field_selector=f"spec.nodeName={NODE}", _preload_content=False).data
    return {s["metadata"]["name"]: s for s in json.loads(data)["items"]}


def taints(dc: DraCluster, device: str) -> list[dict]:
    devs = slices(dc).get(f"{NODE}-gpushare-devices", {}).get("spec", {}).get("devices", [])
    return next((d.get("taints", []) for d in devs if d["name"] == device), [])


def test_the_plugin_process_serves_a_claim_end_to_end(cluster: DraCluster) -> None:
    dc = cluster
    root = Path(tempfile.mkdtemp(prefix="drap-", dir="/tmp"))
    gpus = [FakeGPU(index=i, uuid=f"GPU-{i:08d}-7777-4000-8000-000000000000", name="NVIDIA A100-SXM4-80GB",
                    memory_mib=15 * 1024, minor=i, pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
                    compute_capability=(8, 0)) for i in range(2)]
    driver = FakeDriver.create(root / "driver", gpus)
    add_node(dc, NODE)
    # slices an earlier run left, published while the node was in DRA mode
    assert SlicePublisher(dc.client, NODE, lambda gen: build_slices(NODE, GPUS, GpuFacts({}, ""), {}, gen)).sync()
    assert len(slices(dc)) == 2
    plugin = Plugin(root, dc.api.kubeconfig, driver)
    plugin.start()
    try:
        code, why = wait_for(lambda: (lambda r: r if "labels are not known" not in r[1] and r[0] else None)(
            plugin.readyz()), "the node's labels read")
        assert code == 503 and "no label gpushare.io/allocation" in why and "gpushare.io/allocation=dra" in why
        wait_for(lambda: slices(dc) == {}, "the earlier run's slices removed on a node out of DRA mode")
        time.sleep(1.5)  # one resync period: still nothing published on an unlabelled node
        assert slices(dc) == {}

        dc.core.patch_node(NODE, {"metadata": {"labels": {contract.LABEL_ALLOCATION: contract.ALLOCATION_DRA}}})
        wait_for(lambda: len(slices(dc)) == 2, "the node's two slices")
        uid = dc.core.read_node(NODE).metadata.uid
        for obj in slices(dc).values():
            (owner,) = obj["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", NODE, uid), "the Node owns its slices"
        devices = slices(dc)[f"{NODE}-gpushare-devices"]["spec"]["devices"]
        assert devices[0]["attributes"]["computeCapability"] == {"version": "8.0.0"}
        assert devices[0]["attributes"]["driverVersion"] == {"version": "550.54.15"}
        plugin.register()
        wait_for(lambda: plugin.readyz() == (200, "ok\n"), "ready once registered")

        dc.resource.create_namespaced_resource_claim(NS, share_claim(NS, "pc", "2Gi", "30"))
        dc.core.create_namespaced_pod(NS, pod_with_claims(NS, "pp", ["pc"], NODE))
        wait_for(lambda: dc.pod(NS, "pp")["spec"].get("nodeName") == NODE, "the pod scheduled")
        claim = dc.claim(NS, "pc")
        ref = dra_pb2.Claim(namespace=NS, name="pc", uid=claim["metadata"]["uid"])
        (result,) = claim["status"]["allocation"]["devices"]["results"]

        first = plugin.call("prepare", [ref]).claims[ref.uid]
        assert not first.error, first.error
        (dev,) = first.devices
        assert (dev.device_name, dev.pool_name, dev.share_id) == ("gpu-0", NODE, result["shareID"])
        spec = json.loads((root / "cdi" / f"gpushare.io-gpu_{ref.uid}.json").read_text())
        env = spec["devices"][0]["containerEdits"]["env"]
        assert f"NVIDIA_VISIBLE_DEVICES={gpus[0].uuid}" in env and "CUDA_DEVICE_MEMORY_LIMIT_0=2048m" in env
        limits = (root / "shim" / "containers" / f"claim-{ref.uid}-0" / "limits").read_text()
        assert contract.parse_limits(limits).devices == (contract.DeviceLimit(gpus[0].uuid, 2 << 30, 30),)

        plugin.stop(signal.SIGKILL)
        dc.resource.delete_namespaced_resource_claim("pc", NS)  # gone from the apiserver: only the checkpoint knows
        plugin.start()
        plugin.register()
        again = plugin.call("prepare", [ref]).claims[ref.uid]
        assert again == first, "a restarted plugin answers the same"

        driver.raise_xid(1, 79)
        (taint,) = wait_for(lambda: taints(dc, "gpu-1"), "the XID as a device taint", timeout=20)
        assert (taint["key"], taint["value"], taint["effect"]) == ("gpu.gpushare.io/unhealthy", "xid-79", "NoSchedule")
        assert taints(dc, "gpu-1-whole") and taints(dc, "gpu-0") == []

        dc.core.patch_node(NODE, {"metadata": {"labels": {contract.LABEL_ALLOCATION: None}}})
        time.sleep(3)
        assert len(slices(dc)) == 2, "a prepared claim keeps the slices"
        assert "does not serve DRA now" in plugin.call("prepare", [dra_pb2.Claim(
            namespace=NS, name="other", uid="99999999-9999-4999-8999-999999999999")]).claims[
            "99999999-9999-4999-8999-999999999999"].error
        gone = plugin.call("unprepare", [ref]).claims[ref.uid]
        assert gone.error == "" and not list((root / "cdi").iterdir())
        wait_for(lambda: slices(dc) == {}, "the slices deleted once nothing is prepared", timeout=20)
    finally:
        plugin.stop()
        driver.close()
        print(plugin.log.read_text()[-3000:])
        shutil.rmtree(root, ignore_errors=True)
