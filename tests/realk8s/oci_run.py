"""One command of an image-table image run under runc, as the node agent runs a container (e2e/internal/oci): the
container's root an overlay whose lower layer is the image's rootfs (so the image's files are never written), a
minimal OCI spec (proc, dev, sys; its own PID, IPC, UTS, mount and network namespaces; no cgroup resources), the
user, capabilities, read-only root and bind mounts a container's securityContext and volumes give it. Needs root
and runc."""

from __future__ import annotations

import json
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# runc's default capabilities (`runc spec`), a container's when its securityContext drops none.
DEFAULT_CAPS = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]


@dataclass
class Run:
    args: list[str]
    uid: int = 0
    gid: int = 0
    read_only_root: bool = False
    capabilities: list[str] = field(default_factory=lambda: list(DEFAULT_CAPS))
    binds: dict[str, Path] = field(default_factory=dict)  # container path -> directory of this machine
    env: list[str] = field(default_factory=list)  # on top of the image's


def spec(image: dict[str, Any], run: Run, root: Path) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]
    mounts += [{"destination": dest, "type": "bind", "source": str(src), "options": ["rbind", "rw"]}
               for dest, src in run.binds.items()]
    caps = run.capabilities
    return {
        "ociVersion": "1.0.2",
        "root": {"path": str(root), "readonly": run.read_only_root},
        "process": {
            "args": run.args, "env": [*image.get("env", []), *run.env], "cwd": image.get("workingDir") or "/",
            "user": {"uid": run.uid, "gid": run.gid},
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "noNewPrivileges": True,
        },
        "hostname": "image-check",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def run_in_image(image: dict[str, Any], run: Run, workdir: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `run.args` in a container of `image` (an image-table entry); returns runc's completed process (the
    command's exit status, stdout and stderr). `workdir` holds the bundle, the overlay's upper layer and runc's
    state, and is left for the caller to remove."""
    bundle = workdir / "bundle"
    upper, work, merged, state = workdir / "upper", workdir / "work", bundle / "rootfs", workdir / "runc"
    for d in (upper, work, merged, state):
        d.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={image['rootfs']},upperdir={upper},workdir={work}", str(merged)],
                   check=True, capture_output=True, timeout=60)
    name = f"image-check-{uuid.uuid4().hex[:8]}"
    try:
        (bundle / "config.json").write_text(json.dumps(spec(image, run, merged), indent=1))
        return subprocess.run(["runc", "--root", str(state), "run", "--no-pivot", "--bundle", str(bundle), name],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    finally:
        subprocess.run(["runc", "--root", str(state), "delete", "--force", name], capture_output=True, timeout=60)
        subprocess.run(["umount", str(merged)], capture_output=True, timeout=60)
