"""Stream-ordered pools keep freed memory (still taken on the GPU) up to their release threshold, and reuse it. The
shim charges what a pool keeps, so several pools that each keep everything cannot hold more than the container's
cap between them; trimming, a lower threshold and destroying the pool give it back. The fake driver keeps the same
memory, so each test compares the shim's view with what the (fake) GPU holds."""

from __future__ import annotations

from tests.shim.vmm_probe import KEEP_ALL, finish, held
from tests.support.shim_probe import CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS, MiB
from tests.support.shim_probe import node as node  # the fixture

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}


def rcs(steps: list[dict], op: str) -> list[int]:
    return [s["rc"] for s in steps if s["op"] == op]


def views(steps: list[dict]) -> list[int]:
    return [s["used"] for s in steps if s["op"] == "meminfo"]


def test_two_pools_that_keep_everything_share_one_cap(node):
    # Before, each pool could keep up to the cap after its frees: two pools held 1.5 GiB under a 1 GiB cap.
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "pool", KEEP_ALL, "palloc", 0, "768m", "afree", 0,
                       "sync", "meminfo", "pool", KEEP_ALL, "palloc", 1, "768m", "palloc", 0, "768m", "meminfo")
    try:
        assert rcs(steps, "palloc") == [CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS]  # the first reuses
        assert views(steps) == [768 * MiB, 768 * MiB]
        assert node.driver.memory_used(0) == 768 * MiB
    finally:
        finish(proc)


def test_trimming_and_destroying_a_pool_give_its_memory_back(node):
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "pool", KEEP_ALL, "pool", KEEP_ALL,
                       "palloc", 0, "768m", "afree", 0, "sync", "trim", 0, "256m", "meminfo", "reserved", 0,
                       "palloc", 1, "768m", "afree", 1, "sync", "pdestroy", 1, "meminfo")
    try:
        assert rcs(steps, "palloc") == [CUDA_SUCCESS, CUDA_SUCCESS]
        assert views(steps) == [256 * MiB, 256 * MiB]  # the pool trimmed to 256 MiB keeps that, the other none
        assert steps[[s["op"] for s in steps].index("reserved")]["reserved"] == 256 * MiB
        assert node.driver.memory_used(0) == 256 * MiB
    finally:
        finish(proc)


def test_a_pool_keeps_what_its_release_threshold_allows(node):
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "pool", "256m", "palloc", 0, "768m", "afree", 0,
                       "sync", "meminfo", "pool", "0", "palloc", 1, "768m", "palloc", 1, "2m", "meminfo")
    try:
        assert rcs(steps, "palloc") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert views(steps) == [256 * MiB, 1024 * MiB]
        assert node.driver.memory_used(0) == 1024 * MiB
    finally:
        finish(proc)


def test_the_default_pool_and_a_pool_made_current_are_counted(node):
    # cuMemAllocAsync takes from the device's current pool: the default one, or one set with cuDeviceSetMemPool.
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "defaultpool", KEEP_ALL, "async", "512m", "afree", 0,
                       "sync", "pool", KEEP_ALL, "setpool", 1, "async", "512m", "afree", 1, "sync", "meminfo",
                       "palloc", 0, "512m", "async", "512m", "async", "2m", "meminfo")
    try:
        assert rcs(steps, "async") == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_OUT_OF_MEMORY]
        assert rcs(steps, "palloc") == [CUDA_SUCCESS]  # from the default pool's kept memory
        assert views(steps) == [1024 * MiB, 1024 * MiB]
        assert node.driver.memory_used(0) == 1024 * MiB
    finally:
        finish(proc)


def test_lowering_the_threshold_gives_back_what_the_pool_no_longer_keeps(node):
    proc, steps = held(node.env(**LIMIT), "init", "ctx", 0, "pool", KEEP_ALL, "palloc", 0, "768m", "afree", 0,
                       "sync", "pool", "0", "setthreshold", 0, "0", "palloc", 1, "768m", "meminfo")
    try:
        assert rcs(steps, "palloc") == [CUDA_SUCCESS, CUDA_SUCCESS]
        assert views(steps) == [768 * MiB]
        assert node.driver.memory_used(0) == 768 * MiB
    finally:
        finish(proc)
