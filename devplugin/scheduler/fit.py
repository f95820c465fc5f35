"""Does a pod fit a node, and on which GPUs: one pure function used by filter, prioritize and bind.

Rules (docs/reference/scheduler.md): the node's mode must serve what the pod asks (gpu-core.percentage only on
core_mem nodes; gpu-mem and gpu-count everywhere). On core_mem nodes a memory-only container runs only on compute
nobody reserved (devplugin/allocation/unreserved.py, the node daemon's rule): it goes only to a GPU with at least
5 % of its compute unreserved, and reserves none of it. Each container's memory and compute go together on one
GPU, or on N GPUs (mem/N and core/N on each) for a pod that asks for N-way multi-GPU sharing; gpu-count takes GPUs
with nothing on them.
Unhealthy GPUs and GPUs held whole take nothing. Containers are placed largest first (whole GPUs, then shares
by memory), each on the GPUs the node's placement prefers: binpack the fullest that fits, spread the emptiest; a
container of several GPUs on GPUs of one NVLink island, else of one NUMA node, where the node publishes them
(devplugin/allocation/topology.py), and such a pod scores higher where it is more local (locality_score).

Init containers follow the kubelet's rule for a pod's effective request: max(each regular init container, app
containers + sidecars). A regular init container runs alone (beside the sidecars started before it) and ends
before the app containers start, so it is placed on the node's room as it is before the pod, less those sidecars,
not beside the app containers; one whose amounts equal an app container's is that container's holding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from devplugin.allocation.requests import ContainerRequest, PodRequest, PodRequestError, per_gpu_share
from devplugin.allocation.topology import ANY, NUMA, NVLINK, Where, choose
from devplugin.allocation.unreserved import advice, core_needed
from devplugin.contract import LABEL_ACK_MULTI_GPU, GpuShare
from devplugin.scheduler.gpu_catalog import GpuCatalog
from devplugin.scheduler.room import GpuRoom, gpu_list, mem_text

MODES_WITH_CORE = ("core_mem",)


@dataclass
class NodeView:
    """What fit needs of a node: mode, placement, memory unit, the room of each GPU."""

    name: str
    mode: str
    placement: str
    unit_mib: int
    gpus: tuple[GpuRoom, ...]
    problem: str = ""  # set when the node cannot take GPU pods at all (no inventory, unknown mode)
    catalog: GpuCatalog = field(default_factory=GpuCatalog)  # the GPUs' models and MIG parents, for GPU selections

    @cached_property
    def open_rooms(self) -> tuple[tuple[int, int, int, str], ...]:
        """(mem free, core free, index, uuid) of each GPU that can take a share: healthy, not held whole."""
        return tuple((r.mem_free, r.core_free, r.index, r.uuid) for r in self.gpus if r.healthy and not r.whole)

    @cached_property
    def share_texts(self) -> tuple[str, str, int]:
        """(GPUs considered, what is excluded and why, most memory free on one of them): the parts of a share's
        refusal that depend on the node alone, built once per view rather than once per pod."""
        best = max((t[0] for t in self.open_rooms), default=0)
        return _considered(self.gpus), _excluded(self.gpus), best

    @cached_property
    def mem_totals(self) -> tuple[int, int]:
        """(memory of the healthy GPUs, memory held on them), in gpu-mem units."""
        healthy = [r for r in self.gpus if r.healthy]
        return sum(r.mem_total for r in healthy), sum(r.mem_allocated for r in healthy)


@dataclass(frozen=True)
class Fit:
    """The outcome: shares per container name when it fits, else the reason; `unresolvable` when freeing room
    on the node would not help (mode, inventory, malformed request)."""

    containers: dict[str, tuple[GpuShare, ...]] = field(default_factory=dict)
    reason: str = ""
    unresolvable: bool = False
    transient: frozenset[str] = frozenset()  # regular init containers: placed, but ended before the apps start

    @property
    def ok(self) -> bool:
        return not self.reason


def check_pod(pod: PodRequest) -> str:
    """What is wrong with the pod's GPU asks whatever the node, or ''."""
    for c in pod.gpu_containers:
        if c.core and not c.mem:
            return f"container {c.name!r} asks for gpu-core.percentage without gpu-mem; add a gpu-mem request"
        if c.count and (c.mem or c.core):
            return (f"container {c.name!r} asks for gpu-count together with a share; to split memory over several "
                    f"GPUs label the pod {LABEL_ACK_MULTI_GPU}=N and ask for gpu-mem only")
        if c.mem:
            try:
                per_gpu_share(c, pod.gpus_per_container)
            except PodRequestError as exc:
                return str(exc)
    return ""


