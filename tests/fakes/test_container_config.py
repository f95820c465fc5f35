"""A container's config of the fake driver (FakeDriver.write_container_config): only the granted GPUs, each at the
node's state slot; the node's state file; the node's driver socket, whose absence fails loudly."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest

from devplugin_sim.driver_socket import DriverSocket
from devplugin_sim.fake_driver import FakeDriver, library_dir
from tests.support.shim_probe import gpus, require_built

XID = pynvml.nvmlEventTypeXidCriticalError
PROBE = [sys.executable, str(Path(__file__).with_name("driver_probe.py"))]


@pytest.fixture
def node(make_driver: Callable[..., FakeDriver]) -> FakeDriver:
    require_built()
    return make_driver(gpus(8))


@pytest.fixture
def sock() -> Iterator[DriverSocket]:
    with tempfile.TemporaryDirectory(prefix="fkdrv", dir="/tmp") as d, DriverSocket(Path(d) / "driver.sock") as s:
        yield s


def use(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(config))


def test_events_reach_a_container_under_its_own_index_and_only_for_its_gpus(
        node: FakeDriver, sock: DriverSocket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = node.write_container_config(tmp_path / "c.conf", [node.gpus[2].uuid, node.gpus[5].uuid],
                                         driver_socket=sock.path)
    use(config, monkeypatch)
    pynvml.nvmlInit()
    try:
        events = pynvml.nvmlEventSetCreate()
        for i in range(2):
            pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(i), XID, events)
        node.raise_xid(3, 31)  # another container's GPU: not seen here
        node.raise_xid(5, 79)
        got = pynvml.nvmlEventSetWait_v2(events, 2000)
        assert (pynvml.nvmlDeviceGetIndex(got.device), got.eventData) == (1, 79)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(events, 100)
        node.set_lost(2, True)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)) == node.gpus[5].uuid
        pynvml.nvmlEventSetFree(events)
    finally:
        pynvml.nvmlShutdown()


def test_utilisation_and_memory_are_read_at_the_nodes_slot(
        node: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node.set_utilization(6, 37, memory_percent=12)
    node.set_memory_used(6, 3 << 30)
    use(node.write_container_config(tmp_path / "c.conf", [node.gpus[6].uuid], driver_socket=None), monkeypatch)
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetCount() == 1 and pynvml.nvmlDeviceGetUUID(h) == node.gpus[6].uuid
        u = pynvml.nvmlDeviceGetUtilizationRates(h)
        assert (u.gpu, u.memory) == (37, 12)
        assert pynvml.nvmlDeviceGetMemoryInfo(h).used == 3 << 30
    finally:
        pynvml.nvmlShutdown()


def test_a_missing_driver_socket_fails_nvml_cuda_and_nvidia_smi_naming_it(
        node: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture) -> None:
    missing = Path(tempfile.gettempdir()) / f"fkdrv-missing-{os.getpid()}.sock"
    config = node.write_container_config(tmp_path / "c.conf", [node.gpus[0].uuid], driver_socket=missing)
    use(config, monkeypatch)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert f"driver socket {missing}: cannot connect: No such file or directory" in err, err
    assert err.count("\n") == 1

    env = {**os.environ, **node.env(), "FAKE_NVML_CONFIG": str(config)}
    cuda = subprocess.run([*PROBE, "cuda"], env=env, capture_output=True, text=True, timeout=60)
    assert '"rc": 100' in cuda.stdout  # CUDA_ERROR_NO_DEVICE
    assert f"fake libcuda: driver socket {missing}: cannot connect" in cuda.stderr
    smi = subprocess.run([str(library_dir() / "nvidia-smi")], env=env, capture_output=True, text=True, timeout=60)
    assert smi.returncode == 9
    assert smi.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_a_socket_that_answers_nonsense_fails_init(
        node: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture) -> None:
    import socket
    import threading

    path = Path(tempfile.mkdtemp(prefix="fkdrv", dir="/tmp")) / "bad.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        conn, _ = server.accept()
        conn.recv(64)
        conn.sendall(b"who knows\n")
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    use(node.write_container_config(tmp_path / "c.conf", [node.gpus[0].uuid], driver_socket=path), monkeypatch)
    try:
        with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
            pynvml.nvmlInit()
        assert "the answer to 'pid' is not a pid: 'who knows'" in capfd.readouterr().err
    finally:
        thread.join(5)
        server.close()


def test_the_state_file_a_container_names_must_exist(
        node: FakeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture) -> None:
    gone = tmp_path / "elsewhere" / "node.state"
    use(node.write_container_config(tmp_path / "c.conf", [node.gpus[0].uuid], driver_socket=None, state_path=gone),
        monkeypatch)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert f"cannot open state file {gone}: No such file or directory" in capfd.readouterr().err
    assert not gone.exists()  # not created: a fresh file would be a node of its own


GPU = "gpu uuid=GPU-1 name=X memory_mib=1024"


@pytest.mark.parametrize(("lines", "line_no", "problem"), [
    ([f"{GPU} slot=16"], 1, "slot must be 0..15 (the GPU's index in the node's state file), got '16'"),
    ([f"{GPU} slot=3", "gpu uuid=GPU-2 name=X memory_mib=1024 pci=00000000:09:00.0 slot=3"], 2,
     "slot 3 is also the slot of the GPU on line 1 (each GPU needs its own)"),
    ([GPU, "gpu uuid=GPU-2 name=X memory_mib=1024 pci=00000000:09:00.0 slot=0"], 2, "slot 0 is also the slot"),
    (["state=relative/node.state"], 1, "state must be an absolute path (the node's state file), got"),
    (["driver_socket=run/driver.sock"], 1, "driver_socket must be an absolute path of at most 107 characters"),
    ([f"driver_socket=/{'x' * 120}"], 1, "driver_socket must be an absolute path of at most 107 characters"),
])
def test_bad_container_settings_fail_init_naming_line_and_problem(
        node: FakeDriver, capfd: pytest.CaptureFixture, lines: list[str], line_no: int, problem: str) -> None:
    node.config_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert f"fake NVML: bad config {node.config_path}:{line_no}: {problem}" in capfd.readouterr().err


def test_a_container_config_names_only_gpus_of_the_node(node: FakeDriver, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GPU-nope are not on this node"):
        node.write_container_config(tmp_path / "c.conf", ["GPU-nope"], driver_socket=None)
    with pytest.raises(ValueError, match="granted twice"):
        node.write_container_config(tmp_path / "c.conf", [node.gpus[1].uuid] * 2, driver_socket=None)
    with pytest.raises(ValueError, match="driver_socket must be an absolute path"):
        node.write_container_config(tmp_path / "c.conf", [node.gpus[1].uuid], driver_socket="x.sock")
