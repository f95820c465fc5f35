"""GPUSHARE_REAL_LIBCUDA and GPUSHARE_REAL_LIBNVML name the fake drivers the tests run on. The library as shipped
ignores them: a process of a container could otherwise point the shim at a driver of its choosing (an NVML that
reports no use, and the compute share would never be held). Only the tests' build (build/shim/test) honours them."""

from __future__ import annotations

from tests.support.shim_probe import FAKE_CUDA, SHIM, SHIPPED_SHIM, GiB, run_full
from tests.support.shim_probe import node as node  # the fixture

NOWHERE = {"GPUSHARE_REAL_LIBCUDA": "/nonexistent/libcuda.so.1",
           "GPUSHARE_REAL_LIBNVML": "/nonexistent/libnvidia-ml.so.1"}


def env(node, library):
    # The node's driver, found by its soname as in a container (here the fake one, through LD_LIBRARY_PATH), and
    # the two settings pointing elsewhere.
    return node.env(CUDA_DEVICE_MEMORY_LIMIT="1g", LD_PRELOAD=str(library), LD_LIBRARY_PATH=str(FAKE_CUDA.parent),
                    **NOWHERE)


def test_the_shipped_library_ignores_the_settings_and_uses_the_nodes_driver(node):
    result = run_full(env(node, SHIPPED_SHIM), "init", "ctx", 0, "fill", "alloc", "256m", "nvml", 0)
    assert result.step("init")["rc"] == 0
    assert result.step("fill")["bytes"] == GiB  # the limit holds, on the driver the node provides
    assert result.step("nvml")["used"] == GiB  # and NVML's view is the shim's, over the node's NVML
    for name in NOWHERE:
        assert f"{name} is honoured only by the shim's test build; ignored" in result.stderr


def test_the_test_build_loads_what_the_settings_name(node):
    result = run_full(env(node, SHIM), "lookup", "cuMemAlloc", 12080)
    assert result.step("lookup")["found"] is False  # no driver at the path named: nothing to hand out
    assert "cannot load /nonexistent/libcuda.so.1" in result.stderr
