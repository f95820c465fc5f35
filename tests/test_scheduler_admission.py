"""Every admission rule, allowed and denied; the mutating patch applied with a real RFC 6902 implementation."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from devplugin.contract import LABEL_ACK_MULTI_GPU, LABEL_VOID_OPT_OUT
from devplugin.scheduler.admission import mutate, validate
from tests.scheduler_objects import MEM, container, pod

LARGEST = 16


def deny(p: dict) -> str:
    verdict = validate(p, LARGEST)
    assert not verdict.allowed
    return verdict.message


@pytest.mark.parametrize("core", [5, 50, 100])
def test_core_multiples_of_5_within_5_to_100_are_allowed(core: int) -> None:
    assert validate(pod(mem=2, core=core), LARGEST).allowed


@pytest.mark.parametrize("core", [3, 33, 105, 200])
def test_other_core_values_are_denied_with_the_valid_range(core: int) -> None:
    assert f"gpu-core.percentage {core} is not a valid compute share; ask for a multiple of 5 from 5 to 100" in deny(
        pod(mem=2, core=core))


def test_requests_must_equal_limits() -> None:
    c = container(mem=4)
    c["resources"]["requests"][MEM] = "2"
    assert "aliyun.com/gpu-mem request 2 differs from its limit 4; set them equal" in deny(pod(containers=[c]))
    only_requests = container()
    only_requests["resources"] = {"requests": {MEM: "2"}}
    assert "set in requests only; set it in limits" in deny(pod(containers=[only_requests]))


@pytest.mark.parametrize(("spelled", "same"), [("1e1", "10"), ("1e1", "1e1"), ("1k", "1000")])
def test_quantities_the_apiserver_keeps_as_written_are_allowed(spelled: str, same: str) -> None:
    c = container(mem=0)
    c["resources"] = {"limits": {MEM: spelled}, "requests": {MEM: same}}
    verdict = validate(pod(containers=[c]), 2000)
    assert verdict.allowed, verdict.message
    limits_only = container(mem=4)
    del limits_only["resources"]["requests"]
    assert validate(pod(containers=[limits_only]), LARGEST).allowed


def test_core_needs_memory() -> None:
    assert "gpu-core.percentage needs gpu-mem; add a gpu-mem limit" in deny(pod(core=20))


def test_memory_must_fit_the_largest_gpu_per_gpu_for_multi_gpu_shares() -> None:
    assert validate(pod(mem=16), LARGEST).allowed
    msg = deny(pod(mem=20))
    assert "asks for 20 gpu-mem units but the largest GPU in the cluster has 16" in msg
    assert f"label the pod {LABEL_ACK_MULTI_GPU}=N" in msg
    assert validate(pod(mem=24, labels={LABEL_ACK_MULTI_GPU: "2"}), LARGEST).allowed
    assert "per GPU (40 over 2 GPUs)" in deny(pod(mem=40, labels={LABEL_ACK_MULTI_GPU: "2"}))
    assert "do not split evenly over 2 GPUs" in deny(pod(mem=7, labels={LABEL_ACK_MULTI_GPU: "2"}))
    unknown = validate(pod(mem=400), 0)  # no node has published its GPUs yet: allowed, with a warning
    assert unknown.allowed and "not checked against GPU sizes" in unknown.warnings[0]


def test_gpu_count_with_a_share_only_through_the_multi_gpu_label() -> None:
    msg = deny(pod(mem=8, count=2))
    assert f"label the pod {LABEL_ACK_MULTI_GPU}=N and ask for gpu-mem only" in msg
    assert validate(pod(count=2), LARGEST).allowed
    assert validate(pod(mem=8, labels={LABEL_ACK_MULTI_GPU: "2"}), LARGEST).allowed


@pytest.mark.parametrize("env", ["NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT",
                                 "GPUSHARE_LIMITS_FILE", "LD_PRELOAD"])
def test_slice_containers_may_not_set_the_daemons_env(env: str) -> None:
    msg = deny(pod(containers=[container(mem=2, env={env: "x"})]))
    assert f"container 'main': sets env {env}, which the node daemon sets for GPU shares; remove it" in msg
    assert validate(pod(containers=[container(count=1, env={env: "x"})]), LARGEST).allowed  # whole GPUs
    assert validate(pod(containers=[container(mem=2, env={"CUDA_VISIBLE_ORDER": "x"})]), LARGEST).allowed


def test_every_problem_is_listed_and_unreadable_quantities_are_denied() -> None:
    msg = deny(pod(containers=[container("a", core=7), container("b", mem=99)]))
    assert "container 'a': gpu-core.percentage needs gpu-mem" in msg and "container 'b': asks for 99" in msg
    assert "not a whole number" in deny(pod(containers=[{"name": "x", "resources": {"limits": {MEM: "0.5"}}}]))
    assert "multi-GPU count 'two'" in deny(pod(mem=2, labels={LABEL_ACK_MULTI_GPU: "two"}))


def test_pods_without_gpu_asks_are_allowed() -> None:
    assert validate(pod(), LARGEST).allowed
    assert validate(pod(containers=[container(extra={"nvidia.com/gpu": "1"})]), LARGEST).allowed


def apply(p: dict, ops: list[dict]) -> dict:
    return jsonpatch.JsonPatch(ops).apply(copy.deepcopy(p))


def envs(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env") or []}


def test_containers_without_gpu_get_visible_devices_void() -> None:
    p = pod(containers=[container("cpu"), container("gpu", mem=2), container("cpu-env", env={"A": "1"}),
                        container("nvidia", extra={"nvidia.com/gpu": "1"}),
                        container("own", env={"NVIDIA_VISIBLE_DEVICES": "all"})],
            init=[container("init")])
    out = apply(p, mutate(p))
    got = {c["name"]: envs(c) for c in out["spec"]["initContainers"] + out["spec"]["containers"]}
    assert got == {"init": {"NVIDIA_VISIBLE_DEVICES": "void"}, "cpu": {"NVIDIA_VISIBLE_DEVICES": "void"},
                   "gpu": {}, "cpu-env": {"A": "1", "NVIDIA_VISIBLE_DEVICES": "void"}, "nvidia": {},
                   "own": {"NVIDIA_VISIBLE_DEVICES": "all"}}
    assert mutate(out) == []  # idempotent: reinvocation changes nothing


def test_void_opt_out_per_pod_and_per_namespace() -> None:
    p = pod(labels={LABEL_VOID_OPT_OUT: "keep"})
    assert mutate(p) == []
    assert mutate(pod(), namespace_labels={LABEL_VOID_OPT_OUT: "keep"}) == []
    assert mutate(pod(labels={LABEL_VOID_OPT_OUT: "other"}))  # only "keep" opts out
