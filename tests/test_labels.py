"""Node mode and placement: labels when the apiserver answers, flags when it does not."""

from __future__ import annotations

import json
import time
from pathlib import Path

from devplugin.kube.labels import mode_from_labels, resolve


def test_unreachable_apiserver_falls_back_to_flags(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
        "users": [{"name": "t", "user": {"token": "x"}}],
    }))
    t0 = time.monotonic()
    settings = resolve("gpu-node-1", str(kubeconfig), 2.0, "cgpu", "spread")
    assert (settings.mode, settings.placement) == ("cgpu", "spread")
    assert "apiserver unavailable" in settings.source
    assert time.monotonic() - t0 < 30


def test_no_node_name_falls_back_to_flags() -> None:
    settings = resolve("", "", 1.0, "share", "binpack")
    assert settings.mode == "share" and "apiserver unavailable" in settings.source


def test_mode_labels_and_legacy_labels() -> None:
    assert mode_from_labels({"ack.node.gpu.schedule": "core_mem"}) == "core_mem"
    assert mode_from_labels({"gpushare": "true"}) == "share"
    assert mode_from_labels({"cgpu": "true"}) == "cgpu"
    assert mode_from_labels({"kubernetes.io/os": "linux"}) is None
