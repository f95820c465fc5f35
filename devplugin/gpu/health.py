"""GPU health from NVML XID events, with recovery where the fault is transient, and health kept across restarts.

One background thread blocks in nvmlEventSetWait_v2 (no polling). A critical XID that is not in the ignore
list, or a GPU that NVML reports lost, turns the GPU unhealthy: on_change(uuid, False, reason), once.

Two kinds of fault:
- transient (any other critical XID, a lost GPU): re-checked every `recovery_seconds`; when no critical XID
  came in that window and NVML answers for it (handle by UUID and memory info succeed), on_change(uuid, True).
- needs a reset (`reset_xids`: double-bit ECC, page retirement / row remapping, NVLink, fallen off the bus, ECC
  rate and contained/uncontained ECC errors): the hardware is not usable again until the GPU is reset or
  replaced, whatever time passes. NVML has no counter or timestamp of GPU resets that would show one happened
  for all of these, so the GPU stays unhealthy until one of two pieces of evidence:
  * the operator's marker `<state-dir>/reset-done/<UUID>` (created after `nvidia-smi -r -i <index>` or a
    repair), checked every few seconds; or
  * a node reboot since the fault (the kernel's boot id changed): a reboot resets every GPU.
  Either way the GPU must then answer NVML, and where NVML reports them, no row remapping or page retirement
  may still be pending (that needs another reset) or have failed (that needs a new GPU); a marker that is
  refused says why in the log, and is consumed. A replaced GPU has a new UUID, so it starts healthy.

With a HealthStore, every change is saved (by UUID: XID, reason, time) and start() restores the saved faults,
so a restarted daemon starts those GPUs unhealthy under the same rules. Re-checks are only scheduled while
some GPU is unhealthy.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pynvml

from devplugin.gpu import nvml
from devplugin.gpu.device import GPU
from devplugin.gpu.health_state import Fault, HealthStore, current_boot_id

log = logging.getLogger(__name__)

# NVIDIA device plugin's default: XIDs caused by applications (13 graphics engine exception, 31 MMU fault,
# 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout).
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
# XIDs after which only a GPU reset (or a new GPU) helps, per NVIDIA's XID catalogue: 48 double-bit ECC error,
# 63 page retirement / row remapping recorded (pending until reset), 64 retirement / remapping failed, 74 NVLink
# error, 79 GPU fallen off the bus, 92 high single-bit ECC error rate, 94 contained and 95 uncontained ECC error.
DEFAULT_RESET_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
RESET_POLL_S = 5.0  # how often a GPU that needs a reset looks for the operator's marker
WAIT_TIMEOUT_MS = 500  # how long stop() may wait for the thread; 2 wake-ups a second when idle
_ERROR_BACKOFF_S = 1.0

OnChange = Callable[[str, bool, str], object]  # whatever it returns is not used


def _address(handle: Any) -> int | None:  # an NVML device handle: a ctypes pointer (pynvml has no types)
    return ctypes.cast(handle, ctypes.c_void_p).value


class HealthWatcher:
    """Watches the given GPUs; reports each health change through on_change(uuid, healthy, reason)."""

    def __init__(
        self,
        gpus: Iterable[GPU],
        on_change: OnChange,
        ignored_xids: frozenset[int] = DEFAULT_IGNORED_XIDS,
        recovery_seconds: float = 60.0,
        wait_timeout_ms: int = WAIT_TIMEOUT_MS,
        reset_xids: frozenset[int] = DEFAULT_RESET_XIDS,
        store: HealthStore | None = None,
        reset_poll_seconds: float = RESET_POLL_S,
    ) -> None:
        for name, value in (("recovery_seconds", recovery_seconds), ("reset_poll_seconds", reset_poll_seconds)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds greater than 0, not {value!r}")
        self._gpus = list(gpus)
        self._on_change = on_change
        self._ignored = frozenset(ignored_xids)
        self._reset_xids = frozenset(reset_xids)
        self._store = store
        self._boot_id = store.boot_id if store is not None else current_boot_id()
        self._recovery = float(recovery_seconds)
        self._reset_poll = min(float(reset_poll_seconds), self._recovery)
        self._wait_ms = int(wait_timeout_ms)
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._recheck_at: dict[str, float] = {}  # unhealthy GPU uuid -> when to re-check it (monotonic)
        self._faults: dict[str, Fault] = {}  # unhealthy GPU uuid -> why (what the state file holds)
        self._by_handle: dict[int | None, GPU] = {}  # registered GPUs by NVML handle address (None: NULL)
        # MIG devices (gpu/mig.py), by their GPU's handle address: XIDs come on the GPU's handle, for all of them
        self._migs_by_parent: dict[int | None, list[GPU]] = {}
        self._event_set: object | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Register for XID events and start the thread. NvmlUnavailable when NVML cannot be used at all."""
        if self._thread is not None:
            raise RuntimeError("HealthWatcher already started")
        nvml.init()
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as err:
            nvml.shutdown()
            raise nvml.unavailable(err, "nvmlEventSetCreate") from None
        self._restore()
        for gpu in self._gpus:
            self._register(gpu)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()
        log.info(
            "watching %d of %d GPUs for XID events (ignored XIDs: %s; XIDs that need a GPU reset: %s; recovery "
            "after %g s; saved health: %s)",
            len(self._by_handle) + sum(map(len, self._migs_by_parent.values())), len(self._gpus),
            ",".join(map(str, sorted(self._ignored))) or "none",
            ",".join(map(str, sorted(self._reset_xids))) or "none", self._recovery,
            self._store.path if self._store is not None else "none",
        )

    def stop(self) -> None:
        """Stop the thread (returns within about wait_timeout_ms) and release NVML."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=self._wait_ms / 1000 + 5)
        if thread.is_alive():  # stuck inside NVML: leave the set alone rather than free it under the thread
            log.error("the GPU health thread did not stop; leaving its NVML event set allocated")
            return
        try:
            pynvml.nvmlEventSetFree(self._event_set)
        except pynvml.NVMLError as err:
            log.debug("nvmlEventSetFree: %s", nvml.describe(err))
        self._event_set = None
        self._by_handle.clear()
        self._migs_by_parent.clear()
        nvml.shutdown()

    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the GPUs currently reported unhealthy."""
        with self._lock:
            return frozenset(self._recheck_at)

    def faults(self) -> dict[str, Fault]:
        """Why each unhealthy GPU is unhealthy, by UUID."""
        with self._lock:
            return dict(self._faults)

    # ---- the thread -----------------------------------------------------------------------------------

    def _run(self) -> None:
        errors = 0
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._event_set, self._next_timeout_ms())
            except pynvml.NVMLError_Timeout:
                data = None
                errors = 0
            except pynvml.NVMLError_GpuIsLost:
                data = None
                errors += 1
                self._probe_all("NVML reported a lost GPU while waiting for events")
            except pynvml.NVMLError as err:
                data = None
                errors += 1
                if errors == 1 or errors % 60 == 0:
                    log.error("waiting for NVML events failed (%s); checking every GPU", nvml.describe(err))
                self._probe_all(f"event wait failed: {nvml.describe(err)}")
            else:
                errors = 0
            if errors > 1:  # the same error again at once: never spin on a persistent one
                self._stop.wait(_ERROR_BACKOFF_S)
            try:
                if data is not None:
                    self._on_event(data)
                self._recheck_due()
            except Exception:  # keep watching whatever a callback or NVML throws
                log.exception("GPU health check failed")
                self._stop.wait(_ERROR_BACKOFF_S)

    def _next_timeout_ms(self) -> int:
        with self._lock:
            due = min(self._recheck_at.values(), default=None)
        if due is None:
            return self._wait_ms
        return max(0, min(self._wait_ms, int((due - time.monotonic()) * 1000) + 1))

    def _on_event(self, data: pynvml.c_nvmlEventData_t) -> None:
        if data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        address = _address(data.device)
        gpu = self._by_handle.get(address)
        if gpu is None:
            migs = self._migs_by_parent.get(address, [])
            if not migs:
                log.warning("XID %d on a GPU this daemon does not watch", xid, extra={"fields": {"xid": xid}})
            for mig in migs:  # an XID of a GPU in MIG mode: each of its MIG devices it serves
                self._on_xid(mig, xid)
            return
        self._on_xid(gpu, xid)

    def _on_xid(self, gpu: GPU, xid: int) -> None:
        fields = {"gpu_index": gpu.index, "gpu": gpu.uuid, "xid": xid}
        if xid in self._ignored:
            log.info("GPU %d (%s): XID %d, ignored (application error)", gpu.index, gpu.uuid, xid,
                     extra={"fields": fields})
            return
        if xid in self._reset_xids:
            reason = (f"XID {xid} on GPU {gpu.index} ({gpu.uuid}): a fault that needs a GPU reset; after "
                      f"`nvidia-smi -r -i {gpu.index}` (or a reboot) run `{self._marker_hint(gpu)}`")
        else:
            reason = f"XID {xid} on GPU {gpu.index} ({gpu.uuid}): critical error reported by the driver"
        self._mark_unhealthy(gpu, reason, xid=xid)

    # ---- health transitions ---------------------------------------------------------------------------

    def _marker_hint(self, gpu: GPU) -> str:
        if self._store is None:
            return "restart the daemon (no --state-dir)"
        return f"touch {self._store.reset_marker(gpu.uuid)}"

    def _mark_unhealthy(self, gpu: GPU, reason: str, xid: int | None = None) -> None:
        fields = {"gpu_index": gpu.index, "gpu": gpu.uuid, "xid": xid, "healthy": False}
        needs_reset = xid is not None and xid in self._reset_xids
        with self._lock:
            previous = self._faults.get(gpu.uuid)
            if previous is not None and previous.needs_reset and not needs_reset:
                fault = previous  # a transient error never downgrades one that needs a reset
            else:
                fault = Fault.now(xid, reason, needs_reset, self._boot_id)
            self._faults[gpu.uuid] = fault
            self._recheck_at[gpu.uuid] = time.monotonic() + (self._reset_poll if fault.needs_reset
                                                             else self._recovery)
        self._save()
        if previous is not None:
            still = "needs a GPU reset" if fault.needs_reset else "recovery clock restarted"
            level = logging.WARNING if fault.needs_reset and not previous.needs_reset else logging.INFO
            log.log(level, "GPU %d (%s) still unhealthy, %s: %s", gpu.index, gpu.uuid, still, reason,
                    extra={"fields": fields})
            return
        log.warning("GPU %d (%s) unhealthy: %s", gpu.index, gpu.uuid, reason, extra={"fields": fields})
        self._notify(gpu.uuid, False, reason)

    def _mark_healthy(self, gpu: GPU, reason: str) -> None:
        with self._lock:
            self._recheck_at.pop(gpu.uuid, None)
            self._faults.pop(gpu.uuid, None)
        self._save()
        if gpu not in self._by_handle.values() and not any(gpu in m for m in self._migs_by_parent.values()):
            self._register(gpu)  # it was lost when we started: watch it from now on
        log.warning("GPU %d (%s) healthy again: %s", gpu.index, gpu.uuid, reason,
                    extra={"fields": {"gpu_index": gpu.index, "gpu": gpu.uuid, "healthy": True}})
        self._notify(gpu.uuid, True, reason)

    def _save(self) -> None:
        if self._store is None:
            return
        with self._save_lock:  # the snapshot and its write in one order, so the file never goes back in time
            with self._lock:
                snapshot = dict(self._faults)
            self._store.save(snapshot)

    def _restore(self) -> None:
        """Start the GPUs the state file lists unhealthy; a reboot since a reset-needing fault counts as a reset."""
        if self._store is None:
            return
        saved = self._store.load()
        by_uuid = {g.uuid: g for g in self._gpus}
        for uuid in sorted(set(saved) - set(by_uuid)):
            log.info("saved GPU health lists %s (%s), which is not on this node now (replaced or gone): "
                     "forgetting it", uuid, saved[uuid].reason, extra={"fields": {"gpu": uuid}})
        changed = len(set(saved) - set(by_uuid)) > 0
        for uuid, fault in saved.items():
            gpu = by_uuid.get(uuid)
            if gpu is None:
                continue
            fields = {"gpu_index": gpu.index, "gpu": uuid, "xid": fault.xid, "healthy": False}
            if fault.needs_reset and fault.boot_id and self._boot_id and fault.boot_id != self._boot_id:
                why = self._fault(gpu) or self._reset_pending(gpu)
                if why is None:
                    log.warning("GPU %d (%s) healthy: its fault (%s, since %s) needs a GPU reset, and the node "
                                "has rebooted since, which reset it; NVML answers", gpu.index, uuid, fault.reason,
                                fault.since, extra={"fields": {**fields, "healthy": True}})
                    changed = True
                    continue
                log.warning("GPU %d (%s): the node rebooted since its fault (%s) but %s", gpu.index, uuid,
                            fault.reason, why, extra={"fields": fields})
            with self._lock:
                self._faults[uuid] = fault
                self._recheck_at[uuid] = time.monotonic() + (self._reset_poll if fault.needs_reset
                                                             else self._recovery)
            reason = f"unhealthy before the daemon restarted (since {fault.since}): {fault.reason}"
            log.warning("GPU %d (%s) unhealthy: %s", gpu.index, uuid, reason, extra={"fields": fields})
            self._notify(uuid, False, reason)
        if changed:
            self._save()

    def _recheck_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [uuid for uuid, at in self._recheck_at.items() if at <= now]
        for uuid in due:
            gpu = next(g for g in self._gpus if g.uuid == uuid)
            with self._lock:
                fault = self._faults.get(uuid)
            if fault is not None and fault.needs_reset:
                self._recheck_reset(gpu, fault)
                continue
            why = self._fault(gpu)
            fields = {"gpu_index": gpu.index, "gpu": gpu.uuid}
            if why:
                with self._lock:
                    self._recheck_at[uuid] = time.monotonic() + self._recovery
                log.info("GPU %d (%s) still unhealthy: %s; next check in %g s", gpu.index, uuid, why,
                         self._recovery, extra={"fields": fields})
                continue
            self._mark_healthy(gpu, f"recovered: no critical XID for {self._recovery:g} s and NVML answers")

    def _recheck_reset(self, gpu: GPU, fault: Fault) -> None:
        """A GPU that needs a reset turns healthy only on the operator's marker, once NVML shows it usable."""
        with self._lock:
            self._recheck_at[gpu.uuid] = time.monotonic() + self._reset_poll
        if self._store is None or not self._store.take_reset_marker(gpu.uuid):
            return
        why = self._fault(gpu) or self._reset_pending(gpu)
        if why:
            log.warning("GPU %d (%s): reset marker %s refused, the GPU stays unhealthy: %s. Reset (or replace) "
                        "the GPU, then create the marker again", gpu.index, gpu.uuid,
                        self._store.reset_marker(gpu.uuid), why,
                        extra={"fields": {"gpu_index": gpu.index, "gpu": gpu.uuid, "xid": fault.xid}})
            return
        self._mark_healthy(gpu, f"reset confirmed by {self._store.reset_marker(gpu.uuid)} after {fault.reason}; "
                                "NVML answers")

    def _probe_all(self, context: str) -> None:
        with self._lock:
            healthy = [g for g in self._gpus if g.uuid not in self._recheck_at]
        for gpu in healthy:
            why = self._fault(gpu)
            if why:
                self._mark_unhealthy(gpu, f"{why} ({context})")

    def _notify(self, uuid: str, healthy: bool, reason: str) -> None:
        try:
            self._on_change(uuid, healthy, reason)
        except Exception:
            log.exception("health callback failed for GPU %s", uuid)

    # ---- NVML -----------------------------------------------------------------------------------------

    def _fault(self, gpu: GPU) -> str | None:
        """None when NVML answers for the GPU, else why not."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
            pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError_GpuIsLost:
            return f"GPU {gpu.index} ({gpu.uuid}) is lost (NVML_ERROR_GPU_IS_LOST): it fell off the bus"
        except pynvml.NVMLError as err:
            return f"NVML does not answer for GPU {gpu.index} ({gpu.uuid}): {nvml.describe(err)}"
        return None

    def _reset_pending(self, gpu: GPU) -> str | None:
        """None unless NVML says the GPU still needs a reset (remapped rows or retired pages pending) or a
        replacement (row remapping failed). Drivers and GPUs that do not report these tell nothing."""
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
        except pynvml.NVMLError as err:
            return f"NVML does not answer for GPU {gpu.index} ({gpu.uuid}): {nvml.describe(err)}"
        try:
            _, _, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
            if failed:
                return "NVML reports that row remapping failed: the GPU needs replacing"
            if pending:
                return "NVML reports row remapping pending: the GPU has not been reset yet"
        except pynvml.NVMLError as err:
            log.debug("GPU %d: remapped rows unknown: %s", gpu.index, nvml.describe(err))
        try:
            if pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                return "NVML reports page retirement pending: the GPU has not been reset yet"
        except pynvml.NVMLError as err:
            log.debug("GPU %d: retired pages unknown: %s", gpu.index, nvml.describe(err))
        return None

    def _register(self, gpu: GPU) -> None:
        """Register the GPU for XID events; a lost or unreachable GPU starts unhealthy."""
        fields = {"gpu_index": gpu.index, "gpu": gpu.uuid}
        try:
            # a MIG device's XIDs are delivered on its GPU's handle (registered once for all its MIG devices)
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.parent_uuid or gpu.uuid)
            if gpu.is_mig and _address(handle) in self._migs_by_parent:
                self._migs_by_parent[_address(handle)].append(gpu)
                return
            supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
            if not supported & pynvml.nvmlEventTypeXidCriticalError:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set)
        except pynvml.NVMLError_NotSupported:
            log.warning("GPU %d (%s): the driver does not deliver XID events for it; its health is not watched",
                        gpu.index, gpu.uuid, extra={"fields": fields})
            return
        except pynvml.NVMLError_GpuIsLost:
            self._mark_unhealthy(gpu, f"GPU {gpu.index} ({gpu.uuid}) is lost (NVML_ERROR_GPU_IS_LOST)")
            return
        except pynvml.NVMLError as err:
            self._mark_unhealthy(gpu, f"cannot watch GPU {gpu.index} ({gpu.uuid}): {nvml.describe(err)}")
            return
        if gpu.is_mig:
            self._migs_by_parent[_address(handle)] = [gpu]
        else:
            self._by_handle[_address(handle)] = gpu
