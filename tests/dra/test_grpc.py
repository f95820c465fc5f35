"""The plugin's two gRPC services through real unix sockets, called as the kubelet calls them: the plugin watcher's
GetInfo / NotifyRegistrationStatus on the registration socket, and NodePrepareResources / NodeUnprepareResources
on the DRA socket it names; readiness follows the kubelet's verdict and the node label."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from devplugin import contract
from devplugin.api.dra.v1 import api_pb2 as dra_pb2
from devplugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplugin.api.pluginregistration.v1 import api_pb2 as reg_pb2
from devplugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplugin.dra import plugin as plugin_mod
from devplugin.dra.plugin import DraPlugin
from tests.dra.objects import claim, result
from tests.dra.test_prepare import UID1, UID2, Store, make

DRA = {contract.LABEL_ALLOCATION: contract.ALLOCATION_DRA}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start(root: Path, store: Store, labels: dict[str, str] | None = None) -> DraPlugin:
    labels = DRA if labels is None else labels
    return DraPlugin("node-a", make(root, store), None, root / "p", root / "r", labels=lambda: labels).start()


def test_the_plugin_watcher_learns_the_driver_and_its_socket(short_dir: Path) -> None:
    plugin = start(short_dir, Store())
    try:
        with grpc.insecure_channel(f"unix://{short_dir / 'r' / 'gpu.gpushare.io-reg.sock'}") as ch:
            stub = reg_grpc.RegistrationStub(ch)
            info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "gpu.gpushare.io",
                                                             str(short_dir / "p" / "dra.sock"))
            assert list(info.supported_versions) == ["v1.DRAPlugin"]
            assert plugin.ready() == (False, f"not registered with the kubelet yet (its plugin watcher reads "
                                             f"{short_dir / 'r'})")
            stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
            assert plugin.ready() == (True, "ok")
    finally:
        plugin.stop()
    assert not (short_dir / "r" / "gpu.gpushare.io-reg.sock").exists() and not (short_dir / "p" / "dra.sock").exists()


def test_a_refused_registration_is_logged_and_registered_again(short_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(plugin_mod, "REREGISTER_DELAY_S", 0.05)
    plugin = start(short_dir, Store())
    sock = short_dir / "r" / "gpu.gpushare.io-reg.sock"
    try:
        assert plugin.registration.starts == 1
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            reg_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=False, error="version v1.DRAPlugin not supported"),
                timeout=5)
        ok, why = plugin.ready()
        assert not ok and "version v1.DRAPlugin not supported" in why
        assert "the kubelet refused DRA driver gpu.gpushare.io: version v1.DRAPlugin not supported" in caplog.text
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and plugin.registration.starts < 2:
            time.sleep(0.02)
        assert plugin.registration.starts == 2, "a new socket for the plugin watcher to find"
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            assert reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5).name == "gpu.gpushare.io"
    finally:
        plugin.stop()


def test_prepare_and_unprepare_through_the_dra_socket(short_dir: Path) -> None:
    store = Store()
    store.add(claim(UID1, [result("gpu-0", "2Gi", "30", share_id="s-1")], name="good"))
    store.add(claim(UID2, [result("gpu-5", "2Gi", "30")], name="bad"))
    plugin = start(short_dir, store)
    claims = [dra_pb2.Claim(namespace="team-a", name="good", uid=UID1),
              dra_pb2.Claim(namespace="team-a", name="bad", uid=UID2)]
    try:
        with grpc.insecure_channel(f"unix://{short_dir / 'p' / 'dra.sock'}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            answer = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=5)
            good, bad = answer.claims[UID1], answer.claims[UID2]
            assert not good.error and len(good.devices) == 1
            dev = good.devices[0]
            assert (list(dev.request_names), dev.pool_name, dev.device_name, dev.share_id) == (
                ["gpu"], "node-a", "gpu-0", "s-1")
            assert list(dev.cdi_device_ids) == [f"gpushare.io/gpu={UID1}-0"]
            assert "device 'gpu-5' is not a device of this node" in bad.error and not bad.devices
            gone = stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=5)
            assert {uid: c.error for uid, c in gone.claims.items()} == {UID1: "", UID2: ""}
    finally:
        plugin.stop()
    assert not list((short_dir / "cdi").iterdir())


def test_a_node_without_the_dra_label_is_not_ready_and_says_why(short_dir: Path) -> None:
    plugin = start(short_dir, Store(), labels={})
    try:
        ok, why = plugin.ready()
        assert not ok and "no label gpushare.io/allocation" in why and "gpushare.io/allocation=dra" in why
    finally:
        plugin.stop()


def test_metrics_count_and_time_prepares_and_unprepares_per_result(short_dir: Path) -> None:
    from prometheus_client import generate_latest

    from devplugin.dra.metrics import DraMetrics

    store = Store()
    store.add(claim(UID1, [result("gpu-0", "2Gi", "30")], name="good"))
    plugin = start(short_dir, store)
    metrics = DraMetrics("node-a", plugin.preparer.held)
    plugin.preparer.observe = metrics.observe
    claims = [dra_pb2.Claim(namespace="team-a", name="good", uid=UID1),
              dra_pb2.Claim(namespace="team-a", name="gone", uid=UID2)]
    try:
        with grpc.insecure_channel(f"unix://{short_dir / 'p' / 'dra.sock'}") as ch:
            stub = dra_grpc.DRAPluginStub(ch)
            stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=claims), timeout=5)
            text = generate_latest(metrics.registry).decode()
            assert 'gpushare_dra_claim_operations_total{node="node-a",operation="prepare",result="ok"} 1.0' in text
            assert 'gpushare_dra_claim_operations_total{node="node-a",operation="prepare",result="error"} 1.0' in text
            assert 'gpushare_dra_prepared_claims{node="node-a"} 1.0' in text
            assert 'gpushare_dra_claim_operation_seconds_count{node="node-a",operation="prepare"} 2.0' in text
            stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=claims[:1]), timeout=5)
            text = generate_latest(metrics.registry).decode()
            assert 'gpushare_dra_claim_operations_total{node="node-a",operation="unprepare",result="ok"} 1.0' in text
            assert 'gpushare_dra_prepared_claims{node="node-a"} 0.0' in text
    finally:
        plugin.stop()
