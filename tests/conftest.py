"""Shared pytest fixtures."""

from collections.abc import Iterator

import pytest

from devplugin_sim.fake_apiserver import FakeApiserver

# --- fake NVIDIA driver (fakes/nvml, devplugin_sim/fake_driver.py): fixtures in tests/fixtures_driver.py ---
from tests.fixtures_driver import fake_nvml_lib, make_driver, seed_driver  # noqa: F401

# --- end fake NVIDIA driver ---


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    """The HTTP fake of the Kubernetes API, for the real `kubernetes` client."""
    with FakeApiserver() as fake:
        yield fake
