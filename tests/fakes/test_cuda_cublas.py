"""What cuBLAS and cuBLASLt need of the fake libcuda beyond what the runtime needs (fakes/README.md, "What cuBLAS
asks of the driver"): the first-ABI names cuBLASLt looks up with dlsym, the context table (21318c60) and the JIT
linker. tests/cuda/test_cupy.py runs the GEMMs themselves."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys

import pytest

from tests.support.shim_probe import FAKE_CUDA, REPO, make_node

PROBE = REPO / "tests" / "fakes" / "cuda_tables_probe.py"
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_NOT_SUPPORTED = 801

# Looked up by name (dlsym on the driver's handle) when cuBLASLt makes its first handle; without any one of the
# first group its initialisation fails ("Driver API initialization failed", CUBLAS_STATUS_INTERNAL_ERROR). The
# second group is looked up too and tolerated when missing.
CUBLASLT_NEEDS = ["cuLinkCreate_v2", "cuLinkAddData_v2", "cuLinkComplete", "cuLinkDestroy",
                  "cuDevicePrimaryCtxRelease", "cuStreamWaitValue32", "cuStreamBatchMemOp",
                  "cuGraphKernelNodeGetParams", "cuGraphExecKernelNodeSetParams", "cuMemPrefetchAsync"]
CUBLASLT_ASKS = ["cuLinkAddFile_v2", "cuModuleLoadFatBinary", "cuCtxPushCurrent", "cuCtxPopCurrent",
                 "cuDevicePrimaryCtxReset"]


@pytest.mark.parametrize("name", CUBLASLT_NEEDS + CUBLASLT_ASKS)
def test_the_names_cublaslt_looks_up_are_exported(name):
    assert hasattr(ctypes.CDLL(str(FAKE_CUDA)), name)


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    node = make_node(tmp_path_factory.mktemp("tables"), n=1)
    proc = subprocess.run([sys.executable, str(PROBE), str(FAKE_CUDA)], env=node.env(shim=False),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_context_table_numbers_contexts_as_cuctxgetid(seen):
    ctx = seen["context"]
    assert ctx["size"] == 64 * 8
    assert ctx["ctx_number"] == ctx["current_number"] == ctx["ctx_get_id"]
    assert ctx["new_ctx_number"] not in (0, ctx["ctx_number"])


def test_the_context_table_resolves_streams_and_their_ids(seen):
    ctx = seen["context"]
    assert ctx["null_stream"] == 1 and ctx["per_thread_stream"] == 2  # NULL is the legacy default stream
    assert ctx["created_stream_is_itself"]
    assert (ctx["legacy_id"], ctx["per_thread_id"]) == (1, 2)
    assert ctx["created_id"] == ctx["created_get_id"] and ctx["created_id"] not in (1, 2)


def test_slots_nobody_reached_answer_not_supported(seen):
    assert seen["context"]["unknown_slot"] == CUDA_ERROR_NOT_SUPPORTED


def test_the_linker_checks_its_inputs_and_hands_out_a_loadable_image(seen):
    link = seen["link"]
    assert link["empty_complete"] == CUDA_ERROR_INVALID_VALUE  # nothing added yet
    assert link["cubin_of_ptx"] == CUDA_ERROR_INVALID_IMAGE  # PTX text passed as a cubin
    assert link["image_head"] == b"\x7fELF".hex() and link["image_size"] == 64
    assert link["module_load"] == CUDA_SUCCESS
    assert (link["info_log"], link["info_log_used"]) == ("", 0)  # nothing was compiled, nothing to say
    assert link["destroy"] == CUDA_SUCCESS
