"""Read this node's mode and placement labels from the apiserver, falling back to flags when it is unreachable."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import cast

from devplugin.contract import LABEL_MODE, LABEL_PLACEMENT
from devplugin.contract import LEGACY_MODE_LABELS as LEGACY_LABELS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSettings:
    mode: str
    placement: str
    source: str  # where the mode came from, for the log


class ApiserverUnavailable(RuntimeError):
    """The apiserver could not be asked; the message says why."""


def read_node_labels(node_name: str, kubeconfig: str = "", timeout_s: float = 5.0) -> dict[str, str]:
    """The node's labels, through the real kubernetes client."""
    if not node_name:
        raise ApiserverUnavailable("no node name (set NODE_NAME from the downward API: spec.nodeName)")
    from kubernetes import client, config  # imported here: only needed once, at start

    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig)
        else:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        api = client.CoreV1Api()
        node = api.read_node(node_name, _request_timeout=timeout_s)
    except Exception as exc:  # the client raises many types: config, HTTP, socket
        raise ApiserverUnavailable(f"reading node {node_name!r} from the apiserver failed: {exc}") from None
    meta = cast("client.V1ObjectMeta", node.metadata)  # the apiserver always returns a node with its metadata
    return dict(meta.labels or {})


def mode_from_labels(labels: dict[str, str]) -> str | None:
    """The node mode the labels ask for, or None when they say nothing about GPU sharing."""
    if LABEL_MODE in labels:
        return labels[LABEL_MODE]
    for legacy, mode in LEGACY_LABELS.items():
        if labels.get(legacy) == "true":
            return mode
    return None


def resolve(node_name: str, kubeconfig: str, timeout_s: float, mode_flag: str, placement_flag: str) -> NodeSettings:
    """Labels win when the apiserver answers; the flags are the fallback."""
    try:
        labels = read_node_labels(node_name, kubeconfig, timeout_s)
    except ApiserverUnavailable as exc:
        log.warning("%s; using --mode %r and --placement %r", exc, mode_flag, placement_flag,
                    extra={"fields": {"node": node_name}})
        return NodeSettings(mode_flag, placement_flag, "flag --mode (apiserver unavailable)")
    mode = mode_from_labels(labels)
    placement = labels.get(LABEL_PLACEMENT, placement_flag)
    if mode is None:
        return NodeSettings(mode_flag, placement, f"flag --mode (node has no {LABEL_MODE} label)")
    return NodeSettings(mode, placement, f"node label {LABEL_MODE}={mode}")
