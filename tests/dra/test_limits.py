"""`devplugin dra-limits`: the figure it would write and what it says of the ConfigMap's, on the recorded slices
(tests/dra/recorded/two-nodes.json: 15 GiB GPUs); inspect's limit line agrees on what is not a quantity.
Against the real apiserver: tests/realk8s/dra/test_limits.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devplugin.dra.limits import as_quantity, largest, status_lines
from devplugin.inspect.dra_layout import render_dra_text
from devplugin.inspect.dra_report import build_dra_report, is_quantity

RECORDED = json.loads((Path(__file__).parent / "recorded" / "two-nodes.json").read_text())
GiB, MiB = 1 << 30, 1 << 20


def test_the_largest_gpu_of_the_slices_as_an_exact_quantity() -> None:
    assert largest(RECORDED["slices"]) == 15 * GiB and as_quantity(15 * GiB) == "15Gi"
    assert as_quantity(16128 * MiB) == "16128Mi" and as_quantity(0) == "0"
    assert largest([]) == 0


@pytest.mark.parametrize(("current", "verdict"), [
    (None, "no such ConfigMap (claims' memory is not checked against a maximum)"),
    ("", "empty (claims' memory is not checked against a maximum)"),
    ("15Gi", "15Gi (current)"),
    ("15360Mi", "15360Mi (current)"),
    ("12Gi", "12Gi (below a GPU: claims it could hold are refused)"),
    ("0", "0 (below a GPU: claims it could hold are refused)"),
    ("80Gi", "80Gi (above every GPU: claims no GPU can hold still pass)"),
    ("15 Gi", "15 Gi (not a quantity: every claim of the gpushare DeviceClasses is refused)"),
    ("15GiB", "15GiB (not a quantity: every claim of the gpushare DeviceClasses is refused)"),
])
def test_what_it_says_of_the_configmap(current: str | None, verdict: str) -> None:
    assert status_lines(15 * GiB, current, "kube-system", "gpushare-dra-limits") == [
        "largest GPU memory the ResourceSlices publish: 15Gi",
        f"ConfigMap kube-system/gpushare-dra-limits largestGpuMemory: {verdict}"]


@pytest.mark.parametrize(("text", "ok"), [("80Gi", True), ("1e3", True), ("0.5", True), ("+1k", True),
                                          ("80 Gi", False), ("80GiB", False), ("", False), ("Gi", False),
                                          ("1Ki1", False)])
def test_a_quantity_is_what_the_apiserver_takes(text: str, ok: bool) -> None:
    assert is_quantity(text) is ok


def test_inspect_says_a_malformed_limit_refuses_every_claim() -> None:
    text = " ".join(render_dra_text(build_dra_report(RECORDED["slices"], [], limit="15 Gi")).split())
    assert "claims' memory limit 15 Gi (kube-system/gpushare-dra-limits); not a quantity: every claim of the " \
           "gpushare DeviceClasses is refused, fix it" in text
