"""GPU health that outlives the daemon: a small JSON file of unhealthy GPUs, and the operator's reset markers.

`<state-dir>/gpu-health.json` (written atomically: temporary file, fsync, rename) records every unhealthy GPU
by UUID with its XID, reason, time, whether it needs a reset, and the boot it was seen in:

    {"version": 1, "gpus": {"GPU-...": {"xid": 48, "reason": "...", "since": "2026-11-23T07:50:00+00:00",
                                        "needs_reset": true, "boot_id": "..."}}}

`<state-dir>/reset-done/<UUID>` is the operator's word that a GPU which needed a reset was reset (or that the
node's GPU in that slot was replaced): the health watcher consumes it. An unreadable or corrupt state file is
never fatal: a warning names it and says what to do, and the daemon starts with no saved state.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from devplugin.atomic_file import write_atomically

log = logging.getLogger(__name__)

STATE_FILE = "gpu-health.json"
RESET_DIR = "reset-done"
FORMAT_VERSION = 1
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def current_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot (changes at every reboot; the host's, also inside a container)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class Fault:
    """Why a GPU is unhealthy. needs_reset: only a GPU reset (or a reboot, or replacing it) clears it."""

    xid: int | None
    reason: str
    since: str  # ISO 8601, UTC
    needs_reset: bool
    boot_id: str

    @staticmethod
    def now(xid: int | None, reason: str, needs_reset: bool, boot_id: str) -> Fault:
        return Fault(xid, reason, datetime.now(timezone.utc).isoformat(timespec="seconds"), needs_reset, boot_id)


class CorruptState(ValueError):
    """The state file is not what this module writes."""


def _parse(text: str) -> dict[str, Fault]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise CorruptState(f"not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT_VERSION or not isinstance(doc.get("gpus"), dict):
        raise CorruptState(f'expected {{"version": {FORMAT_VERSION}, "gpus": {{...}}}}')
    faults: dict[str, Fault] = {}
    for uuid, entry in doc["gpus"].items():
        if not isinstance(entry, dict):
            raise CorruptState(f"entry for {uuid!r} is not an object")
        xid, reason, since = entry.get("xid"), entry.get("reason"), entry.get("since")
        needs_reset, boot_id = entry.get("needs_reset"), entry.get("boot_id", "")
        if not uuid.startswith(("GPU-", "MIG-")):
            raise CorruptState(f"{uuid!r} is not a GPU UUID")
        if not (xid is None or (isinstance(xid, int) and not isinstance(xid, bool))):
            raise CorruptState(f"xid of {uuid} is {xid!r}, not an integer or null")
        if not isinstance(reason, str) or not isinstance(needs_reset, bool) or not isinstance(boot_id, str):
            raise CorruptState(f"entry for {uuid} needs a string reason, a boolean needs_reset and a string boot_id")
        try:
            datetime.fromisoformat(str(since))
        except ValueError:
            raise CorruptState(f"since of {uuid} is {since!r}, not an ISO 8601 time") from None
        faults[uuid] = Fault(xid, reason, str(since), needs_reset, boot_id)
    return faults


class HealthStore:
    """The state file and reset markers under one directory (--state-dir)."""

    def __init__(self, directory: Path | str, boot_id: str | None = None) -> None:
        self.directory = Path(directory)
        self.path = self.directory / STATE_FILE
        self.boot_id = current_boot_id() if boot_id is None else boot_id
        self._save_failed = False

    def load(self) -> dict[str, Fault]:
        """The saved faults by GPU UUID; {} (with a warning) when the file is unreadable or corrupt."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except (OSError, UnicodeDecodeError) as err:
            log.warning("cannot read the saved GPU health %s (%s): starting with no saved state; make it readable "
                        "or delete it", self.path, err, extra={"fields": {"path": str(self.path)}})
            return {}
        try:
            return _parse(text)
        except CorruptState as err:
            log.warning("the saved GPU health %s is corrupt (%s): starting with no saved state. Delete the file or "
                        "fix it; it is rewritten at the next health change", self.path, err,
                        extra={"fields": {"path": str(self.path)}})
            return {}

    def save(self, faults: Mapping[str, Fault]) -> bool:
        """Replace the file atomically with these faults; False (with a warning, once) when it cannot be written."""
        doc = {"version": FORMAT_VERSION, "gpus": {uuid: asdict(f) for uuid, f in sorted(faults.items())}}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # 0600: the daemon's own record, for no one else to read
            write_atomically(self.path, json.dumps(doc, indent=1) + "\n", mode=0o600, sync_dir=True)
        except OSError as err:
            level = logging.DEBUG if self._save_failed else logging.WARNING
            self._save_failed = True
            log.log(level, "cannot save GPU health to %s (%s): GPU health will not survive a daemon restart; make "
                    "--state-dir writable (a hostPath volume in the DaemonSet)", self.path, err,
                    extra={"fields": {"path": str(self.path)}})
            return False
        self._save_failed = False
        return True

    def reset_marker(self, uuid: str) -> Path:
        """The file an operator creates once the GPU was reset: `touch <state-dir>/reset-done/<UUID>`."""
        return self.directory / RESET_DIR / uuid

    def take_reset_marker(self, uuid: str) -> bool:
        """True when the operator marked the GPU reset; the marker is removed (each marker counts once)."""
        marker = self.reset_marker(uuid)
        try:
            marker.unlink()
        except FileNotFoundError:
            return False
        except OSError as err:  # there but not removable: honour it, say why it stays
            log.warning("cannot remove the reset marker %s (%s); remove it by hand", marker, err)
        return True
