"""Every admission rule, allowed and denied; the mutating patch applied with a real RFC 6902 implementation."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from devplugin.contract import LABEL_ACK_MULTI_GPU, LABEL_VOID_OPT_OUT
from devplugin.scheduler.admission import mutate, validate, validate_void
from tests.support.scheduler_objects import MEM, container, pod

LARGEST = 16


def deny(p: dict, namespace_opted_out: bool = False) -> str:
    verdict = validate(p, LARGEST, namespace_opted_out=namespace_opted_out)
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
    assert f"containers[0] 'main': sets env {env}, which only the node daemon may set" in msg
    assert "only the node daemon may set" in deny(pod(containers=[container(count=1, env={env: "x"})]))  # whole
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


def test_only_an_admins_namespace_label_opts_out_of_the_void_never_the_pods_own() -> None:
    assert mutate(pod(labels={LABEL_VOID_OPT_OUT: "keep"}))  # the tenant's own pod: no way out
    assert mutate(pod(), namespace_labels={LABEL_VOID_OPT_OUT: "keep"}) == []
    assert mutate(pod(), namespace_labels={LABEL_VOID_OPT_OUT: "other"})  # only "keep" opts out


@pytest.mark.parametrize("extra", [{"nvidia.com/gpu": "0"}, {"aliyun.com/gpu-mem": "0"}, {"example.com/gpu-x": "0"},
                                   {"aliyun.com/gpu-core.percentage": "0m"}, {"nvidia.com/gpu": "0Ki"}])
def test_a_zero_quantity_of_a_gpu_resource_asks_for_no_gpu_and_gets_the_void(extra: dict) -> None:
    """A zero quantity makes no device plugin call and sets no env: the container is a CPU container."""
    p = pod(containers=[container(extra=extra)])
    out = apply(p, mutate(p))
    assert envs(out["spec"]["containers"][0]) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert validate(out, LARGEST).allowed
    assert validate_void(out).allowed
    assert not validate_void(p).allowed


def test_the_void_is_enforced_where_the_mutating_webhook_did_not_run() -> None:
    unmarked = pod(containers=[container("cpu"), container("gpu", mem=2), container("nvidia", extra={
        "nvidia.com/gpu": "1"})], init=[container("init")])
    verdict = validate_void(unmarked)
    assert not verdict.allowed and verdict.rules == ("void",)
    assert "containers[0] 'cpu' asks for no GPU but is not marked NVIDIA_VISIBLE_DEVICES=void" in verdict.message
    assert "initContainers[0] 'init' asks for no GPU" in verdict.message
    assert "'gpu'" not in verdict.message and "'nvidia'" not in verdict.message
    assert validate_void(apply(unmarked, mutate(unmarked))).allowed
    forged = pod(containers=[container(env={"NVIDIA_VISIBLE_DEVICES": "all"})])
    assert not validate_void(forged).allowed
    by_ref = container()
    by_ref["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]
    assert not validate_void(pod(containers=[by_ref])).allowed


def test_an_ephemeral_container_added_unmarked_is_refused_and_existing_ones_are_not_checked_again() -> None:
    old = pod(containers=[container(mem=2)])
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "nvidia/cuda"}]
    assert "ephemeralContainers[0] 'debug' asks for no GPU" in validate_void(new, old).message
    assert validate_void(apply(new, mutate(new, old=old)), old).allowed


@pytest.mark.parametrize("path", ["/var/run/nvidia-container-devices", "/var/run/nvidia-container-devices/all",
                                  "/var/run/nvidia-container-devices/GPU-0/"])
def test_no_container_may_mount_where_the_toolkit_reads_its_gpu_grant(path: str) -> None:
    c = container(mem=2)
    c["volumeMounts"] = [{"name": "null", "mountPath": path}]
    p = pod(containers=[c])
    msg = validate_void(p).message
    assert f"mounts a volume at {path}" in msg and "only the GPU device plugin may put mounts there" in msg


# --- no GPU without a grant: every container of every pod -----------------------------------------------------
def _with(c: dict, **extra: object) -> dict:
    c.update(extra)
    return c


@pytest.mark.parametrize(("make", "where"), [
    (lambda env: pod(containers=[container(env=env)]), "containers[0] 'main'"),  # asks for no GPU at all
    (lambda env: pod(containers=[container(count=1, env=env)]), "containers[0] 'main'"),  # a whole GPU
    (lambda env: pod(containers=[container(mem=2), container("side", env=env)]), "containers[1] 'side'"),
    (lambda env: _with(pod(mem=2), spec={**pod(mem=2)["spec"], "initContainers": [container("init", env=env)]}),
     "initContainers[0] 'init'"),
    (lambda env: _with(pod(), spec={**pod()["spec"], "ephemeralContainers": [{"name": "debug", "image": "cuda",
                                                                             "env": [{"name": k, "value": v} for k, v
                                                                                     in env.items()]}]}),
     "ephemeralContainers[0] 'debug'"),
])
@pytest.mark.parametrize("env", [{"NVIDIA_VISIBLE_DEVICES": "all"}, {"CUDA_VISIBLE_DEVICES": "0,1"},
                                 {"NVIDIA_VISIBLE_DEVICES": "GPU-0"}, {"CUDA_DEVICE_MEMORY_LIMIT": "80g"}])
def test_no_container_of_any_pod_may_set_the_env_that_grants_gpus(make, where: str, env: dict) -> None:  # type: ignore[no-untyped-def]
    msg = deny(make(env))
    assert f"{where}: sets env {next(iter(env))}, which only the node daemon may set" in msg


def test_void_grants_nothing_and_is_allowed_on_containers_without_a_gpu() -> None:
    assert validate(pod(containers=[container(env={"NVIDIA_VISIBLE_DEVICES": "void"})]), LARGEST).allowed
    assert "sets env NVIDIA_VISIBLE_DEVICES" in deny(pod(containers=[container(mem=2, env={
        "NVIDIA_VISIBLE_DEVICES": "void"})]))
    from_ref = container()
    from_ref["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}]
    assert "sets env NVIDIA_VISIBLE_DEVICES" in deny(pod(containers=[from_ref]))
    assert validate(pod(containers=[container(env={"LD_PRELOAD": "/lib/jemalloc.so"})]), LARGEST).allowed


@pytest.mark.parametrize("source", [{"configMapRef": {"name": "gpu-env"}}, {"secretRef": {"name": "gpu-env"}},
                                    {"configMapRef": {"name": "gpu-env"}, "prefix": "NVIDIA_"},
                                    {"configMapRef": {"name": "gpu-env"}, "prefix": "CUDA"}])
def test_env_from_that_could_spell_a_reserved_name_is_refused_where_the_webhook_cannot_void_it(source: dict) -> None:
    kind = "ConfigMap" if "configMapRef" in source else "Secret"
    gpu = container(mem=2)
    gpu["envFrom"] = [source]
    assert f"containers[0] 'main': envFrom {kind} 'gpu-env' could set env names only the node daemon may set" in (
        deny(pod(containers=[gpu])))
    opted = container()
    opted["envFrom"] = [source]
    assert "envFrom" in deny(pod(containers=[opted]), namespace_opted_out=True)
    # a container without a GPU gets NVIDIA_VISIBLE_DEVICES=void from the mutating webhook, and env wins over envFrom
    assert validate(pod(containers=[opted]), LARGEST).allowed
    assert validate(pod(containers=[opted], labels={LABEL_VOID_OPT_OUT: "keep"}), LARGEST).allowed


def test_env_from_with_a_prefix_that_cannot_spell_a_reserved_name_is_allowed() -> None:
    gpu = container(mem=2)
    gpu["envFrom"] = [{"configMapRef": {"name": "app"}, "prefix": "APP_"}]
    assert validate(pod(containers=[gpu]), LARGEST).allowed


def test_a_new_ephemeral_container_gets_void_and_existing_containers_are_left_alone() -> None:
    old = pod(containers=[container(mem=2)])
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "nvidia/cuda"}]
    ops = mutate(new, old=old)
    assert ops == [{"op": "add", "path": "/spec/ephemeralContainers/0/env",
                    "value": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]}]
    patched = jsonpatch.apply_patch(new, ops)
    assert validate(patched, LARGEST).allowed
    assert mutate(patched, old=patched) == []


def test_an_ephemeral_container_added_later_may_not_grant_itself_gpus() -> None:
    from devplugin.scheduler.admission import validate_update
    old = pod(containers=[container(mem=2)])
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "nvidia/cuda",
                                           "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]
    verdict = validate_update(new, old)
    assert not verdict.allowed
    assert "ephemeralContainers[0] 'debug': sets env NVIDIA_VISIBLE_DEVICES, which only the node daemon" in (
        verdict.message)
    assert validate_update(new, new).allowed  # already there: another update of the pod is not re-judged
