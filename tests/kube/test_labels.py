"""Node mode and placement: labels when the apiserver answers, flags when it does not."""

from __future__ import annotations

import threading
import time

import pytest

from devplugin.app.config import Config
from devplugin.app.serve import settings_from
from devplugin.kube.labels import mode_from_labels


def test_labels_win_and_flags_are_the_fallback() -> None:
    cfg = Config(mode="cgpu", placement="spread")
    labelled = settings_from({"ack.node.gpu.schedule": "core_mem", "ack.node.gpu.placement": "binpack"}, cfg)
    assert (labelled.mode, labelled.placement) == ("core_mem", "binpack") and "node label" in labelled.source
    unread = settings_from(None, cfg)  # the apiserver could not be asked
    assert (unread.mode, unread.placement) == ("cgpu", "spread") and "apiserver not reachable" in unread.source
    unlabelled = settings_from({}, cfg)
    assert unlabelled.mode == "cgpu" and "no ack.node.gpu.schedule label" in unlabelled.source


def test_without_labels_or_a_mode_flag_there_is_nothing_to_serve_yet() -> None:
    assert settings_from(None, Config(mode="")) is None  # wait for the apiserver (not ready)
    assert settings_from({}, Config(mode="")).mode == ""  # reachable, but the node says nothing: serve nothing


def test_mode_labels_and_legacy_labels() -> None:
    assert mode_from_labels({"ack.node.gpu.schedule": "core_mem"}) == "core_mem"
    assert mode_from_labels({"gpushare": "true"}) == "share"
    assert mode_from_labels({"cgpu": "true"}) == "cgpu"
    assert mode_from_labels({"kubernetes.io/os": "linux"}) is None


def test_a_dra_node_is_not_served_by_the_device_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """`devplugin serve` on a node labelled gpushare.io/allocation=dra registers no resource and says why."""
    from devplugin.app import serve
    from devplugin.app.node_daemon import KubeLink

    labels = {"ack.node.gpu.schedule": "core_mem", "gpushare.io/allocation": "dra"}
    assert settings_from(labels, Config()).mode == "dra"

    class Watch:
        synced = threading.Event()

        def labels(self) -> dict[str, str]:
            return labels

        def stop(self) -> None:
            pass

    Watch.synced.set()
    monkeypatch.setattr(serve, "connect", lambda *a, **k: KubeLink(node_watch=Watch()))  # type: ignore[arg-type]
    sup = serve.Supervisor(Config(node_name="n1"), [], None)
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "allocation=dra" not in sup.waiting_why:
            time.sleep(0.01)
        ok, why = sup.ready()
        assert not ok and "gpushare.io/allocation=dra" in why and "devplugin dra" in why
        assert sup.current is None, "no device plugin built, nothing registered with the kubelet"
    finally:
        sup.stop_event.set()
        sup.changed.set()
        thread.join(10)
    assert not thread.is_alive()
