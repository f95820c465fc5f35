"""MIG devices in DRA mode: each MIG device published as a device of its own (a share device with `memory` and
`cores` capacity of the MIG device, and a whole one) with its profile, parent UUID and parent index as attributes;
its GPU not published. Against the real kube-apiserver and kube-scheduler (tests/dra/realk8s_dra.py), a claim
selects a profile with CEL and gets that MIG device."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devplugin import contract
from devplugin.dra.publisher import SlicePublisher
from devplugin.dra.slices import build_slices
from devplugin.gpu.device import GPU
from devplugin.gpu.facts import GpuFacts
from devplugin.gpu.mig import MigDevice, MigState, shared_devices
from tests.dra.realk8s_dra import DraCluster, add_node, dra_cluster, pod_with_claims, share_claim, wait_for

GiB = 1 << 30
MiB = 1 << 20
NODE = "mig-node"
PROFILES = (("3g.40gb", 40192), ("1g.10gb", 9728))


def gpus() -> list[GPU]:
    """GPU 0 whole, GPU 1 in MIG mode as 3g.40gb and 1g.10gb (share indices 2 and 3)."""
    whole = [GPU(index=i, uuid=f"GPU-{NODE}-{i}", name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * GiB, minor=i,
                 pci_bus_id=f"00000000:{0x10 + i:02X}:00.0", numa_node=0) for i in range(2)]
    layout = {whole[1].uuid: MigState(True, True, tuple(
        MigDevice(f"MIG-{NODE}-{n}", f"NVIDIA A100-SXM4-80GB MIG {p}", mib * MiB, p, n + 1, 0)
        for n, (p, mib) in enumerate(PROFILES)))}
    return shared_devices(whole, layout, first_mig_index=2)


def test_each_mig_device_is_published_with_its_profile_and_parent() -> None:
    _, devices = build_slices(NODE, gpus(), GpuFacts({}, "550.54.15"), {}, 1)
    devs = {d["name"]: d for d in devices["spec"]["devices"]}
    assert list(devs) == ["gpu-0", "gpu-0-whole", "gpu-2", "gpu-2-whole", "gpu-3", "gpu-3-whole"]
    small = devs["gpu-3"]
    assert small["attributes"]["uuid"] == {"string": f"MIG-{NODE}-1"}
    assert small["attributes"][contract.DRA_ATTR_MIG_PROFILE] == {"string": "1g.10gb"}
    assert small["attributes"][contract.DRA_ATTR_PARENT_UUID] == {"string": f"GPU-{NODE}-1"}
    assert small["attributes"][contract.DRA_ATTR_PARENT_INDEX] == {"int": 1}
    assert small["capacity"]["memory"]["value"] == str(9728 * MiB - (9728 * MiB) % (256 * MiB))
    assert devs["gpu-3-whole"]["attributes"][contract.DRA_ATTR_MIG_PROFILE] == {"string": "1g.10gb"}
    assert contract.DRA_ATTR_MIG_PROFILE not in devs["gpu-0"]["attributes"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[DraCluster]:
    root = Path(tempfile.mkdtemp(prefix="dra-mig-"))
    with dra_cluster(root) as dc:
        add_node(dc, NODE)
        pub = SlicePublisher(dc.client, NODE, lambda gen: build_slices(NODE, gpus(), GpuFacts({}, "550.54.15"), {},
                                                                       gen))
        assert pub.sync(), pub.last_error
        yield dc


def _devices(claim: dict) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


@pytest.mark.realk8s
@pytest.mark.parametrize(("profile", "device"), [("1g.10gb", "gpu-3"), ("3g.40gb", "gpu-2")])
def test_a_claim_selects_a_mig_profile_with_cel(cluster: DraCluster, profile: str, device: str) -> None:
    ns = f"mig-{profile.replace('.', '-')}"
    cluster.core.create_namespace({"metadata": {"name": ns}})
    cluster.core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    claim = share_claim(ns, "small", memory="4Gi", cores="30")
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": (
        f'"migProfile" in device.attributes["{contract.DRA_DRIVER}"] && '
        f'device.attributes["{contract.DRA_DRIVER}"].migProfile == "{profile}"')}}]
    cluster.resource.create_namespaced_resource_claim(ns, claim)
    cluster.core.create_namespaced_pod(ns, pod_with_claims(ns, "main", ["small"]))
    wait_for(lambda: cluster.pod(ns, "main")["spec"].get("nodeName"), f"{ns}: pod bound")
    got = cluster.claim(ns, "small")
    assert _devices(got) == [device]
    assert got["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"]["memory"] == "4Gi"

