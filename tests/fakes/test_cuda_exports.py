"""The fake libcuda as a well-formed driver: every entry point cuGetProcAddress hands out is one of its exported
symbols (so the shim's fail-closed rule for unknown allocation entry points never fires on it), unknown export
tables are NOT_FOUND, and the hash of the runtime's integrity check is RFC 1319's MD2."""

from __future__ import annotations

import ctypes
import re

import pytest

from tests.support.shim_probe import FAKE_CUDA, REPO, require_built

FAKES = REPO / "fakes" / "cuda"
CUDA_ERROR_NOT_FOUND = 500


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def proc_names() -> list[str]:
    names = re.findall(r'^R\("(\w+)"', (FAKES / "fake_cuda_procs.def").read_text(), re.MULTILINE)
    names += re.findall(r'^\s+[PS]\("(\w+)"', (FAKES / "fake_cuda_procaddr.c").read_text(), re.MULTILINE)
    return sorted(set(names))


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    require_built()
    return ctypes.CDLL(str(FAKE_CUDA))


@pytest.mark.parametrize("flags", [0, 2], ids=["legacy-stream", "per-thread-stream"])
def test_every_entry_point_handed_out_is_an_exported_symbol(lib, flags):
    libdl = ctypes.CDLL(None)
    libdl.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    names = proc_names()
    assert len(names) > 180
    not_exported = []
    for name in names:
        pfn = ctypes.c_void_p()
        rc = lib.cuGetProcAddress(name.encode(), ctypes.byref(pfn), 13000, ctypes.c_uint64(flags))
        assert rc == 0 and pfn.value, name
        info = DlInfo()
        assert libdl.dladdr(pfn, ctypes.byref(info))
        exported = info.dli_sname and ctypes.cast(getattr(lib, info.dli_sname.decode()), ctypes.c_void_p).value
        if exported != pfn.value:
            not_exported.append(name)
    assert not_exported == []


def test_unknown_export_tables_are_not_found(lib):
    table = ctypes.c_void_p()
    uuid = (ctypes.c_ubyte * 16)(*range(16))
    assert lib.cuGetExportTable(ctypes.byref(table), uuid) == CUDA_ERROR_NOT_FOUND


@pytest.mark.parametrize("text, digest", [
    (b"", "8350e5a3e24c153df2275c9f80692773"),
    (b"abc", "da853b0d3f88d99b30283a69e6ded6bb"),
    (b"message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
    (b"12345678901234567890123456789012345678901234567890123456789012345678901234567890",
     "d5976f79d83d3a0dc9806c3c66f3efd8"),
])
def test_the_integrity_hash_is_md2(lib, text, digest):
    out = (ctypes.c_ubyte * 16)()
    assert lib.fakeCuda_md2(text, len(text), out) == 0
    assert bytes(out).hex() == digest
