"""A node as a pod with a GPU selection sees it (devplugin/allocation/gpu_selection.py): only the GPUs the pod's
annotations allow, matched against the models and UUIDs the node daemon publishes.

filter, prioritize, preempt and bind place such a pod on the narrowed view, so the extender never chooses a GPU
the pod excludes; a node none of whose GPUs is allowed fails with the reason (unresolvable: freeing room there
would not help). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from devplugin.allocation.gpu_selection import Selection, nothing_allowed
from devplugin.scheduler.fit import NodeView
from devplugin.scheduler.room import gpu_list


@dataclass(frozen=True)
class Narrowed:
    """The view with the excluded GPUs left out, and what to add to a refusal on it ('' when none was left out)."""

    view: NodeView
    note: str = ""


def narrow(view: NodeView, selection: Selection) -> Narrowed | str:
    """The node's allowed GPUs as a view, or why none of them is allowed."""
    if selection.empty or view.problem:
        return Narrowed(view)
    excluded: dict[str, list[int]] = {}  # why -> GPU indexes
    kept = []
    for room in view.gpus:
        why = selection.why_excluded(view.models.get(room.index, ""), room.uuid, view.parents.get(room.index, ""))
        if why:
            excluded.setdefault(why, []).append(room.index)
        else:
            kept.append(room)
    if not excluded:
        return Narrowed(view)
    if not kept:
        return nothing_allowed(selection, [(r.index, r.uuid, view.models.get(r.index, "")) for r in view.gpus])
    notes = "; ".join(f"{gpu_list(indexes)}: {why}" for why, indexes in excluded.items())
    return Narrowed(replace(view, gpus=tuple(kept)), f" (excluded by the pod's GPU selection: {notes})")
