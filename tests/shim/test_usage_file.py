"""The daemon's reader of a container's usage file: the container writes that file itself, so whatever it holds
(garbage, huge numbers, a symbolic link, a FIFO, a directory) changes only that container's figures, clamped, and
is never followed, blocked on or trusted beyond the layout's bounds."""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devplugin import contract as c
from devplugin.isolation.usage_file import COUNT_MAX, parse_usage, read_usage_file

UUID = "GPU-3f253680-38ab-580f-b850-f716a15180f6"
GiB = 1 << 30
GPU_MEMORY = 16 * GiB


def usage_bytes(*, uuid: str = UUID, used: tuple[int, ...] = (GiB,), refused: int = 0, throttled_ns: int = 0,
                used_pct: int = -1, steps: int = 0, spent: int = 0, ndevices: int = 1, nslots: int | None = None,
                magic: int = c.USAGE_MAGIC, version: int = c.USAGE_VERSION) -> bytearray:
    """A usage file as the shim lays it out (contract.USAGE_*): one GPU, one slot per entry of `used`."""
    buf = bytearray(c.USAGE_FILE_SIZE)
    struct.pack_into("<QIII", buf, 0, magic, version, ndevices, len(used) if nslots is None else nslots)
    buf[c.USAGE_OFF_DEVICES:c.USAGE_OFF_DEVICES + len(uuid)] = uuid.encode()
    for i, u in enumerate(used):
        off = c.USAGE_OFF_SLOTS + i * c.USAGE_SLOT_SIZE
        struct.pack_into("<i", buf, off, 1000 + i)
        struct.pack_into("<Q", buf, off + c.USAGE_SLOT_USED, u)
    comp = c.USAGE_OFF_COMPUTE
    struct.pack_into("<Q", buf, comp + c.USAGE_COMPUTE_SPENT, spent)
    struct.pack_into("<i", buf, comp + c.USAGE_COMPUTE_USED_PCT, used_pct)
    struct.pack_into("<i", buf, comp + c.USAGE_COMPUTE_STEPS, steps)
    struct.pack_into("<QQQ", buf, c.USAGE_OFF_STATS, refused, min(refused * GiB, (1 << 64) - 1), throttled_ns)
    return buf


def test_a_file_as_the_shim_writes_it() -> None:
    got = parse_usage(bytes(usage_bytes(used=(GiB, 2 * GiB), refused=3, throttled_ns=1_500_000_000, used_pct=42,
                                        steps=7, spent=99)), GPU_MEMORY)
    assert got.error == "" and got.processes == 2
    fig = got.gpus[UUID.lower()]
    assert (fig.memory_used, fig.refused, fig.throttled_s, fig.compute_used) == (3 * GiB, 3, 1.5, 42)


def test_compute_is_zero_before_any_launch_and_unknown_until_measured() -> None:
    assert parse_usage(bytes(usage_bytes()), GPU_MEMORY).gpus[UUID.lower()].compute_used == 0
    assert parse_usage(bytes(usage_bytes(spent=5)), GPU_MEMORY).gpus[UUID.lower()].compute_used is None


def test_huge_numbers_are_clamped() -> None:
    top = (1 << 64) - 1
    got = parse_usage(bytes(usage_bytes(used=(top, top), refused=top, throttled_ns=top, used_pct=1 << 30,
                                        steps=1, ndevices=1 << 31, nslots=1 << 31)), GPU_MEMORY)
    assert got.error == ""
    assert got.processes == 2  # slots beyond nslots are free: the count is clamped to the layout, not trusted
    fig = got.gpus[UUID.lower()]
    assert fig.memory_used == GPU_MEMORY and fig.refused == COUNT_MAX and fig.compute_used == 100
    assert fig.throttled_s <= 100 * 366 * 86400


@pytest.mark.parametrize("data, why", [
    (b"", "0 bytes"),
    (b"garbage" * 10, "70 bytes"),
    (bytes(usage_bytes(magic=1)), "not a version"),
    (bytes(usage_bytes(version=2)), "not a version"),
], ids=["empty", "short", "magic", "version"])
def test_garbage_gives_a_reason_and_no_figures(data: bytes, why: str) -> None:
    got = parse_usage(data, GPU_MEMORY)
    assert why in got.error and got.gpus == {} and got.processes == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, c.USAGE_FILE_SIZE), st.binary(min_size=1, max_size=64)), max_size=40),
       st.integers(-64, 64))
def test_any_bytes_parse_without_raising(patches: list[tuple[int, bytes]], resize: int) -> None:
    """A shim's file with random bytes written anywhere (header included), shortened or lengthened."""
    buf = usage_bytes(used=(GiB,) * 3)
    for offset, data in patches:
        buf[offset:offset + len(data)] = data
    buf = buf[:len(buf) + resize] if resize < 0 else buf + bytes(resize)
    got = parse_usage(bytes(buf), GPU_MEMORY)
    for fig in got.gpus.values():
        assert 0 <= fig.memory_used <= GPU_MEMORY and 0 <= fig.refused <= COUNT_MAX
        assert fig.compute_used is None or 0 <= fig.compute_used <= 100
    assert 0 <= got.processes <= c.USAGE_SLOTS


def test_a_missing_file_is_a_container_that_has_not_used_cuda(tmp_path: Path) -> None:
    got = read_usage_file(tmp_path / "usage.cache", GPU_MEMORY)
    assert got.error == "" and got.gpus == {}


def test_a_symbolic_link_is_not_followed(tmp_path: Path) -> None:
    other = tmp_path / "other.cache"
    other.write_bytes(bytes(usage_bytes(refused=5)))
    (tmp_path / "usage.cache").symlink_to(other)
    got = read_usage_file(tmp_path / "usage.cache", GPU_MEMORY)
    assert "symbolic link" in got.error and got.gpus == {}


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "usage.cache")
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(read_usage_file(tmp_path / "usage.cache", 1).error))
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "the reader blocked on a FIFO"
    assert "not a plain file" in result[0]


def test_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "usage.cache").mkdir()
    assert read_usage_file(tmp_path / "usage.cache", 1).error


def test_a_huge_file_is_read_only_up_to_the_layout(tmp_path: Path) -> None:
    path = tmp_path / "usage.cache"
    path.write_bytes(bytes(usage_bytes(refused=2)))
    with open(path, "r+b") as f:
        f.truncate(1 << 40)  # sparse: a terabyte the reader must not read
    got = read_usage_file(path, GPU_MEMORY)
    assert got.error == "" and got.gpus[UUID.lower()].refused == 2


def test_the_daemon_s_empty_file_is_a_container_that_has_not_used_cuda(tmp_path: Path) -> None:
    path = tmp_path / "usage.cache"
    path.write_bytes(bytes(c.USAGE_FILE_SIZE))  # as shim_files makes it, before any process maps it
    got = read_usage_file(path, GPU_MEMORY)
    assert got.error == "" and got.gpus == {} and got.processes == 0
