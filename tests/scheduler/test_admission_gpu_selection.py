"""The validating webhook refuses a malformed or contradictory GPU selection at the door, with what to change; a
selection it cannot judge without the cluster (a model no node has) is left to the extender's filter."""

from __future__ import annotations

import pytest

from devplugin import contract as c
from devplugin.scheduler.admission import validate
from tests.allocation.test_gpu_selection import U1, U2
from tests.support.scheduler_objects import container, pod


@pytest.mark.parametrize(("annotations", "says"), [
    ({c.ANN_USE_GPU_UUID: U1, c.ANN_AVOID_GPU_UUID: U1}, "a GPU cannot be both chosen and avoided"),
    ({c.ANN_USE_GPU_MODEL: "H100", c.ANN_HAMI_NOUSE_GPU_TYPE: "h100"}, "a model cannot be both chosen and avoided"),
    ({c.ANN_AVOID_GPU_UUID: "MIG-" + U1[4:]}, "name the GPU it is carved from"),
    ({c.ANN_HAMI_USE_GPU_UUID: "GPU-xyz"}, "is not a GPU UUID"),
    ({c.ANN_USE_GPU_MODEL: "A100", c.ANN_HAMI_USE_GPU_TYPE: "H100"}, "disagree"),
    ({c.ANN_AVOID_GPU_MODEL: " , "}, "lists no GPU model"),
])
def test_malformed_or_contradictory_selections_are_denied(annotations: dict[str, str], says: str) -> None:
    verdict = validate(pod(mem=4, core=20, annotations=annotations))
    assert not verdict.allowed
    assert says in verdict.message
    assert verdict.rules == ("gpu_selection",)


def test_a_well_formed_selection_is_allowed_even_naming_a_model_no_node_may_have() -> None:
    verdict = validate(pod(mem=4, core=20, annotations={c.ANN_USE_GPU_MODEL: "B200", c.ANN_AVOID_GPU_UUID: U2,
                                                        c.ANN_HAMI_NOUSE_GPU_UUID: U2.lower()}))
    assert verdict.allowed, verdict.message


def test_a_pod_that_asks_for_no_gpu_of_ours_is_not_judged_by_our_selection_rules() -> None:
    other = pod(containers=[container(extra={"nvidia.com/gpu": "1"})], annotations={c.ANN_HAMI_USE_GPU_UUID: "x"})
    assert validate(other).allowed


def test_a_selection_problem_is_listed_beside_the_others() -> None:
    verdict = validate(pod(mem=4, core=33, annotations={c.ANN_USE_GPU_UUID: "nope"}))
    assert not verdict.allowed and "multiple of 5" in verdict.message and "is not a GPU UUID" in verdict.message
    assert set(verdict.rules) == {"core_share", "gpu_selection"}
