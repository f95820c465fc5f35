"""The test cluster's images: no registry can be reached, so each image a pod may name is a root filesystem on this
machine plus the image's config (ENV, WORKDIR, ENTRYPOINT, CMD), listed in an image table the node agents read
(`--images`, e2e/internal/images).

The images are made from this machine's own system, without copying it: a small root (the directory skeleton,
`bin -> usr/bin` and the other links of a merged-/usr Debian, a copy of /etc), with this machine's /usr as a layer
each container sees through a copy-on-write overlay of its own (so that a container runtime, or the NVIDIA toolkit,
can mount files beneath it), and read-only layers for the Python the project's venv is built on, the venv itself
(CuPy, pynvml, NVIDIA's CUDA runtime wheels) and the test tools (the CUDA runtime probe, the workload probe).

- `gpushare.test/cuda:13.0`: a CUDA base image, as NVIDIA's are: `NVIDIA_VISIBLE_DEVICES=all`,
  `NVIDIA_DRIVER_CAPABILITIES=compute,utility`, `CUDA_VERSION`, `NVIDIA_REQUIRE_CUDA`; runs `sleep infinity`;
- `gpushare.test/workload:1`: the same, running the workload probe (prints its view, then waits);
- `gpushare.test/plain:1`: a Python image without NVIDIA's ENV; runs `sleep infinity`;
- `gpushare.test/ray:2.60.0`: Ray 2.60.0 with its dashboard and autoscaler and CuPy (the venv `make ray-venv` makes,
  `.venv-ray`), with the ENV of Ray's GPU images (NVIDIA's, Ray's Python first on PATH, TZ, LC_ALL, LANG), for the
  KubeRay tests; listed only once that venv exists.

A reference the table does not hold fails the container with ErrImagePull, as a kubelet shows a failed pull.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CUDA_IMAGE = "gpushare.test/cuda:13.0"
WORKLOAD_IMAGE = "gpushare.test/workload:1"
PLAIN_IMAGE = "gpushare.test/plain:1"
RAY_IMAGE = "gpushare.test/ray:2.60.0"
RAY_VENV = REPO / ".venv-ray"
TOOLS_IN_IMAGE = "/opt/gpushare-test"
VENV = REPO / ".venv"
PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What NVIDIA's CUDA 13.0 base images set (nvidia/cuda:13.0.0-base-ubuntu24.04's ENV).
NVIDIA_ENV = ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", "CUDA_VERSION=13.0.0",
              "NVIDIA_REQUIRE_CUDA=cuda>=13.0"]


def python_home() -> Path:
    """The Python installation the venv's interpreter links to (its `home` in pyvenv.cfg)."""
    for line in (VENV / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    return Path(sys.base_prefix)


def _skeleton(root: Path) -> None:
    """A merged-/usr root: the top directories, the links into /usr, and a copy of this machine's /etc."""
    for d in ("dev", "proc", "sys", "tmp", "run", "root", "var/tmp", "var/run", "home", "opt", "usr", "mnt", "srv"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    for link in ("bin", "sbin", "lib", "lib64"):
        target = Path("/") / link
        if target.is_symlink():
            (root / link).symlink_to(os.readlink(target))
    shutil.copytree("/etc", root / "etc", symlinks=True, ignore_dangling_symlinks=True,
                    ignore=shutil.ignore_patterns("ld.so.preload", "hostname", "mtab"))


def build(directory: Path, tools: dict[str, Path]) -> Path:
    """Make the images under `directory` and write their table; returns the table's path. `tools` are files put
    in every image's test-tools directory (name -> file on this machine)."""
    root = directory / "rootfs"
    if not (root / "etc").exists():
        _skeleton(root)
    tools_dir = directory / "tools"
    tools_dir.mkdir(parents=True, exist_ok=True)
    for name, src in tools.items():
        shutil.copy2(src, tools_dir / name)
    py = python_home()
    layers: list[dict[str, Any]] = [
        {"source": "/usr", "destination": "/usr", "writable": True},
        {"source": str(py), "destination": str(py)},
        {"source": str(VENV), "destination": str(VENV)},
        {"source": str(tools_dir), "destination": TOOLS_IN_IMAGE},
    ]
    base = {"rootfs": str(root), "layers": layers, "workingDir": "/"}
    env = [f"PATH={PATH}", f"GPUSHARE_TEST_TOOLS={TOOLS_IN_IMAGE}"]
    table = {"images": {
        CUDA_IMAGE: {**base, "env": [*env, *NVIDIA_ENV], "cmd": ["sleep", "infinity"], "id": "sha256:cuda-13.0"},
        WORKLOAD_IMAGE: {**base, "env": [*env, *NVIDIA_ENV], "entrypoint": ["python", f"{TOOLS_IN_IMAGE}/probe.py"],
                         "id": "sha256:workload-1"},
        PLAIN_IMAGE: {**base, "env": env, "cmd": ["sleep", "infinity"], "id": "sha256:plain-1"},
    }}
    if (RAY_VENV / "bin" / "ray").exists():
        table["images"][RAY_IMAGE] = ray_image(root, tools_dir)
    path = directory / "images.json"
    path.write_text(json.dumps(table, indent=1))
    return path


def ray_image(root: Path, tools_dir: Path) -> dict[str, Any]:
    """The Ray image's entry: this machine's /usr, Ray's venv and the Python it was made from, the test tools; the
    ENV of Ray's GPU images (rayproject/ray:*-gpu: NVIDIA's CUDA base ENV, Ray's Python first on PATH, TZ, LC_ALL,
    LANG). It runs as root where Ray's images run as their user `ray`; its working directory is /."""
    home = Path(sys.base_prefix)
    for line in (RAY_VENV / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            home = Path(value.strip()).parent
    layers: list[dict[str, Any]] = [
        {"source": "/usr", "destination": "/usr", "writable": True},
        {"source": str(home), "destination": str(home)},
        {"source": str(RAY_VENV), "destination": str(RAY_VENV)},
        {"source": str(tools_dir), "destination": TOOLS_IN_IMAGE},
    ]
    env = [f"PATH={RAY_VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "TZ=America/Los_Angeles", "LC_ALL=C.UTF-8", "LANG=C.UTF-8", f"GPUSHARE_TEST_TOOLS={TOOLS_IN_IMAGE}",
           *NVIDIA_ENV]
    return {"rootfs": str(root), "layers": layers, "workingDir": "/", "env": env, "cmd": ["sleep", "infinity"],
            "id": "sha256:ray-2.60.0"}


def default_tools() -> dict[str, Path]:
    """The workload probe, the CuPy probe and the CUDA runtime probe (built against static cudart)."""
    from tests.support.cuda_runtime import runtime_probe

    return {"probe.py": Path(__file__).parent / "workload" / "probe.py",
            "cupy_probe.py": REPO / "tests" / "cuda" / "cupy_probe.py",
            "rt_probe_static": runtime_probe("static")}
