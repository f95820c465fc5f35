"""Which GPUs a pod allows itself: the annotations that choose or avoid GPUs by model and by UUID, read once.

Four annotations, each under the project's name or HAMi's (contract.py):

    gpushare.io/use-gpu-model    nvidia.com/use-gputype     the GPU's model matches one of the entries
    gpushare.io/avoid-gpu-model  nvidia.com/nouse-gputype   the GPU's model matches none of them
    gpushare.io/use-gpu-uuid     nvidia.com/use-gpuuuid     the GPU's UUID is one of the entries
    gpushare.io/avoid-gpu-uuid   nvidia.com/nouse-gpuuuid   the GPU's UUID is none of them

The match rule: entries are separated by commas; spaces around an entry are dropped and empty entries skipped. A
model entry matches a GPU whose NVML product name (`model` in the node's gpushare.io/gpus) contains it, ignoring
case: `a100` matches `NVIDIA A100-SXM4-80GB`, `H100 80GB` matches `NVIDIA H100 80GB HBM3`; a MIG device shared as a
GPU of its own has NVML's name for it (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`), so `MIG 1g.5gb` chooses that profile and
`MIG` avoids every MIG device. A UUID entry is a whole GPU UUID as NVML prints it (`GPU-` and 32 hex digits grouped
8-4-4-4-12), compared ignoring case; it names a GPU and, on a GPU in MIG mode, each of its MIG devices. A GPU may be
used when every annotation given allows it.

Refused with a SelectionError that names the annotation and what to change: an annotation with no entry, an entry
longer than NVML's name buffer, one holding a control or invisible character, more than MAX_ENTRIES entries, a
value past MAX_VALUE_CHARS; a UUID entry that is not a GPU UUID (a MIG instance's `MIG-...` included); the same
GPU or model both chosen and avoided; our name and HAMi's for one choice given with different entries.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from devplugin.contract import (
    ANN_AVOID_GPU_MODEL,
    ANN_AVOID_GPU_UUID,
    ANN_HAMI_NOUSE_GPU_TYPE,
    ANN_HAMI_NOUSE_GPU_UUID,
    ANN_HAMI_USE_GPU_TYPE,
    ANN_HAMI_USE_GPU_UUID,
    ANN_USE_GPU_MODEL,
    ANN_USE_GPU_UUID,
)

MAX_VALUE_CHARS = 8192
MAX_ENTRIES = 64
MAX_ENTRY_CHARS = 96  # NVML's buffers for a device's name and UUID (NVML_DEVICE_NAME_V2_BUFFER_SIZE, ..._UUID_V2_...)
LISTED_UUIDS = 8  # UUIDs of one model a refusal lists before it counts the rest
SHOWN = 60  # characters of a tenant's text a message repeats
GPU_UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE | re.ASCII)
EXAMPLE_UUID = "GPU-5f0d3a3e-6c4b-4b7e-9a43-2f1b6c7d8e90"
# (attribute, our annotation, HAMi's, whether its entries are UUIDs)
PAIRS = (
    ("use_models", ANN_USE_GPU_MODEL, ANN_HAMI_USE_GPU_TYPE, False),
    ("avoid_models", ANN_AVOID_GPU_MODEL, ANN_HAMI_NOUSE_GPU_TYPE, False),
    ("use_uuids", ANN_USE_GPU_UUID, ANN_HAMI_USE_GPU_UUID, True),
    ("avoid_uuids", ANN_AVOID_GPU_UUID, ANN_HAMI_NOUSE_GPU_UUID, True),
)
ANNOTATIONS = tuple(name for _, ours, hamis, _ in PAIRS for name in (ours, hamis))


class SelectionError(ValueError):
    """A GPU selection that cannot be honoured as written; the message names the annotation and what to change."""


@dataclass(frozen=True)
class Entries:
    """One annotation's entries: as written (trimmed, repeats dropped) and the name it was read under; `folded`
    the same entries case-folded, `keys` as a set (computed once: filter matches them against every GPU)."""

    annotation: str
    values: tuple[str, ...]
    folded: tuple[str, ...] = field(init=False, repr=False, compare=False)
    keys: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "folded", tuple(v.casefold() for v in self.values))
        object.__setattr__(self, "keys", frozenset(self.folded))

    def text(self) -> str:
        """`name=a,b` as a message shows it."""
        return f"{self.annotation}={_clip(','.join(self.values))}"


@dataclass(frozen=True)
class Selection:
    """What a pod allows: each part None when not given."""

    use_models: Entries | None = None
    avoid_models: Entries | None = None
    use_uuids: Entries | None = None
    avoid_uuids: Entries | None = None
    # the selection as one text, equal for equal selections (what a node's catalog remembers its answer under)
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = (self.use_models, self.avoid_models, self.use_uuids, self.avoid_uuids)
        object.__setattr__(self, "key", repr(tuple((e.annotation, e.values) if e else None for e in parts)))

    @property
    def parts(self) -> tuple[Entries, ...]:
        return tuple(e for e in (self.use_models, self.avoid_models, self.use_uuids, self.avoid_uuids) if e)

    @property
    def empty(self) -> bool:
        return not (self.use_models or self.avoid_models or self.use_uuids or self.avoid_uuids)

    def text(self) -> str:
        """The annotations given, `name=entries; ...`."""
        return "; ".join(e.text() for e in self.parts)

    def why_excluded(self, model: str, uuid: str, parent_uuid: str = "") -> str:
        """'' when a GPU of this model and UUID (a MIG device: and this parent GPU) may be used, else which
        annotation excludes it and why."""
        use, avoid = self.use_models, self.avoid_models
        if use or avoid:
            name = model.casefold()
            if use and not any(v in name for v in use.folded):
                return f"model {_clip(model)!r} is not one {use.annotation} asks for"
            if avoid:
                hit = next((v for v, f in zip(avoid.values, avoid.folded, strict=True) if f in name), None)
                if hit is not None:
                    return f"model {_clip(model)!r} matches {_clip(hit)!r} of {avoid.annotation}"
        use, avoid = self.use_uuids, self.avoid_uuids
        if use or avoid:
            own, parent = uuid.casefold(), parent_uuid.casefold()
            if use and own not in use.keys and (not parent or parent not in use.keys):
                return f"not named in {use.annotation}"
            if avoid and own in avoid.keys:
                return f"named in {avoid.annotation}"
            if avoid and parent and parent in avoid.keys:
                return f"named in {avoid.annotation} (its GPU)"
        return ""


NOTHING = Selection()


def read_selection(annotations: Mapping[str, object]) -> Selection:
    """The pod's GPU selection from its annotations (NOTHING when it has none); SelectionError when malformed or
    contradictory."""
    if not any(name in annotations for name in ANNOTATIONS):
        return NOTHING
    parts: dict[str, Entries | None] = {}
    for attr, ours, hamis, uuids in PAIRS:
        mine, theirs = _entries(annotations, ours, uuids), _entries(annotations, hamis, uuids)
        if mine is not None and theirs is not None and mine.keys != theirs.keys:
            raise SelectionError(f"annotations {mine.text()} and {theirs.text()} disagree: they are two names for one "
                                 "choice; keep one of them, or make both list the same entries")
        parts[attr] = mine or theirs
    selection = Selection(**parts)
    _check_contradictions(selection)
    return selection


def exclusions(selection: Selection, gpus: Iterable[tuple[str, str, str]]) -> dict[str, str]:
    """{uuid: why} for each GPU, given as (uuid, model, parent GPU's UUID or ''), that the selection excludes."""
    if selection.empty:
        return {}
    return {uuid: why for uuid, model, parent in gpus if (why := selection.why_excluded(model, uuid, parent))}


def nothing_allowed(selection: Selection, gpus: Iterable[tuple[int, str, str]]) -> str:
    """Why no GPU of a node, given as (index, uuid, model), may take the pod: the annotations and what the node has."""
    by_model: dict[str, list[tuple[int, str]]] = {}
    for index, uuid, model in sorted(gpus):
        by_model.setdefault(model, []).append((index, uuid))
    has = []
    for model, listed in by_model.items():
        uuids = [u for _, u in listed]
        shown = ", ".join(uuids[:LISTED_UUIDS]) + (f" and {len(uuids) - LISTED_UUIDS} more"
                                                   if len(uuids) > LISTED_UUIDS else "")
        has.append(f"{_indexes(i for i, _ in listed)} {_clip(model) or '(no model published)'!r} ({shown})")
    what = "; ".join(has) if has else "no GPU"
    return (f"the pod's GPU selection ({selection.text()}) excludes every GPU of this node, which has {what}; "
            "change the annotations to allow one of these, or let the pod go to a node that has the GPUs it names")


def _entries(annotations: Mapping[str, object], name: str, uuids: bool) -> Entries | None:
    raw = annotations.get(name)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise SelectionError(f"annotation {name} must be text, not {type(raw).__name__}")
    kind = "GPU UUID" if uuids else "GPU model"
    if len(raw) > MAX_VALUE_CHARS:
        raise SelectionError(f"annotation {name} is {len(raw)} characters long; at most {MAX_VALUE_CHARS} are read "
                             f"(list at most {MAX_ENTRIES} entries)")
    values: list[str] = []
    seen: set[str] = set()
    for text in (part.strip() for part in raw.split(",")):
        if not text:
            continue
        if len(values) >= MAX_ENTRIES:
            raise SelectionError(f"annotation {name} lists more than {MAX_ENTRIES} entries; list at most "
                                 f"{MAX_ENTRIES}")
        if len(text) > MAX_ENTRY_CHARS:
            raise SelectionError(f"annotation {name}: the entry {_clip(text)!r} is {len(text)} characters long; a "
                                 f"{kind} has at most {MAX_ENTRY_CHARS}")
        if not text.isprintable():
            raise SelectionError(f"annotation {name}: the entry {_clip(text)!r} holds a control or invisible "
                                 f"character; write the {kind} in plain text, entries separated by commas")
        if uuids:
            _check_uuid(name, text)
        if text.casefold() not in seen:
            seen.add(text.casefold())
            values.append(text)
    if not values:
        raise SelectionError(f"annotation {name} lists no {kind}; list at least one (comma-separated) or remove "
                             "the annotation")
    return Entries(name, tuple(values))


def _check_uuid(name: str, text: str) -> None:
    if text[:4].upper() == "MIG-":
        raise SelectionError(
            f"annotation {name}: {_clip(text)} is a MIG instance's UUID, not a GPU's; name the GPU it is carved from "
            "(its GPU-... UUID, which `nvidia-smi -L` prints above its MIG devices) to choose or avoid that GPU and "
            "its MIG devices. A MIG instance is chosen by what it is, not by its UUID (which changes whenever the "
            "instance is made again): by its profile with gpushare.io/use-gpu-model (e.g. \"MIG 1g.10gb\"), or in "
            "DRA mode by its device's attributes in the claim (docs/guide/dra.md)")
    if not GPU_UUID.fullmatch(text):
        raise SelectionError(f"annotation {name}: {_clip(text)!r} is not a GPU UUID; write it as NVML and "
                             f"`nvidia-smi -L` print it: GPU- and 32 hex digits grouped 8-4-4-4-12 ({EXAMPLE_UUID})")


def _check_contradictions(selection: Selection) -> None:
    use, avoid = selection.use_uuids, selection.avoid_uuids
    if use and avoid:
        both = next((v for v, f in zip(use.values, use.folded, strict=True) if f in avoid.keys), None)
        if both is not None:
            raise SelectionError(f"{both} is named both in {use.annotation} and in {avoid.annotation}: a GPU cannot "
                                 "be both chosen and avoided; remove it from one of them")
    use, avoid = selection.use_models, selection.avoid_models
    if use and avoid:
        for u, fu in zip(use.values, use.folded, strict=True):
            for a, fa in zip(avoid.values, avoid.folded, strict=True):
                if fa in fu:
                    raise SelectionError(
                        f"{use.annotation} asks for {_clip(u)!r} but {avoid.annotation} avoids {_clip(a)!r}, which "
                        f"every {_clip(u)!r} GPU matches: a model cannot be both chosen and avoided; remove one of "
                        "them")


def _indexes(indexes: Iterable[int]) -> str:
    idx = sorted(indexes)
    return ("GPU " if len(idx) == 1 else "GPUs ") + ",".join(map(str, idx))


def _clip(text: str) -> str:
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"
