"""A node as a pod with a GPU selection sees it (devplugin/allocation/gpu_selection.py): only the GPUs the pod's
annotations allow, matched against the models, UUIDs and MIG parents the node daemon publishes.

filter, prioritize, preempt and bind place such a pod on the narrowed view, so the extender never chooses a GPU
the pod excludes; a node none of whose GPUs is allowed fails with the reason (unresolvable: freeing room there
would not help). What a selection leaves out of a node is remembered on the node's catalog (gpu_catalog.py), so
a node the selection leaves whole is answered as fast as without one. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from devplugin.allocation.gpu_selection import Selection, nothing_allowed
from devplugin.scheduler.fit import NodeView
from devplugin.scheduler.gpu_catalog import GpuCatalog
from devplugin.scheduler.room import gpu_list


@dataclass(frozen=True)
class Narrowed:
    """The view with the excluded GPUs left out, and what to add to a refusal on it ('' when none was left out)."""

    view: NodeView
    note: str = ""


def left_out(catalog: GpuCatalog, selection: Selection) -> Mapping[int, str] | str:
    """{GPU index: why} of the node's GPUs the selection leaves out ({} when none), or why it allows none."""
    def compute() -> Mapping[int, str] | str:
        out = {g.index: why for g in catalog.gpus if (why := selection.why_excluded(g.model, g.uuid, g.parent))}
        if out and len(out) == len(catalog.gpus):
            return nothing_allowed(selection, [(g.index, g.uuid, g.model) for g in catalog.gpus])
        return out

    return catalog.remembered(selection.key, compute)


def narrow(view: NodeView, selection: Selection) -> Narrowed | str:
    """The node's allowed GPUs as a view, or why none of them is allowed."""
    if selection.empty or view.problem:
        return Narrowed(view)
    out = left_out(view.catalog, selection)
    if isinstance(out, str) or not out:
        return out if isinstance(out, str) else Narrowed(view)
    by_why: dict[str, list[int]] = {}
    for index, why in out.items():
        by_why.setdefault(why, []).append(index)
    kept = tuple(r for r in view.gpus if r.index not in out)
    notes = "; ".join(f"{gpu_list(indexes)}: {why}" for why, indexes in by_why.items())
    return Narrowed(replace(view, gpus=kept), f" (excluded by the pod's GPU selection: {notes})")
