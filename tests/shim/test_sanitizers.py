"""The shim built with -O0 and AddressSanitizer + UndefinedBehaviorSanitizer (`make -C shim asan`), run through
its C test programs and a workout of every hook over the fake driver: no memory error, no undefined behaviour,
and the exported dlsym keeps RTLD_NEXT relative to its caller without any help from the optimiser. The plain
build's self-test runs here too."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.shim_probe import BUILD, REPO, TESTS, make_node, require_built

ASAN = BUILD / "shim" / "asan"
SANITIZER_ERRORS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")


def runtime(name: str) -> Path | None:
    out = subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True, text=True)
    path = Path(out.stdout.strip())
    return path if out.returncode == 0 and path.is_absolute() and path.exists() else None


@functools.cache
def asan_build() -> Path:
    """Build the sanitizer variant (once per test run); the preload list it needs (libasan first)."""
    require_built()
    libasan = runtime("libasan.so")
    if libasan is None:
        pytest.skip("the C compiler has no AddressSanitizer runtime (libasan)")
    out = subprocess.run(["make", "-s", "-C", str(REPO / "shim"), f"BUILD={BUILD / 'shim'}",
                          f"FAKES={BUILD / 'fakes'}", "asan"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return libasan


def sanitized_env(env: dict[str, str], preload: list[Path]) -> dict[str, str]:
    env = dict(env)
    env["LD_PRELOAD"] = ":".join(map(str, preload))
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:exitcode=99"
    env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1:exitcode=98"
    return env


def assert_clean(out: subprocess.CompletedProcess) -> None:
    found = [e for e in SANITIZER_ERRORS if e in out.stderr]
    assert not found and out.returncode == 0, out.stdout[-2000:] + out.stderr[-6000:]


def test_the_self_test_passes(tmp_path):
    node = make_node(tmp_path)
    out = subprocess.run([str(TESTS / "gs_selftest")], env=node.env(shim=False, CUDA_DEVICE_MEMORY_LIMIT="1g"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "FAIL" not in out.stdout, out.stdout + out.stderr
    assert out.stdout.count("ok ") == 8


def test_the_self_test_passes_under_sanitizers(tmp_path):
    asan_build()
    node = make_node(tmp_path)
    env = node.env(shim=False, CUDA_DEVICE_MEMORY_LIMIT="1g")
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    out = subprocess.run([str(ASAN / "tests" / "gs_selftest")], env=env, capture_output=True, text=True, timeout=120)
    assert_clean(out)
    assert "FAIL" not in out.stdout and out.stdout.count("ok ") == 8


def test_dlsym_keeps_rtld_next_relative_to_its_caller_at_o0():
    libasan = asan_build()
    env = sanitized_env({k: v for k, v in os.environ.items() if not k.startswith("LD_")},
                        [libasan, ASAN / "libgpushare.so", ASAN / "tests" / "gs_next_a.so"])
    out = subprocess.run([str(ASAN / "tests" / "gs_next_user")], env=env, capture_output=True, text=True, timeout=60)
    assert_clean(out)
    assert out.stdout.split() == ["A", "B"]


def test_every_hook_under_sanitizers(tmp_path):
    libasan = asan_build()
    node = make_node(tmp_path)
    env = sanitized_env(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", CUDA_DEVICE_SM_LIMIT=50,
                                 FAKE_CUDA_NS_PER_BLOCK=100), [libasan, ASAN / "libgpushare.so"])
    steps = ["init", "ctx", "0", "fill", "alloc", "128m", "freeall", "fill", "async", "128m", "freeall", "sync",
             "pitch", "1000", "100", "managed", "4m", "pool", "4m", "create", "4m", "alloc1", "4m",
             "array", "256", "256", "0x20", "4", "mipmap", "256", "256", "0", "0x20", "4", "5", "module", "4m",
             "graphnode", "4m", "meminfo", "totalmem", "0", "nvml", "0", "freeall", "launch", "200", "64",
             "launchex", "20", "64", "coop", "20", "64", "graph", "20", "nocontext", "alloc", "1m", "ctx", "1",
             "forkfill", "2", "alloc", "256m", "hammer", "4", "500", "8m", "stats", "0", "counters"]
    for mode in ("gpa", "dlsym"):
        out = subprocess.run([str(TESTS / "gs_probe"), mode, *steps], env=env, capture_output=True, text=True,
                             timeout=300)
        assert_clean(out)
        assert '"op":"counters"' in out.stdout


def test_the_memory_lifetime_hooks_under_sanitizers(tmp_path):
    # VMM references and mappings (a run of pages unmapped in one call), exported handles, pools that keep memory,
    # context limits: gs_vmm through both doors, under the sanitized library.
    libasan = asan_build()
    node = make_node(tmp_path)
    env = sanitized_env(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), [libasan, ASAN / "libgpushare.so"])
    steps = ["init", "ctx", "0", "create", "64m", "map", "0", "map", "0", "release", "0", "retain", "0",
             "unmap", "0", "unmap", "1", "release", "1", *["create", "32m"] * 3, "reserve", "2", "96m",
             "mapnext", "3", "2", "mapnext", "4", "3", "release", "2", "release", "3", "release", "4", "unmap", "2",
             "3", "create", "64m", "map", "5", "export", "5", "unmap", "5", "release", "5", "create", "2g",
             "pool", str(2**64 - 1), "palloc", "0", "256m", "afree", "0", "sync", "reserved", "0", "trim", "0",
             "64m", "setthreshold", "0", "0", "palloc", "0", "8m", "afree", "1", "pdestroy", "0", "defaultpool",
             "32m", "async", "64m", "afree", "2", "pool", "0", "setpool", "2", "async", "8m", "afree", "3", "sync",
             "setlimit", "0", "2k", "setlimit", "2", "64m", "setlimit", "0", "1k", "getlimit", "0", "meminfo",
             "counters"]
    for mode in ("gpa", "dlsym"):
        out = subprocess.run([str(TESTS / "gs_vmm"), mode, *steps], env=env, capture_output=True, text=True,
                             timeout=300)
        assert_clean(out)
        assert '"op":"counters"' in out.stdout
