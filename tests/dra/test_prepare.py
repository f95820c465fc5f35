"""NodePrepareResources / NodeUnprepareResources as functions: the claim's shares become the same limits file and
accounting file `devplugin serve` writes (one directory per claim), and a CDI spec with the env and mounts; both
calls are idempotent, survive a restart through the checkpoint, and refuse per claim with a clear error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devplugin import contract
from devplugin.dra.checkpoint import CheckpointError
from devplugin.dra.claims import ClaimRef
from devplugin.dra.conflicts import ConflictCheck
from devplugin.dra.prepare import Preparer
from devplugin.dra.slices import devices_by_name
from devplugin.isolation.shim_files import ShimPaths
from tests.dra.objects import GPUS, NODE, GiB, claim, result

UID1 = "11111111-1111-4111-8111-111111111111"
UID2 = "22222222-2222-4222-8222-222222222222"


class Store:
    """The apiserver's claims and pods, as the plugin reads them."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], Any] = {}
        self.pods: dict[tuple[str, str], Any] = {}
        self.reads = 0

    def read_claim(self, ns: str, name: str) -> object:
        self.reads += 1
        if (ns, name) not in self.claims:
            raise RuntimeError(f"resourceclaims {name!r} not found")
        return self.claims[(ns, name)]

    def read_pod(self, ns: str, name: str) -> object:
        return self.pods[(ns, name)]

    def add(self, obj: dict[str, Any]) -> ClaimRef:
        meta = obj["metadata"]
        self.claims[(meta["namespace"], meta["name"])] = obj
        return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def make(tmp_path: Path, store: Store, **kw: Any) -> Preparer:
    return Preparer(NODE, devices_by_name(GPUS), store.read_claim, tmp_path / "cdi", tmp_path / "plugin" /
                    "checkpoint.json", shim=ShimPaths(tmp_path / "shim", tmp_path / "libgpushare.so"),
                    conflicts=ConflictCheck(store.read_pod), **kw)


def cdi_spec(tmp_path: Path, uid: str) -> dict[str, Any]:
    return dict(json.loads((tmp_path / "cdi" / f"gpushare.io-gpu_{uid}.json").read_text()))


