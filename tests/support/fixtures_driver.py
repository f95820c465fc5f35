"""Fixtures for tests that run the real pynvml over the fake libnvidia-ml.so.1 in this process.

The fake is loaded once per session (pynvml loads NVML once per process); each test gets its own config and
state files, and FAKE_NVML_CONFIG pointing at them, which the fake reads at the next nvmlInit.
"""

from __future__ import annotations

import ctypes
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devplugin_sim.fake_driver import CONFIG_ENV, FakeDriver, FakeGPU, load_in_process, nvml_refcount, seed_node


def _release_nvml() -> int:
    """Shut NVML down until the fake's init count is 0; return how many inits were left over."""
    import pynvml

    leaked = nvml_refcount()
    for _ in range(leaked):
        pynvml.nvmlShutdown()
    return leaked


@pytest.fixture(scope="session")
def fake_nvml_lib() -> ctypes.CDLL:
    """The fake libnvidia-ml.so.1, loaded into this process so that pynvml uses it."""
    return load_in_process()


@pytest.fixture
def make_driver(
    fake_nvml_lib: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., FakeDriver]]:
    """make_driver(gpus, **kw) -> FakeDriver whose config the next nvmlInit reads. Checks init/shutdown pairing."""
    if _release_nvml():
        warnings.warn("an earlier test left NVML initialised; shut it down", stacklevel=1)
    drivers: list[FakeDriver] = []

    def make(gpus: list[FakeGPU] | None = None, **kwargs: object) -> FakeDriver:
        driver = FakeDriver.create(tmp_path / f"node{len(drivers)}", seed_node() if gpus is None else gpus,
                                   **kwargs)
        drivers.append(driver)
        monkeypatch.setenv(CONFIG_ENV, str(driver.config_path))
        return driver

    yield make
    leaked = _release_nvml()
    for driver in drivers:
        driver.close()
    assert leaked == 0, f"the test left {leaked} nvmlInit call(s) without nvmlShutdown"


@pytest.fixture
def seed_driver(make_driver: Callable[..., FakeDriver]) -> FakeDriver:
    """The seed's node: 4 x 15 GiB V100s."""
    return make_driver(seed_node())
