"""What the fake libcuda answers to cuBLAS's private calls, printed as one JSON object
(tests/fakes/test_cuda_cublas.py).

    python tests/fakes/cuda_tables_probe.py LIBCUDA

Runs in a process of its own (cuInit's state is the process's) on the node FAKE_NVML_CONFIG names: the context
table's slots 4, 51 and 39 beside cuCtxGetId and cuStreamGetId, and the JIT linker.
"""

from __future__ import annotations

import ctypes
import json
import sys

CONTEXT_TABLE = bytes.fromhex("21318c60971432488ca641ff7324c8f2")
CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 1, 2
CU_JIT_INPUT_CUBIN, CU_JIT_INPUT_PTX = 0, 1
CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 3, 4
PTX = b"//\n.version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n\0"

u64 = ctypes.c_ulonglong
vp = ctypes.c_void_p


def check(rc: int, what: str) -> None:
    if rc:
        raise SystemExit(f"cuda_tables_probe: {what} failed: {rc}")


def context_table(cu: ctypes.CDLL) -> dict:
    table = vp()
    check(cu.cuGetExportTable(ctypes.byref(table), (ctypes.c_ubyte * 16)(*CONTEXT_TABLE)), "cuGetExportTable")
    slots = (vp * 64).from_address(table.value)
    number = ctypes.CFUNCTYPE(ctypes.c_int, vp, ctypes.POINTER(u64))(slots[4])
    stream_of = ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, ctypes.POINTER(vp))(slots[51])
    stream_id = ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, ctypes.POINTER(u64))(slots[39])

    def num(ctx: int | None) -> int:
        n = u64()
        check(number(ctx, ctypes.byref(n)), "slot 4")
        return n.value

    def obj(handle: int | None) -> int:
        o = vp()
        check(stream_of(ctx, handle, ctypes.byref(o)), "slot 51")
        return o.value or 0

    def sid(stream: int) -> int:
        n = u64()
        check(stream_id(ctx, stream, ctypes.byref(n)), "slot 39")
        return n.value

    ctx, other = vp(), vp()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ctx_id = u64()
    check(cu.cuCtxGetId(ctx, ctypes.byref(ctx_id)), "cuCtxGetId")
    stream = vp()
    check(cu.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    stream_get_id = u64()
    check(cu.cuStreamGetId(stream, ctypes.byref(stream_get_id)), "cuStreamGetId")
    result = {
        "size": slots[0],
        "ctx_number": num(ctx.value), "current_number": num(None), "ctx_get_id": ctx_id.value,
        "null_stream": obj(None), "per_thread_stream": obj(CU_STREAM_PER_THREAD),
        "created_stream_is_itself": obj(stream.value) == stream.value,
        "legacy_id": sid(CU_STREAM_LEGACY), "per_thread_id": sid(CU_STREAM_PER_THREAD),
        "created_id": sid(stream.value), "created_get_id": stream_get_id.value,
        "unknown_slot": ctypes.CFUNCTYPE(ctypes.c_int, vp, vp, vp)(slots[5])(None, None, None),
    }
    check(cu.cuCtxCreate_v2(ctypes.byref(other), 0, 0), "cuCtxCreate_v2")
    result["new_ctx_number"] = num(other.value)
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return result


def linker(cu: ctypes.CDLL) -> dict:
    state, image, size, module = vp(), vp(), ctypes.c_size_t(), vp()
    log = ctypes.create_string_buffer(b"x" * 64)
    options = (ctypes.c_int * 2)(CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)
    values = (vp * 2)(ctypes.cast(log, vp), vp(64))
    check(cu.cuLinkCreate_v2(2, options, values, ctypes.byref(state)), "cuLinkCreate_v2")
    empty = cu.cuLinkComplete(state, ctypes.byref(image), ctypes.byref(size))
    wrong = cu.cuLinkAddData_v2(state, CU_JIT_INPUT_CUBIN, PTX, len(PTX), b"k.ptx", 0, None, None)
    check(cu.cuLinkAddData_v2(state, CU_JIT_INPUT_PTX, PTX, len(PTX), b"k.ptx", 0, None, None), "cuLinkAddData_v2")
    check(cu.cuLinkComplete(state, ctypes.byref(image), ctypes.byref(size)), "cuLinkComplete")
    head = ctypes.string_at(image, 4)
    loaded = cu.cuModuleLoadData(ctypes.byref(module), image)
    return {"empty_complete": empty, "cubin_of_ptx": wrong, "image_head": head.hex(), "image_size": size.value,
            "module_load": loaded, "info_log": log.value.decode(), "info_log_used": values[1] or 0,
            "destroy": cu.cuLinkDestroy(state)}


def main(path: str) -> None:
    cu = ctypes.CDLL(path)
    check(cu.cuInit(0), "cuInit")
    print(json.dumps({"context": context_table(cu), "link": linker(cu)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