@dataclass(frozen=True)
class Item:
    """One GPU container's ask as placed: whole GPUs (`count`), or `mem` and `core` on each of `gpus` GPUs."""

    container: ContainerRequest
    count: int
    mem: int
    core: int
    gpus: int


@dataclass(frozen=True)
class Ask:
    """A pod's GPU asks, prepared once for all nodes: items largest first (whole GPUs, then by memory)."""

    items: tuple[Item, ...]
    problem: str
    needs_core: bool
    reused: tuple[tuple[str, str], ...] = ()  # (init container, app container that gets its devices)
    inits: tuple[Item, ...] = ()  # regular init containers placed on their own (before the app containers)


def reused_by_app(pod: PodRequest) -> dict[str, str]:
    """Init containers whose devices the kubelet hands on to an app container, init name -> app name: the
    kubelet reuses an init container's devices for the next app container, and the node daemon matches them when
    the app container asks for the same amounts. Such an init container holds no room of its own (it has ended
    before the app container starts) and goes on the app container's GPU. Sidecars (restartPolicy Always) keep
    their devices for the pod's life: they reuse nothing and nothing reuses theirs."""
    apps = [c for c in pod.gpu_containers if not c.init]
    out: dict[str, str] = {}
    for init in (c for c in pod.gpu_containers if c.init and not c.sidecar):
        same = next((a for a in apps if (a.mem, a.core, a.count) == (init.mem, init.core, init.count)
                     and a.name not in out.values()), None)
        if same is not None:
            out[init.name] = same.name
    return out


def ask_of(pod: PodRequest) -> Ask:
    problem = check_pod(pod)
    wanted = pod.gpu_containers
    reused = reused_by_app(pod) if not problem else {}
    items: list[Item] = []
    inits: list[Item] = []
    if not problem:
        for c in sorted(wanted, key=_largest_first):
            if c.name in reused:
                continue
            into = inits if c.init and not c.sidecar else items
            if c.count:
                into.append(Item(c, c.count, 0, 0, c.count))
            else:
                mem, core = per_gpu_share(c, pod.gpus_per_container)
                into.append(Item(c, 0, mem, core, pod.gpus_per_container))
    return Ask(tuple(items), problem, any(c.core for c in wanted), tuple(reused.items()), tuple(inits))


def fit(pod: PodRequest | Ask, node: NodeView) -> Fit:
    """Place every GPU container of `pod` on `node`, or say why not."""
    ask = pod if isinstance(pod, Ask) else ask_of(pod)
    if ask.problem:
        return Fit(reason=ask.problem, unresolvable=True)
    if node.problem:
        return Fit(reason=node.problem, unresolvable=True)
    if ask.needs_core and node.mode not in MODES_WITH_CORE:
        return Fit(reason=mode_refusal(node.mode), unresolvable=True)
    one = single_share(ask)
    if one is not None:
        return _one_share(one, node)
    rooms = [g.copy() for g in node.gpus]
    out: dict[str, tuple[GpuShare, ...]] = {}
    several = len(ask.items) + len(ask.inits) > 1
    for item in ask.items:
        chosen = _whole(rooms, item.container, node.placement) if item.count else _shares(rooms, item, node)
        if isinstance(chosen, str):
            return Fit(reason=_prefix(item.container, several) + chosen)
        out[item.container.name] = chosen
    for item in ask.inits:
        alone = _before_apps(node, ask, out, item.container)
        chosen = _whole(alone, item.container, node.placement) if item.count else _shares(alone, item, node)
        if isinstance(chosen, str):
            return Fit(reason=_prefix(item.container, several) + chosen)
        out[item.container.name] = chosen
    for init, app in ask.reused:
        out[init] = out[app]
    return Fit(containers=out, transient=frozenset(i.container.name for i in ask.inits))


