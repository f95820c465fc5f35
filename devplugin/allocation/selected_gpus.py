"""The node daemon's side of a pod's GPU selection (gpu_selection.py): which of this node's GPUs the pod excludes.

Read from the pod the daemon found for the container being admitted (container_candidates.py); a container placed by
node-local pairing, without its pod, is placed without it (docs/guide/modes.md). Pure: no I/O.
"""

from __future__ import annotations

from devplugin.allocation.errors import RequestError
from devplugin.allocation.gpu_selection import SelectionError, exclusions, nothing_allowed, read_selection
from devplugin.allocation.node import Node
from devplugin.allocation.requests import PodRequest

REASON = "gpu_selection"  # the refusals' reason code (metrics)


def excluded_gpus(pod: PodRequest, node: Node) -> dict[str, str]:
    """{uuid: why} for the GPUs of `node` the pod's selection excludes ({} without one); RequestError when the
    selection is malformed or excludes every GPU of the node."""
    try:
        selection = read_selection(pod.annotations)
    except SelectionError as exc:
        raise RequestError(f"pod {pod.key}: {exc}", reason=REASON) from None
    out = exclusions(selection, ((g.uuid, g.name, g.parent_uuid) for g in node.gpus))
    if out and len(out) == len(node.gpus):
        raise RequestError(f"pod {pod.key}: " + nothing_allowed(selection, [(g.index, g.uuid, g.name)
                                                                            for g in node.gpus]), reason=REASON)
    return out
