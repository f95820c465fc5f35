"""VMM memory (cuMemCreate) is charged for as long as the driver keeps it: while a handle reference or a mapping of it
exists, not only until cuMemRelease. NVIDIA's own VMM sample releases the handle right after mapping; the memory
is freed at the last unmap. The fake driver frees it at the last reference too, so each test compares the shim's
view with what the (fake) GPU holds."""

from __future__ import annotations

import pytest

from tests.shim.vmm_probe import finish, held, run, start
from tests.support.shim_probe import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MiB, until
from tests.support.shim_probe import node as node  # the fixture

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}
MODES = ["gpa", "dlsym"]


def used(step: dict) -> int:
    return step["used"]


@pytest.mark.parametrize("mode", MODES)
def test_memory_released_while_mapped_stays_charged_until_unmapped(node, mode):
    # The VMM sample's pattern: create, map, release the handle at once, use the mapping. Before, each release gave
    # the charge back: under a 1 GiB limit a program mapped 4 GiB while the shim showed nothing in use.
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0,
                       "create", "512m", "map", 0, "release", 0,
                       "create", "512m", "map", 1, "release", 1,
                       "create", "512m", "meminfo", mode=mode)
    try:
        creates = [s["rc"] for s in steps if s["op"] == "create"]
        assert creates == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert [s["rc"] for s in steps if s["op"] in ("map", "release")] == [CUDA_SUCCESS] * 4
        assert used(steps[-2]) == 1024 * MiB == node.driver.memory_used(0)
    finally:
        finish(proc)


def test_the_last_unmap_gives_the_charge_back(node):
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "create", "512m", "map", 0, "map", 0, "release", 0,
                       "unmap", 0, "meminfo", "unmap", 1, "meminfo", "create", "1g", "meminfo")
    try:
        first, second, third = [s for s in steps if s["op"] == "meminfo"]
        assert used(first) == 512 * MiB  # one of its two mappings is still there
        assert used(second) == 0
        assert [s["rc"] for s in steps if s["op"] == "create"] == [CUDA_SUCCESS, CUDA_SUCCESS]
        assert used(third) == 1024 * MiB == node.driver.memory_used(0)
    finally:
        finish(proc)


def test_unmapping_a_run_of_pages_in_one_call_gives_each_back(node):
    # PyTorch's expandable segments map page after page into one reserved range and unmap a run of them at once.
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, *("create", "256m") * 4,
                       "reserve", 0, "1g", "mapnext", 1, 0, "mapnext", 2, 1, "mapnext", 3, 2,
                       "release", 0, "release", 1, "release", 2, "release", 3, "meminfo",
                       "unmap", 1, 3, "meminfo", "create", "768m")
    try:
        before, after = [s for s in steps if s["op"] == "meminfo"]
        assert used(before) == 1024 * MiB
        assert used(after) == 256 * MiB == node.driver.memory_used(0) - 768 * MiB
        assert steps[-2]["rc"] == CUDA_SUCCESS
    finally:
        finish(proc)


@pytest.mark.parametrize("mode", MODES)
def test_a_retained_handle_keeps_the_memory_charged(node, mode):
    # cuMemRetainAllocationHandle gives one more reference, to be released: the memory lives until it is.
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "create", "768m", "map", 0, "release", 0,
                       "retain", 0, "unmap", 0, "meminfo", "create", "512m", "release", 1, "meminfo",
                       "create", "512m", mode=mode)
    try:
        assert steps[5]["rc"] == CUDA_SUCCESS and steps[5]["value"] == steps[2]["value"]  # the same handle
        first, second = [s for s in steps if s["op"] == "meminfo"]
        assert used(first) == 768 * MiB
        creates = [s["rc"] for s in steps if s["op"] == "create"]
        assert creates == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]
        assert used(second) == 0
        assert node.driver.memory_used(0) == 512 * MiB
    finally:
        finish(proc)


def exporter(node, size: str, *, shim: bool, **settings: str):
    """A process that creates `size`, maps it, exports it as a file descriptor and waits: (process, pid, fd)."""
    proc = start(node.env(shim=shim, **settings), "init", "ctx", 0, "create", size, "map", 0, "export", 0, "ready")
    steps = until(proc, "ready")
    export = steps[-2]
    assert export["rc"] == CUDA_SUCCESS, steps
    return proc, export["pid"], export["fd"]


def test_memory_imported_from_another_process_is_charged_to_the_importer(node):
    # Another container (no shim here) shares 768 MiB by descriptor. Mapped into this container, it is memory the
    # container holds: it counts against its cap, and stays counted after the exporter is gone (the driver keeps
    # it for the importer).
    outside, pid, fd = exporter(node, "768m", shim=False)
    env = node.env(**LIMIT)
    proc = start(env, "init", "ctx", 0, "import", pid, fd, "768m", "map", 0, "meminfo", "create", "512m",
                 "ready", "meminfo", "create", "512m", "unmap", 0, "release", 0, "meminfo", "create", "1g")
    try:
        steps = until(proc, "ready")
        assert steps[2]["rc"] == CUDA_SUCCESS and steps[3]["rc"] == CUDA_SUCCESS
        assert used(steps[4]) == 768 * MiB
        assert steps[5]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
        finish(outside)  # the exporter lets go and ends: the importer still holds the memory
        assert node.driver.memory_used(0) == 768 * MiB
        proc.stdin.write("\n")
        proc.stdin.flush()
        rest = until(proc, "create") + until(proc, "create")
        first = [s for s in rest if s["op"] == "meminfo"][0]
        assert used(first) == 768 * MiB and rest[1]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
        assert used([s for s in rest if s["op"] == "meminfo"][1]) == 0
        assert rest[-1]["rc"] == CUDA_SUCCESS
    finally:
        finish(proc)
        if outside.poll() is None:
            finish(outside)


def test_an_exported_allocation_stays_charged_to_its_exporter_until_it_ends(node):
    # A shared descriptor keeps the memory alive wherever it went, and the shim cannot see it closed: once exported,
    # the allocation stays charged to the process that made it, released and unmapped or not, until that process
    # ends. Otherwise a process could export, release and keep the descriptors, holding memory outside its cap.
    env = node.env(**LIMIT)
    proc, pid, fd = exporter(node, "768m", shim=True, **LIMIT)
    try:
        proc.stdin.write("\n")
        proc.stdin.flush()
        finish(proc)
        # A second process of the container: the exporter has ended, its charge with it.
        steps = run(env, "init", "ctx", 0, "create", "1g").steps
        assert steps[-1]["rc"] == CUDA_SUCCESS
        inside = start(env, "init", "ctx", 0, "create", "768m", "map", 0, "export", 0, "unmap", 0, "release", 0,
                       "meminfo", "create", "512m", "ready")
        steps = until(inside, "ready")
        assert [s["rc"] for s in steps[2:7]] == [CUDA_SUCCESS] * 5
        assert used(steps[7]) == 768 * MiB and steps[8]["rc"] == CUDA_ERROR_OUT_OF_MEMORY
        finish(inside)
    finally:
        if proc.poll() is None:
            finish(proc)