def test_a_share_is_prepared_as_limits_and_a_cdi_device(tmp_path: Path) -> None:
    store = Store()
    ref = store.add(claim(UID1, [result("gpu-1", "2Gi", "30", share_id="a1b2")]))
    out = make(tmp_path, store).prepare([ref])[UID1]
    assert not out.error
    (dev,) = out.devices
    assert (dev.request_names, dev.pool, dev.device, dev.share_id) == (("gpu",), NODE, "gpu-1", "a1b2")
    assert dev.cdi_device_ids == (f"gpushare.io/gpu={UID1}-0",)
    cdir = tmp_path / "shim" / "containers" / f"claim-{UID1}-0"
    assert contract.parse_limits((cdir / "limits").read_text()) == contract.Limits(
        devices=(contract.DeviceLimit(GPUS[1].uuid, 2 * GiB, 30),))
    assert (cdir / "state" / "usage.cache").stat().st_size == contract.USAGE_FILE_SIZE
    spec = cdi_spec(tmp_path, UID1)
    assert spec["kind"] == "gpushare.io/gpu" and [d["name"] for d in spec["devices"]] == [f"{UID1}-0"]
    edits = spec["devices"][0]["containerEdits"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={GPUS[1].uuid}", "ALIYUN_COM_GPU_MEM_IDX=1",
                            "CUDA_DEVICE_MEMORY_LIMIT_0=2048m", "CUDA_DEVICE_SM_LIMIT=30",
                            f"CUDA_DEVICE_MEMORY_SHARED_CACHE={contract.CONTAINER_SHARED_CACHE}"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert mounts[contract.CONTAINER_LIMITS_PATH]["hostPath"] == str(cdir / "limits")
    assert mounts[contract.CONTAINER_LIMITS_PATH]["options"][0] == "ro"
    assert mounts[contract.CONTAINER_SHARED_CACHE]["hostPath"] == str(cdir / "state" / "usage.cache")
    assert mounts[contract.CONTAINER_SHARED_CACHE]["options"][0] == "rw"
    assert mounts[contract.CONTAINER_LIB_PATH]["hostPath"] == str(tmp_path / "libgpushare.so")
    assert contract.CONTAINER_PRELOAD_PATH in mounts


def test_a_whole_gpu_gets_its_gpu_and_no_shim(tmp_path: Path) -> None:
    store = Store()
    ref = store.add(claim(UID1, [result("gpu-0-whole")]))
    (dev,) = make(tmp_path, store).prepare([ref])[UID1].devices
    assert dev.device == "gpu-0-whole" and dev.share_id == ""
    edits = cdi_spec(tmp_path, UID1)["devices"][0]["containerEdits"]
    assert edits == {"env": [f"NVIDIA_VISIBLE_DEVICES={GPUS[0].uuid}", "ALIYUN_COM_GPU_MEM_IDX=0"],
                     "mounts": [{"hostPath": "/dev/null",
                                 "containerPath": f"/var/run/nvidia-container-devices/{GPUS[0].uuid}",
                                 "options": ["ro", "nosuid", "nodev", "bind"]}]}
    assert not list((tmp_path / "shim").glob(f"containers/claim-{UID1}*"))


def test_the_gpus_are_granted_by_a_mount_the_toolkit_trusts_as_well_as_by_env(tmp_path: Path) -> None:
    """A node whose NVIDIA container toolkit ignores the env of unprivileged containers (its secure setting,
    docs/reference/security.md) reads the grant from /dev/null mounted at /var/run/nvidia-container-devices/<UUID>."""
    store = Store()
    ref = store.add(claim(UID1, [result("gpu-1", memory="2Gi", cores="30")]))
    make(tmp_path, store).prepare([ref])
    mounts = cdi_spec(tmp_path, UID1)["devices"][0]["containerEdits"]["mounts"]
    grants = [m for m in mounts if m["containerPath"].startswith("/var/run/nvidia-container-devices/")]
    assert grants == [{"hostPath": "/dev/null", "containerPath": f"/var/run/nvidia-container-devices/{GPUS[1].uuid}",
                       "options": ["ro", "nosuid", "nodev", "bind"]}]


def test_each_request_is_its_own_cdi_device_and_budget_named_once(tmp_path: Path) -> None:
    """A claim with two requests (the two-GPU example: a container per request): each request gets its GPUs and
    budget; a request of two GPUs (count: 2) names its CDI device on its first result only (the kubelet gives a
    container each CDI ID of the results of the requests it uses)."""
    store = Store()
    ref = store.add(claim(UID1, [result("gpu-0", "8Gi", "50", request="train"),
                                 result("gpu-1", "4Gi", "30", request="infer"),
                                 result("gpu-0", "1Gi", "10", request="pair/small"),
                                 result("gpu-1", "1Gi", "10", request="pair/small")]))
    devices = make(tmp_path, store).prepare([ref])[UID1].devices
    assert [(d.request_names, d.device, d.cdi_device_ids) for d in devices] == [
        (("infer",), "gpu-1", (f"gpushare.io/gpu={UID1}-0",)),
        (("pair",), "gpu-0", (f"gpushare.io/gpu={UID1}-1",)), (("pair",), "gpu-1", ()),
        (("train",), "gpu-0", (f"gpushare.io/gpu={UID1}-2",))]
    limits = {i: contract.parse_limits((tmp_path / "shim" / "containers" / f"claim-{UID1}-{i}" / "limits").read_text())
              for i in range(3)}
    assert limits[0].devices == (contract.DeviceLimit(GPUS[1].uuid, 4 * GiB, 30),)
    assert limits[1].devices == (contract.DeviceLimit(GPUS[0].uuid, GiB, 10),
                                 contract.DeviceLimit(GPUS[1].uuid, GiB, 10))
    assert limits[2].devices == (contract.DeviceLimit(GPUS[0].uuid, 8 * GiB, 50),)
    envs = {d["name"]: d["containerEdits"]["env"] for d in cdi_spec(tmp_path, UID1)["devices"]}
    assert f"NVIDIA_VISIBLE_DEVICES={GPUS[0].uuid},{GPUS[1].uuid}" in envs[f"{UID1}-1"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_1=1024m" in envs[f"{UID1}-1"]


def test_prepare_and_unprepare_are_idempotent_and_survive_a_restart(tmp_path: Path) -> None:
    store = Store()
    ref = store.add(claim(UID1, [result("gpu-0", "1Gi", "10")]))
    first = make(tmp_path, store).prepare([ref])[UID1]
    reads = store.reads
    del store.claims[(ref.namespace, ref.name)]  # the answer must come from the checkpoint now
    again = make(tmp_path, store)  # a new process: what a SIGKILLed plugin restarts as
    assert again.prepare([ref])[UID1] == first and store.reads == reads
    assert again.prepare([ref])[UID1] == first
    assert again.unprepare([ref]) == {UID1: ""}
    assert not list((tmp_path / "cdi").iterdir()) and not list((tmp_path / "shim" / "containers").iterdir())
    assert again.unprepare([ref]) == {UID1: ""}, "unprepare of an unprepared claim is done"
    assert make(tmp_path, store).held() == 0, "the checkpoint forgot it"


def test_unprepare_removes_the_files_even_without_the_checkpoint(tmp_path: Path) -> None:
    store = Store()
    ref = store.add(claim(UID1, [result("gpu-0", "1Gi", "10")]))
    make(tmp_path, store).prepare([ref])
    (tmp_path / "plugin" / "checkpoint.json").unlink()  # killed between writing the files and the checkpoint
    assert make(tmp_path, store).unprepare([ref]) == {UID1: ""}
    assert not list((tmp_path / "cdi").iterdir()) and not list((tmp_path / "shim" / "containers").iterdir())


def test_errors_are_per_claim_and_the_good_claim_is_prepared(tmp_path: Path) -> None:
    store = Store()
    good = store.add(claim(UID1, [result("gpu-0", "1Gi", "10")], name="good"))
    bad = store.add(claim(UID2, [result("gpu-1", "64Gi", "10")], name="bad"))
    missing = ClaimRef("team-a", "gone", "33333333-3333-4333-8333-333333333333")
    out = make(tmp_path, store).prepare([good, bad, missing])
    assert out[UID1].devices and not out[UID1].error
    assert "claim team-a/bad: device gpu-1 (GPU 1" in out[UID2].error and "memory 68719476736" in out[UID2].error
    assert "claim team-a/gone: cannot read it from the apiserver" in out[missing.uid].error
    assert not (tmp_path / "cdi" / f"gpushare.io-gpu_{UID2}.json").exists()


def test_a_node_out_of_dra_mode_prepares_nothing_new_but_keeps_what_it_prepared(tmp_path: Path) -> None:
    store = Store()
    old = store.add(claim(UID1, [result("gpu-0", "1Gi", "10")], name="old"))
    new = store.add(claim(UID2, [result("gpu-0", "1Gi", "10")], name="new"))
    prep = make(tmp_path, store)
    assert prep.prepare([old])[UID1].devices
    prep.serving = lambda: "node has no label gpushare.io/allocation"
    out = prep.prepare([old, new])
    assert out[UID1].devices and "does not serve DRA now (node has no label gpushare.io/allocation)" in out[UID2].error


def test_a_container_with_two_claims_of_this_driver_is_refused(tmp_path: Path) -> None:
    store = Store()
    a = store.add(claim(UID1, [result("gpu-0", "1Gi", "10")], name="a", reserved_for=["p"]))
    b = store.add(claim(UID2, [result("gpu-1", "1Gi", "10")], name="b", reserved_for=["p"]))
    store.pods[("team-a", "p")] = {"spec": {
        "resourceClaims": [{"name": "x", "resourceClaimName": "a"}, {"name": "y", "resourceClaimTemplateName": "t"}],
        "containers": [{"name": "main", "resources": {"claims": [{"name": "x"}, {"name": "y"}]}}]},
        "status": {"resourceClaimStatuses": [{"name": "y", "resourceClaimName": "b"}]}}
    out = make(tmp_path, store).prepare([a, b])
    for uid in (UID1, UID2):
        assert "container main of pod team-a/p would get 2 requests of gpu.gpushare.io (a/gpu, b/gpu)" in out[uid].error
    store.pods[("team-a", "p")]["spec"]["containers"] = [
        {"name": "one", "resources": {"claims": [{"name": "x"}]}},
        {"name": "two", "resources": {"claims": [{"name": "y"}]}}]
    out = make(tmp_path, store).prepare([a, b])
    assert out[UID1].devices and out[UID2].devices, "one claim per container is fine"


def test_a_container_taking_a_claim_of_two_requests_whole_is_refused(tmp_path: Path) -> None:
    store = Store()
    two = store.add(claim(UID1, [result("gpu-0", "1Gi", "10", request="train"),
                                 result("gpu-1", "1Gi", "10", request="infer")], name="two", reserved_for=["p"]))
    store.pods[("team-a", "p")] = {"spec": {
        "resourceClaims": [{"name": "g", "resourceClaimName": "two"}],
        "containers": [{"name": "train", "resources": {"claims": [{"name": "g", "request": "train"}]}},
                       {"name": "sidecar", "resources": {"claims": [{"name": "g"}]}}]}}
    err = make(tmp_path, store).prepare([two])[UID1].error
    assert "container sidecar of pod team-a/p would get 2 requests of gpu.gpushare.io (two/infer, two/train)" in err
    store.pods[("team-a", "p")]["spec"]["containers"][1]["resources"]["claims"][0]["request"] = "infer"
    assert make(tmp_path, store).prepare([two])[UID1].devices, "a container per request is fine"


def test_a_corrupt_checkpoint_stops_the_plugin_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "checkpoint.json").write_text('{"version": 1, "claims": {"x": 5}}')
    with pytest.raises(CheckpointError, match="checkpoint.json is corrupt"):
        make(tmp_path, Store())


def test_a_claim_uid_that_is_not_a_uid_names_no_file(tmp_path: Path) -> None:
    store = Store()
    ref = store.add(claim("../../etc", [result("gpu-0", "1Gi", "10")]))
    out = make(tmp_path, store).prepare([ref])
    assert "claim UID '../../etc' is not" in out["../../etc"].error
    assert make(tmp_path, store).unprepare([ref])["../../etc"].startswith("claim team-a/c1: cannot unprepare")
