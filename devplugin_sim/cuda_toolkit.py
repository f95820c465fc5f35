"""NVIDIA's CUDA toolkit from PyPI (nvidia-cuda-nvcc, -crt, nvidia-nvvm, nvidia-cuda-runtime: the `test` extra pins
them), for building runtime programs that the tests and benchmarks run over the fake driver. No system CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CUDA_DIR = (Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
            / "nvidia" / "cu13")
NVCC = CUDA_DIR / "bin" / "nvcc"
CUDART_LIB = CUDA_DIR / "lib"


class ToolkitError(RuntimeError):
    """nvcc is missing or failed; the message says what to do."""


def build(source: Path, out: Path, cudart: str) -> Path:
    """`source` compiled for sm_80 and linked with `static` or `shared` cudart into `out` (skipped when `out` is
    newer than `source`)."""
    if cudart not in ("static", "shared"):
        raise ValueError(f"cudart is static or shared, not {cudart!r}")
    if not NVCC.exists():
        raise ToolkitError(f"nvcc is not installed at {NVCC}: run `make all` (the test extra installs "
                           "nvidia-cuda-nvcc)")
    if out.exists() and out.stat().st_mtime >= source.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    link = out.parent / "link"  # the wheel ships libcudart.so.13 without the libcudart.so that -lcudart needs
    link.mkdir(exist_ok=True)
    if not (link / "libcudart.so").exists():
        (link / "libcudart.so").unlink(missing_ok=True)
        (link / "libcudart.so").symlink_to(CUDART_LIB / "libcudart.so.13")
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    cmd = [str(NVCC), "-arch=sm_80", f"-cudart={cudart}", f"-L{link}", f"-L{CUDART_LIB}",
           f"-Xlinker=-rpath={CUDART_LIB}", "-o", str(tmp), str(source)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise ToolkitError(f"nvcc failed: {' '.join(cmd)}\n{proc.stderr}")
    tmp.replace(out)
    return out
