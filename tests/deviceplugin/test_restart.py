"""A restarted daemon learns from the kubelet's PodResources API which devices containers already hold."""

from __future__ import annotations

import pytest

from devplugin_sim.kubelet import AdmissionError
from tests.deviceplugin.test_kubelet_admission import pod
from tests.support.daemon_harness import COUNT, running


def test_restarted_daemon_does_not_hand_out_a_shared_gpu_whole() -> None:
    with running() as r:
        assert r.registered_all()
        shared = r.kubelet.admit(pod("shared", mem=2, core=10)).containers[0]
        assert shared.envs["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        r.nd.stop()
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(COUNT, 0) == 0, timeout=10)
        r.restart_daemon()
        assert r.registered_all()
        # the shared GPU's gpu-count device is reported Unhealthy: the kubelet itself sees 3 whole GPUs
        assert r.kubelet.wait_for(lambda k: k.allocatable().get(COUNT) == 3, timeout=10)
        with pytest.raises(AdmissionError, match="Requested: 4, Available: 3"):
            r.kubelet.admit(pod("all-four", count=4))
        whole = r.kubelet.admit(pod("three", count=3)).containers[0]
        assert "0" not in whole.envs["ALIYUN_COM_GPU_MEM_IDX"].split(",")