def _before_apps(node: NodeView, ask: Ask, placed: Mapping[str, tuple[GpuShare, ...]],
                 init: ContainerRequest) -> list[GpuRoom]:
    """The node's rooms as a regular init container finds them: other pods' holdings and the pod's sidecars
    started before it; not the pod's app containers (they start after it ends)."""
    rooms = [g.copy() for g in node.gpus]
    by_index = {r.index: r for r in rooms}
    for item in ask.items:
        c = item.container
        if c.sidecar and c.position < init.position:
            for share in placed.get(c.name, ()):
                if share.index in by_index:
                    by_index[share.index].hold(share)
    return rooms


def _one_share(item: Item, node: NodeView) -> Fit:
    """The common case without copying the node's rooms: one container, one GPU."""
    mem, core = item.mem, item.core
    need = core_needed(node.mode, mem, core)
    fits = [t for t in node.open_rooms if t[0] >= mem and t[1] >= need]
    if not fits:
        return Fit(reason=_why_not_one(node, mem, core))
    best = min(fits, key=_spread_key) if node.placement == "spread" else min(fits)
    return Fit(containers={item.container.name: (GpuShare(best[2], best[3], mem, core),)})


def _spread_key(t: tuple[int, int, int, str]) -> tuple[int, int, int]:
    return (-t[0], -t[1], t[2])


def _largest_first(c: ContainerRequest) -> tuple[int, int, int, int]:
    return (-c.count, -c.mem, -c.core, c.position)


def _prefix(c: ContainerRequest, several: bool) -> str:
    return f"container {c.name!r}: " if several else ""


def _whole(rooms: list[GpuRoom], c: ContainerRequest, placement: str = "binpack") -> tuple[GpuShare, ...] | str:
    free = [r for r in rooms if r.healthy and r.untouched]
    if len(free) < c.count:
        return (f"{_considered(rooms)}: {len(free)} GPU(s) have nothing on them, {c.count} whole GPU(s) asked"
                + _excluded(rooms))
    chosen = []
    for r in closest(free, c.count, lambda r: 0, placement):
        share = GpuShare(r.index, r.uuid, r.mem_total, 0, whole=True)
        r.hold(share)
        chosen.append(share)
    return tuple(chosen)


def _shares(rooms: list[GpuRoom], item: Item, node: NodeView) -> tuple[GpuShare, ...] | str:
    mem, core, gpus = item.mem, item.core, item.gpus
    need = core_needed(node.mode, mem, core)
    usable = [r for r in rooms if r.healthy and not r.whole]
    fits = [r for r in usable if r.mem_free >= mem and r.core_free >= need]
    if len(fits) < gpus:
        return _why_not(rooms, usable, mem, core, gpus, node.unit_mib, need)
    sign = -1 if node.placement == "spread" else 1
    chosen = []
    for r in closest(fits, gpus, lambda r: (sign * r.mem_free, sign * r.core_free), node.placement):
        share = GpuShare(r.index, r.uuid, mem, core)
        r.hold(share)
        chosen.append(share)
    return tuple(sorted(chosen, key=lambda s: s.index))


def closest(fits: Sequence[GpuRoom], need: int, rank: Callable[[GpuRoom], Any], placement: str) -> list[GpuRoom]:
    """`need` of `fits`: one NVLink island, else one NUMA node, else anywhere, the policy's `rank` breaking ties
    (devplugin/allocation/topology.py, the node daemon's rule)."""
    by_index = {r.index: r for r in fits}
    chosen = choose(list(by_index), need, lambda i: Where(by_index[i].island, by_index[i].numa), lambda i: i,
                    lambda i: rank(by_index[i]), placement)
    assert chosen is not None  # the caller checked there are enough
    return [by_index[i] for i in chosen.picked]


