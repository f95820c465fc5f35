"""Watching the node's MIG layout while it is served: a MIG mode that waits for a GPU reset, or MIG devices that
appear, vanish or change under the daemon, must never give anything twice or forget a holding.

The daemon serves the layout it read at start (gpu/mig.py). Every `interval_s` this thread reads each GPU's MIG
mode and MIG devices again; when a GPU's differs from what is served (or its MIG mode now waits for a reset), it
calls on_change(LayoutChange) once per new state: `affected` are the served devices of that GPU (its MIG devices,
or the GPU itself); `differs` when what is served is no longer there (a reset only pending changes nothing yet).
The daemon then keeps them Unhealthy (no new placement, holdings kept),
raises an Event on the Node saying what the operator must do, and serves the new layout once nothing holds the
affected devices (app/serve.py).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import pynvml

from devplugin.gpu import mig, nvml
from devplugin.gpu.device import GPU
from devplugin.gpu.nvml import NvmlUnavailable

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class LayoutChange:
    gpu_uuid: str
    affected: tuple[str, ...]  # the served devices of that GPU
    reason: str  # what happened and what the operator must do
    differs: bool  # the served layout is gone (False: only a reset is pending)


OnLayoutChange = Callable[[LayoutChange], object]


def physical_gpus(shared: Sequence[GPU]) -> dict[str, tuple[int, tuple[GPU, ...]]]:
    """Served devices grouped by their physical GPU: GPU UUID -> (NVML index, its served devices)."""
    out: dict[str, tuple[int, tuple[GPU, ...]]] = {}
    for g in shared:
        uuid, index = (g.parent_uuid, g.parent_index) if g.is_mig else (g.uuid, g.index)
        _, have = out.get(uuid, (index, ()))
        out[uuid] = (index if index is not None else -1, (*have, g))
    return out


def served_signature(devices: Sequence[GPU]) -> tuple[bool, tuple[tuple[str, int], ...]]:
    """What the daemon serves of one GPU: in MIG mode or not, and (UUID, memory) of each MIG device."""
    return (devices[0].is_mig, tuple(sorted((d.uuid, d.memory_bytes) for d in devices if d.is_mig)))


def state_signature(state: mig.MigState) -> tuple[bool, tuple[tuple[str, int], ...]]:
    return (bool(state.current), tuple(sorted((d.uuid, d.memory_bytes) for d in state.devices)))


def advice(index: int, uuid: str, state: mig.MigState) -> str:
    """What the operator must do, for the Event."""
    if state.reset_pending:
        return (f"GPU {index} ({uuid}) will turn MIG {'on' if state.pending else 'off'} at its next reset: drain "
                f"the pods on it (kubectl drain, or delete them), then reset it (nvidia-smi -r -i {index}); its "
                "devices take no new pods meanwhile")
    return (f"GPU {index} ({uuid}) changed its MIG layout while served (now {state.describe()}): the devices "
            "served before take no new pods; pods holding them keep running, and the new layout is served once "
            "they end (drain them to apply it now)")


def changes(shared: Sequence[GPU], layout: dict[str, mig.MigState]) -> dict[str, LayoutChange]:
    """GPU UUID -> its change, for each GPU whose layout differs from what is served or waits for a reset."""
    out: dict[str, LayoutChange] = {}
    for uuid, (index, devices) in physical_gpus(shared).items():
        state = layout.get(uuid)
        if state is None:
            continue
        differs = served_signature(devices) != state_signature(state)
        if state.reset_pending or differs:
            out[uuid] = LayoutChange(uuid, tuple(d.uuid for d in devices), advice(index, uuid, state), differs)
    return out


class LayoutWatcher:
    """Polls the MIG layout of the served GPUs and reports each change once (module docstring)."""

    def __init__(self, shared: Sequence[GPU], on_change: OnLayoutChange, interval_s: float = DEFAULT_INTERVAL_S,
                 read: Callable[[Sequence[GPU]], dict[str, mig.MigState]] | None = None) -> None:
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"the MIG layout check interval must be a finite number of seconds > 0, not "
                             f"{interval_s!r}")
        self.shared = list(shared)
        self.on_change = on_change
        self.interval_s = interval_s
        self._read = read or _read_nvml
        self._reported: dict[str, str] = {}  # GPU UUID -> the reason last reported
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> dict[str, LayoutChange]:
        """Read the layout once; report what changed since the last report. The changes found (reported or not)."""
        found = changes(self.shared, self._read(self._physical()))
        for uuid, change in found.items():
            if self._reported.get(uuid) != change.reason:
                self._reported[uuid] = change.reason
                log.warning("%s", change.reason, extra={"fields": {"gpu": uuid, "devices": ",".join(change.affected)}})
                self.on_change(change)
        return found

    def _physical(self) -> list[GPU]:
        out = []
        for uuid, (index, devices) in physical_gpus(self.shared).items():
            out.append(replace(devices[0], uuid=uuid, index=index, parent_uuid="", parent_index=None, mig_profile=""))
        return out

    def start(self) -> None:
        """Check once now (a reset already pending is reported before the first placement), then every
        interval_s on a thread."""
        if self._thread is not None:
            return
        try:
            self.check()
        except (NvmlUnavailable, pynvml.NVMLError) as exc:
            log.warning("the MIG layout could not be read (%s); trying again in %g s", exc, self.interval_s)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mig-layout", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=self.interval_s + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.check()
            except (NvmlUnavailable, pynvml.NVMLError) as exc:
                log.warning("the MIG layout could not be read (%s); trying again in %g s", exc, self.interval_s)
            except Exception:  # noqa: BLE001 - a bug here must not end the thread that guards the books
                log.exception("the MIG layout check failed; trying again in %g s", self.interval_s)

    def alive(self) -> bool:
        return self._thread is None or self._thread.is_alive()


def _read_nvml(gpus: Sequence[GPU]) -> dict[str, mig.MigState]:
    with nvml.session():
        return mig.read_layout(gpus)
