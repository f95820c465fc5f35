"""The node's mode and placement from its labels (read by the node watch, devplugin/kube/node_watch.py)."""

from __future__ import annotations

from dataclasses import dataclass

from devplugin.contract import LABEL_MODE
from devplugin.contract import LEGACY_MODE_LABELS as LEGACY_LABELS


@dataclass(frozen=True)
class NodeSettings:
    mode: str
    placement: str
    source: str  # where the mode came from, for the log


def mode_from_labels(labels: dict[str, str]) -> str | None:
    """The node mode the labels ask for, or None when they say nothing about GPU sharing."""
    if LABEL_MODE in labels:
        return labels[LABEL_MODE]
    for legacy, mode in LEGACY_LABELS.items():
        if labels.get(legacy) == "true":
            return mode
    return None