def _why_not(rooms: Sequence[GpuRoom], usable: Sequence[GpuRoom], mem: int, core: int, gpus: int,
             unit_mib: int, need: int) -> str:
    where = _considered(rooms)
    tail = _excluded(rooms)
    if not usable:
        return f"{where}: no GPU can take a share{tail}"
    by_mem = [r for r in usable if r.mem_free >= mem]
    if gpus > 1:
        if need and not core and len(by_mem) >= gpus:  # the memory is there; compute nobody reserved is not
            have = len([r for r in by_mem if r.core_free >= need])
            return (f"{where}: {have} GPU(s) have {mem_text(mem, unit_mib)} free and at least {need} % compute "
                    f"nobody reserved, {gpus} needed for a {gpus}-GPU share{tail}: {_UNRESERVED}")
        have = len([r for r in by_mem if r.core_free >= core])
        what = mem_text(mem, unit_mib) + (f" and {core} % compute" if core else "")
        return f"{where}: {have} GPU(s) have {what} free, {gpus} needed for a {gpus}-GPU share{tail}"
    if not by_mem:
        best = max(r.mem_free for r in usable)
        return f"{where}: at most {mem_text(best, unit_mib)} free on one GPU, {mem_text(mem, unit_mib)} asked{tail}"
    best_core = max(r.core_free for r in by_mem)
    return _core_short(where, mem, core, best_core, unit_mib, tail)


# the end of a refusal for lack of unreserved compute (the daemon's words: unreserved.advice)
_UNRESERVED = advice("gpu-core.percentage")


def _core_short(where: str, mem: int, core: int, best_core: int, unit_mib: int, tail: str) -> str:
    """Why the GPUs with the memory do not do: too little compute free for the share, or, for a container that
    reserves none on a core_mem node, none unreserved."""
    if not core:
        return (f"{where}: the GPUs with {mem_text(mem, unit_mib)} free have at most {best_core} % compute "
                f"nobody reserved{tail}: {_UNRESERVED}")
    return (f"{where}: the GPUs with {mem_text(mem, unit_mib)} free have at most {best_core} % compute free, "
            f"{core} % asked{tail}")


def _why_not_one(node: NodeView, mem: int, core: int) -> str:
    """_why_not for one share on one GPU, from the node's open rooms and its cached texts (the same words)."""
    where, tail, best = node.share_texts
    if not node.open_rooms:
        return one_share_refusal(where, tail, node.unit_mib, mem, core, None, None)
    if best < mem:
        return one_share_refusal(where, tail, node.unit_mib, mem, core, best, None)
    best_core = max(t[1] for t in node.open_rooms if t[0] >= mem)
    return one_share_refusal(where, tail, node.unit_mib, mem, core, best, best_core)


def one_share_refusal(where: str, tail: str, unit_mib: int, mem: int, core: int, best: int | None,
                      best_core: int | None) -> str:
    """Why one share of `mem` and `core` fits no GPU of a node: `best` is the most memory free on a GPU that can
    take a share (None: no GPU can), `best_core` the most compute free among those with `mem` free (None: none
    has). `where` and `tail` are the node's share_texts."""
    if best is None:
        return f"{where}: no GPU can take a share{tail}"
    if best_core is None:
        return f"{where}: at most {mem_text(best, unit_mib)} free on one GPU, {mem_text(mem, unit_mib)} asked{tail}"
    return _core_short(where, mem, core, best_core, unit_mib, tail)


def mode_refusal(mode: str) -> str:
    """Why a node of `mode` takes no pod that asks for gpu-core.percentage ('' when it does)."""
    if mode in MODES_WITH_CORE:
        return ""
    return f"node mode {mode} does not serve gpu-core.percentage (only core_mem nodes do)"


