"""The grant of GPUs does not have to travel in an env a pod can write: the daemon's AllocateResponses under each
device-list strategy, through the kubelet emulator over real gRPC."""

from __future__ import annotations

import pytest

from devplugin.deviceplugin.device_list import device_list
from tests.daemon_harness import running
from tests.test_daemon_admission import pod

ROOT = "/var/run/nvidia-container-devices"


def _gpus(result) -> set[str]:  # type: ignore[no-untyped-def]
    return {i.split("::")[0] for ids in result.device_ids.values() for i in ids}


def test_volume_mounts_name_each_granted_gpu_by_a_mount_and_no_uuid_travels_in_the_env() -> None:
    with running(device_list_strategy="volume-mounts") as r:
        assert r.registered_all()
        shared = r.kubelet.admit(pod("shared", mem=2, core=10)).containers[0]
        whole = r.kubelet.admit(pod("whole", count=2)).containers[0]
        for got in (shared, whole):
            assert got.envs["NVIDIA_VISIBLE_DEVICES"] == ROOT
            granted = {m.container_path.removeprefix(ROOT + "/") for m in got.mounts
                       if m.container_path.startswith(ROOT + "/")}
            assert granted == _gpus(got)
            assert all(m.host_path == "/dev/null" and m.read_only for m in got.mounts
                       if m.container_path.startswith(ROOT))
            assert got.cdi_devices == [] and got.conflicts == []
        assert len(_gpus(whole)) == 2


def test_cdi_names_each_granted_gpu_and_the_env_grants_nothing() -> None:
    with running(device_list_strategy="cdi-cri") as r:
        assert r.registered_all()
        got = r.kubelet.admit(pod("shared", mem=2, core=10)).containers[0]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert got.cdi_devices == [f"nvidia.com/gpu={uuid}" for uuid in sorted(_gpus(got))]
        assert got.envs["CUDA_DEVICE_SM_LIMIT"] == "10"  # the limits still reach the shim
        assert not any(m.container_path.startswith(ROOT) for m in got.mounts)


def test_envvar_stays_the_default() -> None:
    with running() as r:
        assert r.registered_all()
        got = r.kubelet.admit(pod("shared", mem=2)).containers[0]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == next(iter(_gpus(got)))
        assert got.cdi_devices == []


def test_an_unknown_strategy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="device-list strategy 'mounts' is not one of envvar, volume-mounts, cdi-cri"):
        device_list("mounts", ("GPU-a",), {})
