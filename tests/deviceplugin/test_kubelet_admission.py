"""Containers admitted through the kubelet emulator over the real sockets get one GPU and the right env."""

from __future__ import annotations

import random

import pytest

from devplugin_sim.kubelet import AdmissionError
from devplugin_sim.pods import ContainerSpec, PodSpec
from tests.support.daemon_harness import CORE, COUNT, MEM, running


def pod(name: str, **limits: int) -> PodSpec:
    names = {"mem": MEM, "core": CORE, "count": COUNT}
    return PodSpec(name=name, containers=[ContainerSpec(name="main", limits={names[k]: v for k, v in limits.items()})])


def test_seed_job_gets_two_gib_and_thirty_percent_of_one_gpu() -> None:
    with running() as r:
        assert r.registered_all()
        c = r.kubelet.admit(pod("cuda-sample", mem=2, core=30)).containers[0]
        assert c.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
        assert c.envs["CUDA_DEVICE_SM_LIMIT"] == "30"
        assert c.envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2"
        assert c.envs["NVIDIA_VISIBLE_DEVICES"] == r.daemon.node.gpus[0].uuid
        assert c.conflicts == []


def test_bad_core_request_fails_admission_with_advice() -> None:
    with running() as r:
        assert r.registered_all()
        with pytest.raises(AdmissionError, match="multiple of 5"):
            r.kubelet.admit(pod("bad", mem=1, core=33))


def test_too_big_for_any_gpu_fails_with_room_per_gpu() -> None:
    with running() as r:
        assert r.registered_all()
        with pytest.raises(AdmissionError, match="no single GPU has 16 free units"):
            r.kubelet.admit(pod("big", mem=16, core=5))


def test_random_admissions_keep_mem_and_core_together_over_real_sockets() -> None:
    rng = random.Random(5)
    with running(seed=11) as r:
        assert r.registered_all()
        live = []
        for i in range(200):
            if live and rng.random() < 0.45:
                r.kubelet.remove_pod(live.pop(rng.randrange(len(live))))
            try:
                result = r.kubelet.admit(pod(f"p{i}", mem=rng.randint(1, 5), core=rng.choice(range(5, 45, 5))))
            except AdmissionError:
                continue
            c = result.containers[0]
            gpus = {i.split("::")[0] for ids in c.device_ids.values() for i in ids}
            assert len(gpus) == 1, c.device_ids
            assert c.conflicts == []
            live.append(result.pod.uid)


def test_binpack_then_spread() -> None:
    with running(placement="binpack") as r:
        assert r.registered_all()
        idx = [r.kubelet.admit(pod(f"b{i}", mem=3, core=10)).containers[0].envs["ALIYUN_COM_GPU_MEM_IDX"]
               for i in range(6)]
        assert idx == ["0"] * 5 + ["1"]
    with running(placement="spread") as r:
        assert r.registered_all()
        idx = [r.kubelet.admit(pod(f"s{i}", mem=3, core=10)).containers[0].envs["ALIYUN_COM_GPU_MEM_IDX"]
               for i in range(6)]
        assert idx == ["0", "1", "2", "3", "0", "1"]
