"""The node's mode and placement from its labels (read by the node watch, devplugin/kube/node_watch.py)."""

from __future__ import annotations

from dataclasses import dataclass

from devplugin.contract import LABEL_MODE, LABEL_WHOLE_GPUS
from devplugin.contract import LEGACY_MODE_LABELS as LEGACY_LABELS


@dataclass(frozen=True)
class NodeSettings:
    mode: str
    placement: str
    source: str  # where the mode came from, for the log
    whole_gpus: int = 0  # the last N GPUs kept for gpu-count (label gpushare.io/whole-gpus)
    problem: str = ""  # a label that could not be used, and what to write instead


def whole_gpus_from_labels(labels: dict[str, str], gpus: int) -> tuple[int, str]:
    """(N, "") from the label gpushare.io/whole-gpus, or (0, why it cannot be used)."""
    raw = labels.get(LABEL_WHOLE_GPUS)
    if raw is None or raw == "":
        return 0, ""
    if not raw.isdigit() or int(raw) > gpus:
        return 0, (f"node label {LABEL_WHOLE_GPUS}={raw!r} is not a number of GPUs from 0 to {gpus}; no GPU is "
                   "kept for gpu-count")
    return int(raw), ""


def mode_from_labels(labels: dict[str, str]) -> str | None:
    """The node mode the labels ask for, or None when they say nothing about GPU sharing."""
    if LABEL_MODE in labels:
        return labels[LABEL_MODE]
    for legacy, mode in LEGACY_LABELS.items():
        if labels.get(legacy) == "true":
            return mode
    return None
