"""The shim's C parser of the limits file against devplugin/contract.py: it reads everything render_limits
writes as Python does, and rejects everything parse_limits rejects."""

from __future__ import annotations

import json
import random
import struct
import subprocess

from devplugin import contract
from tests.support.shim_probe import TESTS, require_built

SEED = 20240611


def c_parse(documents: list[bytes]) -> list[dict]:
    """Parse each document with the shim's parser (one batch, one process)."""
    require_built()
    payload = b"".join(struct.pack("<I", len(d)) + d for d in documents)
    out = subprocess.run([str(TESTS / "gs_limits_check"), "batch"], input=payload, capture_output=True,
                         timeout=60, check=True)
    results = [json.loads(line) for line in out.stdout.decode().splitlines()]
    assert len(results) == len(documents)
    return results


def as_dict(limits: contract.Limits) -> dict:
    return {
        "ok": True,
        "core_policy": limits.core_policy,
        "devices": [{"uuid": d.uuid, "memory_limit": d.memory_limit, "sm_limit": d.sm_limit,
                     "sm_unreserved": d.sm_unreserved} for d in limits.devices],
    }


def random_limits(rng: random.Random) -> contract.Limits:
    def uuid() -> str:
        if rng.random() < 0.7:
            return f"GPU-{rng.getrandbits(128):032x}"
        alphabet = "abcdefABCDEF0123456789-_.:/GPUMIG"
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 95)))

    devices = tuple(
        contract.DeviceLimit(uuid(), rng.choice([0, 1, 1 << 30, rng.getrandbits(63), (1 << 63) - 1]),
                             rng.randint(1, 100), rng.random() < 0.3)
        for _ in range(rng.randint(1, contract.LIMITS_MAX_DEVICES))
    )
    return contract.Limits(devices=devices, core_policy=rng.choice(contract.CORE_POLICIES))


def test_everything_render_limits_writes_reads_back_the_same() -> None:
    rng = random.Random(SEED)
    cases = [random_limits(rng) for _ in range(400)]
    results = c_parse([contract.render_limits(lim).encode() for lim in cases])
    for lim, got in zip(cases, results, strict=True):
        assert got == as_dict(lim)


def mutate(rng: random.Random, text: str) -> str:
    """A limits file with a few lines changed, dropped, duplicated or made up."""
    lines = text.splitlines()
    keys = ["version", "devices", "core_policy", "device.0.uuid", "device.0.memory_limit", "device.0.sm_limit",
            "device.1.uuid", "device.1.memory_limit", "device.1.sm_limit", "device.00.uuid", "unknown", "",
            "device.0.sm_unreserved", "device.1.sm_unreserved"]
    values = ["0", "1", "2", "-1", "+1", "01", "100", "101", "17", "", " ", "x", "1.5", "1e3", "0x10", "1_0",
              "default", "force", "disable", "Force", "GPU-abc", str(1 << 63), str(1 << 64), "-0", "\t7"]
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        i = rng.randrange(len(lines) + 1)
        if roll < 0.3 and lines:
            del lines[min(i, len(lines) - 1)]
        elif roll < 0.6:
            lines.insert(i, f"{rng.choice(keys)}={rng.choice(values)}")
        elif roll < 0.7:
            lines.insert(i, rng.choice(["garbage", "# comment", "", "  ", "=", "a=b=c", "version=1 # ok"]))
        elif roll < 0.8 and lines:
            j = min(i, len(lines) - 1)
            lines[j] = lines[j].replace("=", rng.choice([" = ", "==", ":"]), 1)
        elif lines:
            j = min(i, len(lines) - 1)
            lines[j] = lines[j] + rng.choice(["\x0b", "\x1c", "\r", " x", "\u0085"])
    return "\n".join(lines) + rng.choice(["\n", "", "\r\n"])


def python_parse(text: str) -> dict:
    try:
        return as_dict(contract.parse_limits(text))
    except contract.LimitsFileError as exc:
        return {"ok": False, "error": str(exc)}


def test_whatever_parse_limits_rejects_the_shim_rejects_and_what_it_accepts_agrees() -> None:
    rng = random.Random(SEED + 1)
    texts = [mutate(rng, contract.render_limits(random_limits(rng))) for _ in range(2000)]
    results = c_parse([t.encode() for t in texts])
    rejected = 0
    for text, got in zip(texts, results, strict=True):
        expected = python_parse(text)
        if not expected["ok"]:
            rejected += 1
            assert not got["ok"], f"the shim accepted what contract.parse_limits rejects: {text!r}"
        elif got["ok"]:
            assert got == expected, text
    assert rejected > 500  # the mutations do reach the refusals


def test_the_shim_is_stricter_only_where_python_is_lenient() -> None:
    base = contract.render_limits(contract.Limits(devices=(contract.DeviceLimit("GPU-1", 1 << 30, 50),)))
    lenient = [
        base.replace("memory_limit=1073741824", "memory_limit=1_073_741_824"),  # Python int() takes underscores
        base.replace("uuid=GPU-1", "uuid="),  # an empty UUID matches no GPU
        base.replace("memory_limit=1073741824", f"memory_limit={1 << 64}"),  # beyond 64 bits
    ]
    for text, got in zip(lenient, c_parse([t.encode() for t in lenient]), strict=True):
        assert python_parse(text)["ok"] and not got["ok"], text


def test_errors_say_what_is_wrong() -> None:
    docs = ["version=1\ndevices=1\n", "version=1\ndevices=1\ndevice.0.uuid=GPU-1\ndevice.0.memory_limit=1\n"
            "device.0.sm_limit=0\n", "version=1\ndevices=1\ndevice.0.uuid=GPU-1\ndevice.0.memory_limit=1\n"
            "core_policy=sometimes\n"]
    errors = [r["error"] for r in c_parse([d.encode() for d in docs])]
    assert "device.0.uuid" in errors[0]
    assert "device.0.sm_limit must be 1..100" in errors[1]
    assert "core_policy" in errors[2] and "sometimes" in errors[2]


def test_a_container_that_reserved_no_compute_is_read_as_such_and_junk_in_the_flag_refused() -> None:
    # sm_unreserved=1: no compute reserved on that GPU, sm_limit is a cap (devplugin/allocation/unreserved.py)
    flagged = contract.render_limits(contract.Limits(devices=(contract.DeviceLimit("GPU-1", 0, 30, True),)))
    assert "device.0.sm_unreserved=1" in flagged
    docs = [flagged, flagged.replace("sm_unreserved=1", "sm_unreserved=2"),
            flagged.replace("sm_unreserved=1", "sm_unreserved=yes")]
    got = c_parse([d.encode() for d in docs])
    assert got[0]["ok"] and got[0]["devices"][0]["sm_unreserved"] is True and got[0]["devices"][0]["sm_limit"] == 30
    for doc, res in zip(docs[1:], got[1:], strict=True):
        assert not res["ok"] and "device.0.sm_unreserved must be 0 or 1" in res["error"]
        assert not python_parse(doc)["ok"]
