"""What this plugin prepared, in an atomic JSON file under the plugin directory, so that a restarted plugin (even
after SIGKILL) answers NodePrepareResources the same and unprepares what it prepared before.

    {"version": 1, "claims": {"<claim UID>": {"namespace": "...", "name": "...", "shim_dir": "claim-<UID>-0,..." or "",
     "devices": [{"request_names": [...], "pool": "...", "device": "gpu-0", "share_id": "...",
                  "cdi_device_ids": ["gpushare.io/gpu=<UID>"]}], "share_gpus": ["GPU-..."]}}}
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devplugin.atomic_file import write_atomically

log = logging.getLogger(__name__)

VERSION = 1
FILE = "checkpoint.json"


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: str
    share_id: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PreparedClaim:
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    shim_dir: str = ""  # the alloc ids of the claim's shim directories (one per request), comma-separated
    share_gpus: tuple[str, ...] = field(default=())  # GPU UUIDs the claim holds shares of


class CheckpointError(ValueError):
    """The checkpoint file is not one this plugin wrote."""


def _claim(doc: object) -> PreparedClaim:
    if not isinstance(doc, dict):
        raise CheckpointError("a claim entry is not an object")
    devices = tuple(PreparedDevice(tuple(d["request_names"]), str(d["pool"]), str(d["device"]), str(d["share_id"]),
                                   tuple(d["cdi_device_ids"])) for d in doc["devices"])
    return PreparedClaim(str(doc["namespace"]), str(doc["name"]), devices, str(doc.get("shim_dir", "")),
                         tuple(doc.get("share_gpus", ())))


def load(path: Path) -> dict[str, PreparedClaim]:
    """The prepared claims by UID; {} when there is no file. CheckpointError when it is corrupt (the caller says
    what to do: a plugin that cannot read what it prepared must not pretend nothing was)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
            raise CheckpointError(f'expected {{"version": {VERSION}, "claims": {{...}}}}')
        return {str(uid): _claim(c) for uid, c in doc["claims"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc})") from None


def save(path: Path, claims: dict[str, PreparedClaim]) -> None:
    """Replace the file atomically (temporary file, fsync, rename, fsync of the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"version": VERSION, "claims": {uid: asdict(c) for uid, c in sorted(claims.items())}}
    write_atomically(path, json.dumps(doc, indent=1), mode=0o600, sync_dir=True)
