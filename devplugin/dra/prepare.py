"""NodePrepareResources / NodeUnprepareResources as plain functions over a claim reader, the shim files, the CDI
directory and the checkpoint (the gRPC servicer in devplugin/dra/servicer.py only translates).

Prepare, per claim: a claim already in the checkpoint is answered from it (idempotent, also after a restart);
otherwise the ResourceClaim is read (its UID checked), its allocation for this driver checked and summed per GPU
(devplugin/dra/claims.py), the shares' limits written as `devplugin serve` writes a container's (a directory per
claim under the shim root: limits file, usage file), a CDI spec written, then the checkpoint. Unprepare removes the
CDI spec, the claim's directory and its checkpoint entry; a claim it does not know is already unprepared. Errors
are per claim and name the claim, the GPU and the capacity.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from devplugin.allocation.ports import MountSpec
from devplugin.dra import cdi
from devplugin.dra import checkpoint as ckpt
from devplugin.dra.checkpoint import PreparedClaim, PreparedDevice
from devplugin.dra.claims import ClaimError, ClaimRef, Share, budgets, claim_limits, shares_of
from devplugin.dra.conflicts import ConflictCheck
from devplugin.dra.slices import DeviceRef
from devplugin.isolation.shim_files import Owner, ShimPaths, container_dir, prepare_container

log = logging.getLogger(__name__)

MAX_PARALLEL_READS = 8
ReadClaim = Callable[[str, str], object]  # (namespace, name) -> the ResourceClaim as JSON; raises on failure


@dataclass(frozen=True)
class Outcome:
    """One claim's answer: its devices, or an error."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def shim_dir_name(uid: str, request_index: int) -> str:
    """The shim directory of one request of a claim: claim-<UID>-<index of the request, in name order>."""
    return f"claim-{cdi.check_uid(uid)}-{request_index}"


def cdi_name(uid: str, request_index: int) -> str:
    return f"{cdi.check_uid(uid)}-{request_index}"