def one_share_check(item: Item, needs_core: bool, node: NodeView) -> tuple[str, bool]:
    """fit(...) for one share on one GPU as filter needs it: ('', False) when it fits, else (reason, unresolvable),
    the same words as fit, without choosing the GPU."""
    if node.problem:
        return node.problem, True
    if needs_core and node.mode not in MODES_WITH_CORE:
        return f"node mode {node.mode} does not serve gpu-core.percentage (only core_mem nodes do)", True
    mem, core = item.mem, item.core
    need = core_needed(node.mode, mem, core)
    for t in node.open_rooms:
        if t[0] >= mem and t[1] >= need:
            return "", False
    return _why_not_one(node, mem, core), False


def one_share_score(item: Item, needs_core: bool, node: NodeView) -> int:
    """score(node, fit(...)) for one share on one GPU without building the Fit (prioritize asks every node)."""
    total, used = node.mem_totals
    if not total or node.problem or (needs_core and node.mode not in MODES_WITH_CORE):
        return 0
    mem, core = item.mem, item.core
    need = core_needed(node.mode, mem, core)
    for t in node.open_rooms:
        if t[0] >= mem and t[1] >= need:
            break
    else:
        return 0
    frac = min((used + mem) / total, 1.0)
    return int(10 * (frac if node.placement != "spread" else 1.0 - frac) + 0.5)


def single_share(ask: Ask) -> Item | None:
    """The ask's one item when it is one share on one GPU (the fast paths), else None."""
    if (len(ask.items) == 1 and not ask.items[0].count and ask.items[0].gpus == 1 and not ask.reused
            and not ask.inits):
        return ask.items[0]
    return None


def _considered(rooms: Sequence[GpuRoom]) -> str:
    return gpu_list(r.index for r in rooms if r.healthy and not r.whole)


def _excluded(rooms: Sequence[GpuRoom]) -> str:
    notes = []
    sick = [r.index for r in rooms if not r.healthy]
    whole = [r.index for r in rooms if r.healthy and r.whole]
    if sick:
        notes.append(f"{gpu_list(sick)} unhealthy")
    if whole:
        notes.append(f"{gpu_list(whole)} held whole")
    return f" ({'; '.join(notes)})" if notes else ""


def score(node: NodeView, placed: Fit) -> int:
    """0..10: binpack favours the node whose memory is fullest once the pod is on it, spread the emptiest. For a pod
    with a multi-GPU container on a node that publishes its topology, locality comes first (locality_score)."""
    total, used = node.mem_totals
    if not total or not placed.ok:
        return 0
    used += sum(s.mem for name, shares in placed.containers.items() if name not in placed.transient
                for s in shares)
    frac = min(used / total, 1.0)
    value = frac if node.placement != "spread" else 1.0 - frac
    level = locality(node, placed)
    if level is not None:
        return locality_score(level, value)
    return int(10 * value + 0.5)  # half up


# the scores of each locality: one NVLink island 7..10, one NUMA node 4..6, spread 0..3; the policy within
_LOCALITY_SCORES = {NVLINK: (7, 3), NUMA: (4, 2), ANY: (0, 3)}


def locality_score(level: str, value: float) -> int:
    """A multi-GPU pod's score: its locality's band, and the policy's `value` (0..1) within it."""
    low, span = _LOCALITY_SCORES[level]
    return low + int(span * value + 0.5)


def locality(node: NodeView, placed: Fit) -> str | None:
    """How close the GPUs of the pod's least local multi-GPU container are (NVLINK, NUMA, ANY); None when no
    container has several GPUs or the node publishes no topology."""
    rooms = {r.index: r for r in node.gpus}
    if not any(r.island is not None or r.numa is not None for r in rooms.values()):
        return None
    order = (NVLINK, NUMA, ANY)
    worst = None
    for name, shares in placed.containers.items():
        if len(shares) < 2 or name in placed.transient:
            continue
        got = [rooms[s.index] for s in shares if s.index in rooms]
        islands = {r.island for r in got}
        numas = {r.numa for r in got}
        level = (NVLINK if len(islands) == 1 and None not in islands
                 else NUMA if len(numas) == 1 and None not in numas else ANY)
        if worst is None or order.index(level) > order.index(worst):
            worst = level
    return worst
