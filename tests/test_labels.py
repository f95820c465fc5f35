"""Node mode and placement: labels when the apiserver answers, flags when it does not."""

from __future__ import annotations

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