@dataclass
class Preparer:
    """See the module docstring. `serving()` answers "" when this node serves DRA, else why not."""

    node: str
    devices: Mapping[str, DeviceRef]
    read_claim: ReadClaim
    cdi_dir: Path
    checkpoint_path: Path
    shim: ShimPaths | None = None
    serving: Callable[[], str] = lambda: ""
    conflicts: ConflictCheck | None = None
    observe: Callable[[str, float, bool], None] = lambda op, seconds, ok: None
    prepared: dict[str, PreparedClaim] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        # a pod's claims are read together: one round trip's time, not one per claim; the threads are kept
        self._readers = ThreadPoolExecutor(MAX_PARALLEL_READS, thread_name_prefix="dra-claim-read")
        self.prepared = ckpt.load(self.checkpoint_path)  # CheckpointError: the caller refuses to start
        if self.prepared:
            log.info("checkpoint %s: %d prepared claims", self.checkpoint_path, len(self.prepared),
                     extra={"fields": {"node": self.node}})

    # ---- prepare --------------------------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """Every claim of one NodePrepareResources call, by UID. The checkpoint is written once per call, after
        the claims' files: a claim is answered as prepared only once the checkpoint holds it."""
        out: dict[str, Outcome] = {}
        fresh = [r for r in refs if r.uid not in self.prepared]
        if len(fresh) > 1:
            claims = dict(zip([r.uid for r in fresh], self._readers.map(self._read, fresh), strict=True))
        else:
            claims = {r.uid: self._read(r) for r in fresh}
        conflicts = self.conflicts.check(fresh, claims, self.prepared) if self.conflicts is not None else {}
        new: dict[str, tuple[ClaimRef, PreparedClaim, float]] = {}
        for ref in refs:
            start = time.monotonic()
            outcome, prepared = self._prepare_one(ref, claims.get(ref.uid), conflicts.get(ref.uid, ""))
            if prepared is not None:
                new[ref.uid] = (ref, prepared, start)
            else:
                self.observe("prepare", time.monotonic() - start, not outcome.error)
            out[ref.uid] = outcome
        if new:
            self._commit(new, out)
        return out

    def _read(self, ref: ClaimRef) -> object:
        """The claim, or the exception that reading it raised (it becomes this claim's error)."""
        try:
            return self.read_claim(ref.namespace, ref.name)
        except Exception as exc:  # noqa: BLE001 - any failure of the read is this claim's error
            return exc

    def _commit(self, new: dict[str, tuple[ClaimRef, PreparedClaim, float]], out: dict[str, Outcome]) -> None:
        try:
            with self._lock:
                self.prepared.update({uid: p for uid, (_, p, _) in new.items()})
                self._save()
        except OSError as exc:
            with self._lock:
                for uid in new:
                    self.prepared.pop(uid, None)
            for uid, (ref, _, start) in new.items():
                out[uid] = Outcome(error=f"claim {ref}: cannot write the checkpoint {self.checkpoint_path}: {exc}")
                self.observe("prepare", time.monotonic() - start, False)
            log.error("cannot write the checkpoint %s: %s", self.checkpoint_path, exc,
                      extra={"fields": {"node": self.node}})
            return
        for uid, (ref, prepared, start) in new.items():
            out[uid] = Outcome(prepared.devices)
            self.observe("prepare", time.monotonic() - start, True)
            log.info("prepared claim %s: %s", ref, ", ".join(f"{d.device} (share {d.share_id or 'whole'})"
                                                             for d in prepared.devices),
                     extra={"fields": {"node": self.node, "namespace": ref.namespace, "claim": ref.name,
                                       "claim_uid": ref.uid}})

    def _prepare_one(self, ref: ClaimRef, claim: object, conflict: str) -> tuple[Outcome, PreparedClaim | None]:
        """(the answer, the claim to add to the checkpoint: None when it is there already or failed)."""
        done = self.prepared.get(ref.uid)
        if done is not None:
            return Outcome(done.devices), None
        try:
            cdi.check_uid(ref.uid)
            why_not = self.serving()
            if why_not:
                raise ClaimError(f"claim {ref}: this node does not serve DRA now ({why_not})")
            if isinstance(claim, BaseException):
                raise ClaimError(f"claim {ref}: cannot read it from the apiserver: "
                                 f"{getattr(claim, 'reason', None) or claim}")
            if conflict:
                raise ClaimError(conflict)
            return Outcome(), self._write(ref, claim)
        except (ClaimError, ValueError, OSError) as exc:
            log.warning("cannot prepare: %s", exc, extra={"fields": {
                "node": self.node, "namespace": ref.namespace, "claim": ref.name, "claim_uid": ref.uid}})
            return Outcome(error=str(exc)), None

    def _write(self, ref: ClaimRef, claim: object) -> PreparedClaim:
        """One CDI device (and one shim directory) per request of the claim: a container that names a request gets
        that request's GPUs and budget; one that takes the whole claim gets them all (ConflictCheck refuses a
        container that would get two). Only the first result of a request names its CDI device, so that the
        kubelet hands it to a container once."""
        shares = shares_of(claim, ref, self.node, self.devices)
        by_request: dict[str, list[Share]] = {}
        for s in shares:
            by_request.setdefault(s.base_request, []).append(s)
        specs, devices, shim_dirs, share_gpus = [], [], [], []
        for i, (request, group) in enumerate(sorted(by_request.items())):
            per_gpu = budgets(group, ref)
            limits = claim_limits(per_gpu)
            mounts: list[MountSpec] = []
            if limits is not None and self.shim is not None:
                shim_dir = shim_dir_name(ref.uid, i)
                owner = Owner(devices=tuple(s.share_id for s in group if s.share_id), namespace=ref.namespace,
                              pod=ref.name, container=request)
                mounts = list(prepare_container(self.shim, shim_dir, limits, owner=owner, fresh=True))
                shim_dirs.append(shim_dir)
            name = cdi_name(ref.uid, i)
            specs.append(cdi.device_spec(name, per_gpu, mounts))
            share_gpus += [b.gpu.uuid for b in per_gpu if not b.whole]
            for n, s in enumerate(group):
                ids = (cdi.device_id(name),) if n == 0 else ()
                devices.append(PreparedDevice((request,), s.pool, s.device, s.share_id, ids))
        cdi.write_spec(cdi.spec_path(self.cdi_dir, ref.uid), cdi.build_spec(specs))
        return PreparedClaim(ref.namespace, ref.name, tuple(devices), ",".join(shim_dirs),
                             tuple(dict.fromkeys(share_gpus)))

    # ---- unprepare ------------------------------------------------------------------------------------------

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        """Every claim of one NodeUnprepareResources call: UID -> error ("" when done). Files first, then the
        checkpoint once: a claim killed half-way is unprepared again, never forgotten with its files left."""
        out, starts = {}, {}
        for ref in refs:
            starts[ref.uid] = time.monotonic()
            out[ref.uid] = self._remove_files(ref)
        done = [r for r in refs if not out[r.uid] and r.uid in self.prepared]
        if done:
            try:
                with self._lock:
                    for ref in done:
                        self.prepared.pop(ref.uid, None)
                    self._save()
            except OSError as exc:
                for ref in done:
                    out[ref.uid] = f"claim {ref}: cannot write the checkpoint {self.checkpoint_path}: {exc}"
            for ref in done:
                if not out[ref.uid]:
                    log.info("unprepared claim %s", ref, extra={"fields": {
                        "node": self.node, "namespace": ref.namespace, "claim": ref.name, "claim_uid": ref.uid}})
        for ref in refs:
            self.observe("unprepare", time.monotonic() - starts[ref.uid], not out[ref.uid])
        return out

    def _remove_files(self, ref: ClaimRef) -> str:
        try:
            cdi.remove_spec(cdi.spec_path(self.cdi_dir, ref.uid))
            if self.shim is not None:
                root = container_dir(self.shim, shim_dir_name(ref.uid, 0)).parent
                for cdir in root.glob(f"claim-{cdi.check_uid(ref.uid)}-*"):
                    if cdir.is_symlink() or not cdir.is_dir():
                        cdir.unlink()
                    else:
                        shutil.rmtree(cdir)
        except (ValueError, OSError) as exc:
            log.warning("cannot unprepare claim %s: %s", ref, exc, extra={"fields": {
                "node": self.node, "namespace": ref.namespace, "claim": ref.name, "claim_uid": ref.uid}})
            return f"claim {ref}: cannot unprepare: {exc}"
        return ""

    def _save(self) -> None:
        ckpt.save(self.checkpoint_path, self.prepared)

    def held(self) -> int:
        """How many claims are prepared (a relabel waits for 0)."""
        return len(self.prepared)
