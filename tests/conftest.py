"""Shared pytest fixtures."""

# --- fake NVIDIA driver (fakes/nvml, devplugin_sim/fake_driver.py): fixtures in tests/fixtures_driver.py ---
from tests.fixtures_driver import fake_nvml_lib, make_driver, seed_driver  # noqa: F401
# --- end fake NVIDIA driver ---
