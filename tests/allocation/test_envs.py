"""The env a container gets: the seed's 2 GiB / 30 % job, and equal values for keys two resources both set."""

from __future__ import annotations

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.units import Kind
from tests.support.nodes import MiniKubelet, make_node

MEM, CORE = Kind.MEM, Kind.CORE


def test_seed_job_envs_core_mem() -> None:
    node = make_node()
    k = MiniKubelet(node, Allocator(node))
    g = k.admit({MEM: 2, CORE: 30}, order=[CORE, MEM])
    gpu = node.gpus[0]
    assert g[MEM].envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu.uuid,
        "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_DEV": "15",
        "ALIYUN_COM_GPU_MEM_UNIT": "GiB",
        "ALIYUN_COM_GPU_MEM_CONTAINER": "2",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "2048m",
    }
    assert g[CORE].envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    shared = set(g[MEM].envs) & set(g[CORE].envs)
    assert shared and all(g[MEM].envs[key] == g[CORE].envs[key] for key in shared)


def test_units_below_a_gib() -> None:
    node = make_node(unit_mib=256)
    k = MiniKubelet(node, Allocator(node))
    g = k.admit({MEM: 6, CORE: 5})
    assert g[MEM].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1536m"
    assert g[MEM].envs["ALIYUN_COM_GPU_MEM_DEV"] == "60"
    assert g[MEM].envs["ALIYUN_COM_GPU_MEM_UNIT"] == "256MiB"


def test_share_mode_sets_no_enforced_limit() -> None:
    node = make_node(mode="share")
    k = MiniKubelet(node, Allocator(node))
    envs = k.admit({MEM: 3})[MEM].envs
    assert envs["ALIYUN_COM_GPU_MEM_CONTAINER"] == "3"
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in envs


def test_whole_gpus() -> None:
    node = make_node()
    k = MiniKubelet(node, Allocator(node))
    envs = k.admit({Kind.COUNT: 2})[Kind.COUNT].envs
    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{node.gpus[0].uuid},{node.gpus[1].uuid}"
    assert envs["ALIYUN_COM_GPU_MEM_IDX"] == "0,1"
