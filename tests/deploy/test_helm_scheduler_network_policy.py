"""The chart's scheduler.networkPolicy renders the NetworkPolicy of deploy/scheduler/network-policy/ with the same
control-plane hosts; off by default in both, and the release's namespace is let in when it is not kube-system."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.test_helm_chart import SETTINGS, by_key, render
from tests.deploy.test_render import validate
from tests.deploy.test_scheduler_overlays import network_policy_overlay

KEY = ("NetworkPolicy", "kube-system", "devplugin-scheduler")


def test_the_chart_renders_the_components_network_policy(tmp_path: Path) -> None:
    kustomize = by_key(network_policy_overlay(tmp_path / "mine", "10.0.0.0/24"))
    chart = by_key(render(*SETTINGS["second-scheduler"], "scheduler.networkPolicy.enabled=true",
                          'json:scheduler.networkPolicy.from=[{"ipBlock": {"cidr": "10.0.0.0/24"}}]'))
    assert set(chart) == set(kustomize)
    assert chart[KEY] == kustomize[KEY]
    assert KEY not in by_key(render(*SETTINGS["second-scheduler"]))  # off by default, as in the overlays


def test_the_release_namespace_is_let_in_too() -> None:
    objects = by_key(render("scheduler.enabled=true", "scheduler.networkPolicy.enabled=true", namespace="gpu-system"))
    policy = objects[("NetworkPolicy", "gpu-system", "devplugin-scheduler")]
    validate(policy)
    assert [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for peer in policy["spec"]["ingress"][0]["from"]] == ["kube-system", "gpu-system"]
