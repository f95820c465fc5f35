"""Shared pytest fixtures."""

from collections.abc import Iterator

import pytest

from devplugin_sim.fake_apiserver import FakeApiserver

# --- end fake NVIDIA driver ---
# --- real Kubernetes on loopback (tests/realk8s/cluster.py): the session's cluster, a namespace per test, and
# clusters of a test's own ---
from tests.realk8s.cluster import make_cluster, ns, realk8s  # noqa: F401
from tests.realk8s.dra_cluster import dra_cluster, dra_ns  # noqa: F401

# --- fake NVIDIA driver (fakes/nvml, devplugin_sim/fake_driver.py): fixtures in tests/support/fixtures_driver.py ---
from tests.support.fixtures_driver import fake_nvml_lib, make_driver, seed_driver  # noqa: F401


@pytest.fixture
def api() -> Iterator[FakeApiserver]:
    """The HTTP fake of the Kubernetes API, for the real `kubernetes` client."""
    with FakeApiserver() as fake:
        yield fake


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the real Kubernetes components run last: the session's cluster (apiserver, scheduler, extender,
    four node agents and daemons) stays up from its first test to the end of the run, and its background work must
    not share the 2 cores with the shim's and the fake driver's timing tests."""
    items.sort(key=lambda item: item.get_closest_marker("realk8s") is not None)
