"""The node view follows the kubelet's PodResources without an apiserver: a whole-GPU pod's units come back when it
ends, a read that began before an allocation forgets nothing, and a re-read frees the GPU of a short-lived pod.
Each test is a defect found by bench/churn.py, reduced to a minimal reproduction (all fixed)."""

from __future__ import annotations

import time

from devplugin.kube.podresources import list_containers
from devplugin_sim.fake_driver import seed_node
from devplugin_sim.kubelet_results import AdmissionError
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.support.daemon_harness import CORE, COUNT, MEM, Running, running

WAIT_S = 5.0  # a freed GPU is back in node allocatable within this (PodResources is re-read every 2 s)


def pod(name: str, **limits: int) -> PodSpec:
    names = {"mem": MEM, "core": CORE, "count": COUNT}
    return PodSpec(name=name, containers=[ContainerSpec("main", {names[k]: v for k, v in limits.items()})])


def whole_and_shared(r: Running) -> PodSpec:
    """On 2 GPUs of 4 GiB: A takes one whole, B holds 1 GiB and 50 % of the other; returns A."""
    assert r.registered_all()
    a = pod("a", count=1)
    r.kubelet.admit(a)
    r.kubelet.admit(pod("b", mem=1, core=50))
    assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 4, timeout=5)  # A's GPU left the pool
    return a


def test_fallback_units_come_back_when_a_whole_gpu_pod_ends() -> None:
    """Without an apiserver only PodResources tells the daemon that a gpu-count pod ended (the kubelet calls no
    plugin to free devices): the freed GPU's units must come back to node allocatable within a few seconds."""
    # 2 GPUs of 4 GiB: A takes one whole, B holds 1 GiB and 50 % of the other; A ends; C (4 GiB) fits only on A's
    # GPU. (C asks for memory only: with two resources the pairing fallback may place the first one blind, its known
    # limit, which is not what this test is about.)
    with running(seed_node(2, 4096), seed=3) as r:
        a = whole_and_shared(r)
        r.kubelet.remove_pod(a.uid)
        came_back = r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 8, timeout=WAIT_S)
        try:
            r.kubelet.admit(pod("c", mem=4))
            refusal = ""
        except AdmissionError as err:
            refusal = str(err)
        assert came_back and not refusal, (
            f"{WAIT_S} s after the gpu-count pod ended: gpu-mem allocatable {r.kubelet.allocatable().get(MEM)} "
            f"of 8; a pod that fits the freed GPU: {refusal or 'admitted'}")


def test_a_sync_older_than_an_allocation_forgets_nothing() -> None:
    """A PodResources read that began before the kubelet recorded a container's Allocate must not make the daemon
    forget that container (its GPU would look free and be given whole to another pod)."""
    with running(seed_node(1, 4096), seed=3) as r:
        assert r.registered_all()
        node = r.nd.allocator.node
        names = {node.resource_name(k): k for k in node.kinds}
        asked = time.monotonic()
        before = list_containers(str(r.pod_resources), names)  # the sync reads PodResources ...
        assert before == []
        shared = pod("shared", mem=1, core=10)
        r.kubelet.admit(shared)  # ... while this container is admitted
        r.nd.allocator.reconcile(before, None, as_of=asked)  # ... and applies what it read
        r.kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 1, timeout=1)  # the GPU would look free
        try:
            r.kubelet.admit(pod("whole", count=1))
            given = "the GPU whole to another pod"
        except AdmissionError:
            given = ""
        assert not given, f"the daemon gave {given} while container 'shared' holds units of it"


def test_fallback_a_reread_frees_the_gpu_of_a_short_lived_pod() -> None:
    """The kubelet records a container's devices a moment after the plugin's Allocate answered, so a PodResources
    read may keep very fresh holders it does not list yet; but a whole-GPU pod that ran for half a second and
    ended must be forgotten by the next read, or the GPU's units stay out of node allocatable and pods that fit
    are refused (bench/churn.py --mode fallback, 2,000 admissions: 54 to 168 refused for stale state with the
    2 s grace, depending on the admission rate; 5 with 0.2 s)."""
    with running(seed_node(2, 4096), seed=3) as r:
        a = whole_and_shared(r)
        time.sleep(0.5)
        r.kubelet.remove_pod(a.uid)
        assert r.nd.sync.sync()  # the next PodResources read (the timer's, or the one before a refusal)
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(MEM) == 8, timeout=0.5), (
            "a PodResources read that no longer lists the ended gpu-count pod left its GPU out of gpu-mem "
            f"allocatable ({r.kubelet.allocatable().get(MEM)} of 8)")
