"""Generated code cannot go stale: the Python stubs match the vendored protos, the shim header the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

from devplugin import contract
from devplugin.api import generate

REPO = Path(__file__).resolve().parents[2]


def test_python_stubs_match_the_vendored_protos(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    assert fresh, "protoc wrote nothing"
    typed = {p.relative_to(tmp_path) for p in fresh if p.suffix == ".pyi"}
    messages = {p.relative_to(tmp_path).with_suffix(".pyi") for p in fresh if p.name == "api_pb2.py"}
    assert messages and typed == messages, "every message module needs its .pyi for mypy: run `make proto`"
    for path in fresh:
        committed = generate.OUT_DIR / path.relative_to(tmp_path)
        assert committed.exists(), f"{committed} is missing: run `make proto`"
        assert committed.read_text() == path.read_text(), f"{committed} is stale: run `make proto`"


def test_vendored_protos_are_the_upstream_ones() -> None:
    dp = (REPO / "proto/deviceplugin/v1beta1/api.proto").read_text()
    assert "package v1beta1;" in dp and "rpc GetPreferredAllocation(PreferredAllocationRequest)" in dp
    pr = (REPO / "proto/podresources/v1/api.proto").read_text()
    assert "rpc GetAllocatableResources(AllocatableResourcesRequest)" in pr
    dra = (REPO / "proto/dra/v1/api.proto").read_text()
    assert "package k8s.io.kubelet.pkg.apis.dra.v1;" in dra and "rpc NodePrepareResources" in dra
    reg = (REPO / "proto/pluginregistration/v1/api.proto").read_text()
    assert "package pluginregistration;" in reg and "rpc NotifyRegistrationStatus" in reg


def test_shim_header_matches_the_contract() -> None:
    header = REPO / "shim" / "gpushare_contract.h"
    if not header.exists():
        pytest.skip("shim/ not present")
    assert header.read_text() == contract.c_header(), "shim/gpushare_contract.h is stale: run `make contract`"


def test_limits_round_trip_and_refusals() -> None:
    limits = contract.Limits(devices=(contract.DeviceLimit("GPU-1", 2 << 30, 30),), core_policy="force")
    assert contract.parse_limits(contract.render_limits(limits)) == limits
    for bad, why in [("version=2\ndevices=0\n", "version"), ("version=1\n", "missing key devices"),
                     ("version=1\ndevices=1\ndevice.0.uuid=G\ndevice.0.memory_limit=x\n", "not a number"),
                     ("garbage\n", "expected key=value"),
                     ("version=1\ndevices=1\ndevice.0.uuid=G\ndevice.0.memory_limit=1\ndevice.0.sm_limit=0\n",
                      "sm_limit 1..100")]:
        with pytest.raises(contract.LimitsFileError, match=why):
            contract.parse_limits(bad)
