"""The shim's units depend on each other in layers, never in a circle: a unit is a .c file with its .h, and it
depends on the units whose headers it (or its header) includes."""

from __future__ import annotations

import re

from tests.support.shim_probe import REPO

SHIM = REPO / "shim"
INCLUDE = re.compile(r'^#include "(gs_[a-z_]+)\.h"', re.MULTILINE)


def dependencies() -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for path in [*SHIM.glob("gs_*.c"), *SHIM.glob("gs_*.h")]:
        unit = path.stem
        units.setdefault(unit, set()).update(d for d in INCLUDE.findall(path.read_text()) if d != unit)
    return units


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if not state.get(nxt) and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if not state.get(node) and (found := visit(node)):
            return found
    return None


def test_the_units_form_no_cycle():
    assert cycle(dependencies()) is None, " -> ".join(cycle(dependencies()) or [])


def test_state_enter_and_refuse_sit_at_the_bottom():
    graph = dependencies()
    below_state = {"gs_cuda_types", "gs_config", "gs_log", "gs_real", "gs_parse", "gs_glibc_compat"}
    assert graph["gs_state"] <= below_state, graph["gs_state"]
    assert not graph["gs_devices"] & {"gs_throttle", "gs_account", "gs_shim", "gs_memory"}, graph["gs_devices"]
    assert "gs_devices" not in graph["gs_throttle"] and "gs_shim" not in graph["gs_throttle"]


def test_the_fake_driver_uses_the_shim_s_cuda_types():
    fake = (REPO / "fakes" / "cuda" / "fake_cuda.h").read_text()
    assert '#include "gs_cuda_types.h"' in fake
    assert "typedef struct CUmemAllocationProp_st" not in fake  # no second declaration to drift


def test_the_check_finds_a_cycle():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_unit_with_locks_registers_its_own_fork_handler():
    for path in SHIM.glob("gs_*.c"):
        text = path.read_text()
        if "pthread_mutex_t" in text and "PTHREAD_MUTEX_INITIALIZER" in text:
            assert "GS_ON_FORK_CHILD(" in text or "pthread_atfork(" in text, path.name


