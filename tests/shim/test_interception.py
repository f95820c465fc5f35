"""How the shim sits between programs and the driver: what it exports, that its dlsym keeps RTLD_NEXT semantics,
and that it loads in containers with an older glibc."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.shim_probe import SHIM, SHIPPED_SHIM, TESTS, make_node, require_built, run

HOOKED = {
    "cuInit", "cuGetProcAddress", "cuGetProcAddress_v2", "cuDevicePrimaryCtxRetain", "cuCtxCreate_v2",
    "cuCtxCreate_v3", "cuCtxCreate_v4", "cuMemAlloc_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemFree_v2",
    "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
    "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemPoolCreate", "cuMemPoolDestroy", "cuMemCreate", "cuMemRelease",
    "cuMemGetInfo_v2", "cuDeviceTotalMem_v2", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz", "cuGraphLaunch",
    "cuGraphLaunch_ptsz", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2", "dlsym",
    "gpushare_throttle_stats", "gpushare_share_stats",
    # every other way to take device memory
    "cuMemAlloc", "cuMemAllocPitch", "cuMemFree", "cuArrayCreate_v2", "cuArray3DCreate_v2", "cuArrayCreate",
    "cuArray3DCreate", "cuArrayDestroy",
    "cuMipmappedArrayCreate",
    "cuMipmappedArrayDestroy", "cuIpcOpenMemHandle", "cuIpcOpenMemHandle_v2", "cuIpcCloseMemHandle", "cuModuleLoad",
    "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuModuleUnload", "cuGraphAddMemAllocNode",
    "cuGraphAddNode", "cuGraphAddNode_v2", "cuLibraryLoadData", "cuLibraryLoadFromFile", "cuLibraryUnload",
    # what keeps memory taken: VMM mappings and handle references, shared allocations, what pools keep, and the
    # context limits that reserve memory
    "cuMemMap", "cuMemUnmap", "cuMemRetainAllocationHandle", "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle", "cuMemPoolSetAttribute", "cuMemPoolTrimTo", "cuDeviceSetMemPool", "cuCtxSetLimit",
    # the runtime's private way to the primary context (slot 2 of one export table, gs_export.c)
    "cuGetExportTable",
}
BUILDS = pytest.mark.parametrize("library", [SHIPPED_SHIM, SHIM], ids=["shipped", "test-build"])


def dynamic_symbols(library: Path) -> str:
    require_built()
    if not shutil.which("objdump"):
        pytest.skip("objdump (binutils) is not installed")
    return subprocess.run(["objdump", "-T", str(library)], capture_output=True, text=True, check=True).stdout


@BUILDS
def test_the_library_exports_its_hooks_and_nothing_else(library):
    exported = {line.split()[-1] for line in dynamic_symbols(library).splitlines()
                if " g " in line and ".text" in line}
    assert exported == HOOKED


@BUILDS
def test_the_library_needs_nothing_newer_than_glibc_2_17(library):
    versions = set(re.findall(r"\(GLIBC_([0-9.]+)\)", dynamic_symbols(library)))
    newest = max(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
    assert tuple(int(x) for x in newest.split(".")) <= (2, 17), versions


def test_dlsym_keeps_rtld_next_relative_to_its_caller():
    require_built()
    env = {"LD_PRELOAD": f"{SHIM}:{TESTS / 'gs_next_a.so'}"}
    out = subprocess.run([str(TESTS / "gs_next_user")], env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == ["A", "B"], out.stderr


def test_entry_points_the_shim_does_not_hook_come_straight_from_the_driver(tmp_path):
    node = make_node(tmp_path)
    # cuCtxSetCurrent and cuDeviceGetCount are not hooked: the probe works the same through every door.
    for mode in ("gpa", "gpa-ptsz", "dlsym", "linked"):
        steps = run(node.env(CUDA_DEVICE_MEMORY_LIMIT="1g"), "init", "ctx", 1, mode=mode)
        assert [s["rc"] for s in steps] == [0, 0] and steps[0]["devices"] == 2
