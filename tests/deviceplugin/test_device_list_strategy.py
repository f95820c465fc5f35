"""The grant of GPUs does not have to travel in an env a pod can write: the daemon's AllocateResponses under each
device-list strategy, through the kubelet emulator over real gRPC."""

from __future__ import annotations

import pytest

from devplugin.deviceplugin.device_list import device_list
from tests.deviceplugin.test_kubelet_admission import pod
from tests.support.daemon_harness import running

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


def test_auto_is_envvar_where_the_toolkit_takes_the_env_and_says_so(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    """The toolkit's own defaults (no config, or one that does not accept volume mounts): the grant travels in the
    env, and the daemon warns that only the webhooks' void then keeps a pod from every GPU."""
    caplog.set_level("WARNING")
    with running(toolkit_config=str(tmp_path / "absent.toml")) as r:
        assert r.registered_all()
        got = r.kubelet.admit(pod("shared", mem=2)).containers[0]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == next(iter(_gpus(got)))
        assert got.cdi_devices == []
    assert any("device-list strategy envvar" in m and "accept-nvidia-visible-devices-as-volume-mounts = true" in m
               for m in caplog.messages), caplog.messages


SECURE = ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
          "accept-nvidia-visible-devices-as-volume-mounts = true\n")


def test_auto_is_volume_mounts_where_the_toolkit_accepts_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "config.toml"
    cfg.write_text("# the NVIDIA container toolkit's config\n" + SECURE
                   + "[nvidia-container-cli]\nldconfig = \"@/sbin/ldconfig\"\n")
    with running(toolkit_config=str(cfg)) as r:
        assert r.registered_all()
        got = r.kubelet.admit(pod("shared", mem=2, core=10)).containers[0]
        assert got.envs["NVIDIA_VISIBLE_DEVICES"] == ROOT
        assert {m.container_path.removeprefix(ROOT + "/") for m in got.mounts if m.container_path.startswith(ROOT + "/")
                } == _gpus(got)


def test_the_toolkits_settings_decide_auto_and_a_strategy_it_cannot_serve_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from devplugin.deviceplugin import toolkit_config as tk

    cfg = tmp_path / "config.toml"
    cfg.write_text(SECURE)
    secure = tk.read(cfg)
    assert (secure.accept_volume_mounts, secure.accept_envvar_unprivileged, secure.found) == (True, False, True)
    assert tk.choose("auto", secure) == tk.Choice("volume-mounts")
    cfg.write_text("accept-nvidia-visible-devices-as-volume-mounts = true\n")  # the env still honoured
    half = tk.choose("auto", tk.read(cfg))
    assert half.strategy == "volume-mounts" and "still honours NVIDIA_VISIBLE_DEVICES" in half.warnings[0]
    cfg.write_text("accept-nvidia-visible-devices-as-volume-mounts = false\n")
    with pytest.raises(tk.ToolkitConfigError, match="does not accept volume mounts.*use --device-list-strategy auto"):
        tk.choose("volume-mounts", tk.read(cfg))
    cfg.write_text("accept-nvidia-visible-devices-as-volume-mounts = \"yes\"\n")
    with pytest.raises(tk.ToolkitConfigError, match="is not true or false"):
        tk.read(cfg)
    cfg.write_text("accept-nvidia-visible-devices-as-volume-mounts = [\n")
    with pytest.raises(tk.ToolkitConfigError, match="is not TOML"):
        tk.read(cfg)
    # a config the daemon cannot see: the operator's explicit choice stands, with a warning
    unseen = tk.choose("volume-mounts", tk.read(tmp_path / "absent.toml"))
    assert unseen.strategy == "volume-mounts" and any("was not found" in w for w in unseen.warnings)


def test_an_unknown_strategy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="device-list strategy 'mounts' is not one of envvar, volume-mounts, cdi-cri"):
        device_list("mounts", ("GPU-a",), {})
