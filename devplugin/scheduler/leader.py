"""Leader election on a coordination.k8s.io/v1 Lease: of several extender replicas, only the leader decides and
binds; readiness follows leadership, so the Service routes kube-scheduler and the apiserver to it.

The rules are client-go's: a candidate takes the Lease when it is free, released (empty holder) or not renewed for
leaseDurationSeconds as seen on the candidate's own clock; every write is an update at the read resourceVersion,
so of two candidates only one wins. The leader renews every `retry_s`; when it cannot renew for `renew_deadline_s`
(shorter than the lease) it stops leading before anyone else may start. On shutdown it releases the Lease so the
next replica takes over at its next try instead of after the lease runs out.

A small loop rather than the `kubernetes` client's leaderelection module: that module's LeaseLock talks through
the client's global default configuration (not the kubeconfig this service loaded), takes periods in whole seconds
of at least one (failover under 5 s needs a 3 s lease and sub-second retries), exits the process on a bad config,
never releases the Lease on shutdown, and its run() returns for good once leadership is lost.
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from devplugin.kube.client import drain

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 3.0
DEFAULT_RENEW_DEADLINE_S = 2.0
DEFAULT_RETRY_S = 0.5


def _now_micro() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api_client: Any, namespace: str, name: str, identity: str,
                 lease_s: float = DEFAULT_LEASE_S, renew_deadline_s: float = DEFAULT_RENEW_DEADLINE_S,
                 retry_s: float = DEFAULT_RETRY_S, on_change: Callable[[bool], None] = lambda leading: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not lease_s > renew_deadline_s > retry_s > 0:
            raise ValueError(f"leader election needs lease ({lease_s} s) > renew deadline ({renew_deadline_s} s) "
                             f"> retry period ({retry_s} s) > 0")
        if not identity:
            raise ValueError("leader election needs an identity: set --leader-elect-identity (the pod's name)")
        self.api: Any = client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_s, self.renew_deadline_s, self.retry_s = lease_s, renew_deadline_s, retry_s
        self.on_change = on_change
        self.clock = clock
        self._leading = False
        self._leader = ""
        self._renewed_at = float("-inf")  # our clock when we last renewed (leader)
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last read
        self._observed_at = float("-inf")  # our clock when that record last changed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)

    # ------------------------------------------------------------------ what the HTTP layer asks
    def is_leader(self) -> bool:
        return self._leading and self.clock() - self._renewed_at < self.renew_deadline_s

    def leader(self) -> str:
        return self.identity if self.is_leader() else self._leader

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LeaderElector:
        self._thread.start()
        return self

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if release and self._leading:
            self._release()
        self._set_leading(False)

    def try_once(self) -> bool:
        """One read and, if the Lease is ours or free, one write; True when we lead afterwards."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("reading lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
                return self._lost_if_stale()
            return self._create()
        obj = json.loads(lease.data)
        spec = obj.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        self._leader = holder
        duration = float(spec.get("leaseDurationSeconds") or self.lease_s)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return self._set_leading(False)
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != self.identity)
        spec.update({"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.lease_s)),
                     "renewTime": _now_micro(), "leaseTransitions": transitions})
        if holder != self.identity:
            spec["acquireTime"] = _now_micro()
        obj["spec"] = spec
        try:
            drain(self.api.replace_namespaced_lease(self.name, self.namespace, obj, _preload_content=False))
        except ApiException as exc:  # 409: another candidate wrote first
            if exc.status != 409:
                log.warning("updating lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return self._lost_if_stale()
        return self._won()

    # ------------------------------------------------------------------ internals
    def _create(self) -> bool:
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": max(1, round(self.lease_s)),
                         "acquireTime": _now_micro(), "renewTime": _now_micro(), "leaseTransitions": 0}}
        try:
            drain(self.api.create_namespaced_lease(self.namespace, body, _preload_content=False))
        except ApiException as exc:
            if exc.status != 409:
                log.warning("creating lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return self._lost_if_stale()
        return self._won()

    def _won(self) -> bool:
        self._renewed_at = self.clock()
        self._leader = self.identity
        return self._set_leading(True)

    def _lost_if_stale(self) -> bool:
        """A failed write: still leading until the renew deadline passes."""
        if self._leading and self.clock() - self._renewed_at >= self.renew_deadline_s:
            log.error("could not renew lease %s/%s for %.1f s: stepping down", self.namespace, self.name,
                      self.renew_deadline_s, extra={"fields": {"identity": self.identity}})
            return self._set_leading(False)
        return self.is_leader()

    def _set_leading(self, leading: bool) -> bool:
        if leading != self._leading:
            self._leading = leading
            log.info("became the leader" if leading else "stopped leading",
                     extra={"fields": {"identity": self.identity, "lease": f"{self.namespace}/{self.name}"}})
            self.on_change(leading)
        return leading

    def _release(self) -> None:
        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
            obj = json.loads(resp.data)
            spec = obj.get("spec") or {}
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update({"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now_micro()})
            drain(self.api.replace_namespaced_lease(self.name, self.namespace, obj, _preload_content=False))
            log.info("lease released", extra={"fields": {"identity": self.identity}})
        except ApiException as exc:
            log.warning("releasing lease %s/%s failed: %s", self.namespace, self.name, exc.reason)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_once()
            except Exception:  # the loop must outlive a bad answer; leadership lapses by the deadline
                log.exception("leader election round failed")
                self._lost_if_stale()
            self._stop.wait(self.retry_s)
