"""GPU health from NVML XID events, with recovery (NVIDIA's device plugin never lets an unhealthy GPU back).

One background thread blocks in nvmlEventSetWait_v2 (no polling). A critical XID that is not in the ignore
list, or a GPU that NVML reports lost, turns the GPU unhealthy: on_change(uuid, False, reason), once. While
a GPU is unhealthy it is re-checked every `recovery_seconds`: when no critical XID came in that window and NVML
answers for it (handle by UUID and memory info succeed), on_change(uuid, True, reason). Re-checks are only
scheduled while some GPU is unhealthy.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Iterable

import pynvml

from devplugin.gpu import nvml
from devplugin.gpu.inventory import GPU

log = logging.getLogger(__name__)

# NVIDIA device plugin's default: XIDs caused by applications (13 graphics engine exception, 31 MMU fault,
# 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout).
DEFAULT_IGNORED_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
WAIT_TIMEOUT_MS = 500  # how long stop() may wait for the thread; 2 wake-ups a second when idle
_ERROR_BACKOFF_S = 1.0

OnChange = Callable[[str, bool, str], None]


def _address(handle: object) -> int | None:
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
    ) -> None:
        if recovery_seconds <= 0:
            raise ValueError("recovery_seconds must be positive")
        self._gpus = list(gpus)
        self._on_change = on_change
        self._ignored = frozenset(ignored_xids)
        self._recovery = float(recovery_seconds)
        self._wait_ms = int(wait_timeout_ms)
        self._lock = threading.Lock()
        self._recheck_at: dict[str, float] = {}  # unhealthy GPU uuid -> when to re-check it (monotonic)
        self._by_handle: dict[int, GPU] = {}  # registered GPUs by NVML handle address
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
        for gpu in self._gpus:
            self._register(gpu)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-health", daemon=True)
        self._thread.start()
        log.info(
            "watching %d of %d GPUs for XID events (ignored XIDs: %s; recovery after %g s)",
            len(self._by_handle), len(self._gpus), ",".join(map(str, sorted(self._ignored))) or "none",
            self._recovery,
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
        nvml.shutdown()

    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the GPUs currently reported unhealthy."""
        with self._lock:
            return frozenset(self._recheck_at)

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
        gpu = self._by_handle.get(_address(data.device))
        xid = int(data.eventData)
        if gpu is None:
            log.warning("XID %d on a GPU this daemon does not watch", xid, extra={"fields": {"xid": xid}})
            return
        fields = {"gpu_index": gpu.index, "gpu": gpu.uuid, "xid": xid}
        if xid in self._ignored:
            log.info("GPU %d (%s): XID %d, ignored (application error)", gpu.index, gpu.uuid, xid,
                     extra={"fields": fields})
            return
        self._mark_unhealthy(gpu, f"XID {xid} on GPU {gpu.index} ({gpu.uuid}): critical error reported by the "
                                  "driver", xid=xid)

    # ---- health transitions ---------------------------------------------------------------------------

    def _mark_unhealthy(self, gpu: GPU, reason: str, xid: int | None = None) -> None:
        fields = {"gpu_index": gpu.index, "gpu": gpu.uuid, "xid": xid, "healthy": False}
        with self._lock:
            already = gpu.uuid in self._recheck_at
            self._recheck_at[gpu.uuid] = time.monotonic() + self._recovery
        if already:
            log.info("GPU %d (%s) still unhealthy, recovery clock restarted: %s", gpu.index, gpu.uuid, reason,
                     extra={"fields": fields})
            return
        log.warning("GPU %d (%s) unhealthy: %s", gpu.index, gpu.uuid, reason, extra={"fields": fields})
        self._notify(gpu.uuid, False, reason)

    def _recheck_due(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [uuid for uuid, at in self._recheck_at.items() if at <= now]
        for uuid in due:
            gpu = next(g for g in self._gpus if g.uuid == uuid)
            why = self._fault(gpu)
            fields = {"gpu_index": gpu.index, "gpu": gpu.uuid}
            if why:
                with self._lock:
                    self._recheck_at[uuid] = time.monotonic() + self._recovery
                log.info("GPU %d (%s) still unhealthy: %s; next check in %g s", gpu.index, uuid, why,
                         self._recovery, extra={"fields": fields})
                continue
            with self._lock:
                self._recheck_at.pop(uuid, None)
            if gpu not in self._by_handle.values():
                self._register(gpu)  # it was lost when we started: watch it from now on
            reason = f"recovered: no critical XID for {self._recovery:g} s and NVML answers"
            log.warning("GPU %d (%s) healthy again: %s", gpu.index, uuid, reason,
                        extra={"fields": {**fields, "healthy": True}})
            self._notify(uuid, True, reason)

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

    def _register(self, gpu: GPU) -> None:
        """Register the GPU for XID events; a lost or unreachable GPU starts unhealthy."""
        fields = {"gpu_index": gpu.index, "gpu": gpu.uuid}
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
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
        self._by_handle[_address(handle)] = gpu
