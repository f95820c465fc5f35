"""`make demo-cluster` tells the fragmentation story and exits 0: the default scheduler's choice fails on the
node, the extender's succeeds on the GPU it chose, inspect shows it."""

from __future__ import annotations

import pytest

from devplugin_sim.demo_extender import run


def test_demo_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert run() == 0
    out = capsys.readouterr().out
    assert "and picks gpu-node-1 (the most free memory)" in out
    assert "the kubelet on gpu-node-1 fails it (UnexpectedAdmissionError)" in out
    assert "ResourceExhausted" in out  # the node daemon's refusal, in the kubelet's words
    assert "gpu-node-1: GPU 0..3: at most 3 GiB free on one GPU, 6 GiB asked" in out
    assert "bound to gpu-node-2, gpushare.io/scheduled: GPU [3]" in out
    assert "the node daemon puts it on GPU 3" in out
    assert "default/train (main)  6 GiB  0 %  allocated" in out
    assert all(len(line) <= 80 for line in out.splitlines())
