"""The Helm chart (deploy/helm/gpushare) renders, with `helm template`, the same objects as the kustomize overlays
for the same settings; every object is valid against the Kubernetes schemas as the overlays' are; its values
cover every setting of the node daemon and the scheduler service, and values.schema.json refuses what they
cannot take. Helm is built from the Go module proxy by `make helm` (build/bin/helm)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import textwrap
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from devplugin.app.config import Config
from devplugin.scheduler import service
from tests.deploy.test_render import validate
from tests.support.deploy_render import REPO, overlay, render_text

KUBE_VERSION = "1.30.0"
CHART = REPO / "deploy" / "helm" / "gpushare"
HELM = REPO / "build" / "bin" / "helm"
SETTINGS = {
    "node-only": [],
    "with-scheduler": ["scheduler.enabled=true"],
    "second-scheduler": ["scheduler.enabled=true", "secondScheduler.enabled=true"],
}
# Settings the chart sets from its own values (the volumes, ports and probes use them too).
DAEMON_BY_CHART = {"node_name", "health_port", "metrics_port", "metrics_address", "metrics_auth", "shim_lib",
                   "toolkit_config",
                   "shim_state_dir", "state_dir", "plugin_dir", "pod_resources_socket", "log_format"}
SCHEDULER_BY_CHART = {"address", "port", "tls_cert_file", "tls_private_key_file", "client_ca_file", "plain_http",
                      "log_format", "resource_domain", "leader_elect", "leader_elect_namespace", "leader_elect_name",
                      "leader_elect_identity", "allowed_client_names"}


def helm() -> str:
    found = str(HELM) if HELM.exists() else shutil.which("helm")
    if not found:
        pytest.fail(f"helm not found at {HELM} or on PATH: run `make helm` (go install from the module proxy)")
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    """helm with its own cache and config dirs; templates render for the oldest Kubernetes the chart supports."""
    if args[0] == "template":
        args = (*args, "--kube-version", KUBE_VERSION)
    env = {**os.environ, "HELM_CACHE_HOME": "/tmp/gs-helm/cache", "HELM_CONFIG_HOME": "/tmp/gs-helm/config",
           "HELM_DATA_HOME": "/tmp/gs-helm/data"}
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, env=env)


def render(*sets: str, namespace: str = "kube-system") -> list[dict]:
    args = ["template", "gpushare", str(CHART), "--namespace", namespace]
    for s in sets:  # "json:" for numbers (--set passes 0.5 as a string)
        args += ["--set-json", s[5:]] if s.startswith("json:") else ["--set", s]
    out = run_helm(*args)
    assert out.returncode == 0, f"helm template {' '.join(sets)} failed: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


CEL_KEYS = {"expression", "messageExpression", "message"}


def same_cel(objects: list[dict]) -> list[dict]:
    """CEL expressions and messages (webhook matchConditions, admission policies) with their whitespace collapsed:
    kustomize re-folds `>-` scalars with a blank line before each more-indented line, which CEL ignores."""
    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in CEL_KEYS and isinstance(value, str):
                    node[key] = " ".join(value.split())
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(objects)
    return objects


def by_key(objects: list[dict]) -> dict[tuple[str, str, str], dict]:
    keyed = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects}
    assert len(keyed) == len(objects), "an object is rendered twice"
    return keyed


@pytest.mark.parametrize("name", list(SETTINGS))
def test_the_chart_renders_the_overlay_s_objects(name: str) -> None:
    chart, kustomize = by_key(same_cel(render(*SETTINGS[name]))), by_key(same_cel(overlay(name)))
    assert set(chart) == set(kustomize), (f"only in the chart: {sorted(set(chart) - set(kustomize))}; only in the "
                                          f"overlay: {sorted(set(kustomize) - set(chart))}")
    for key, obj in kustomize.items():
        assert chart[key] == obj, f"{name}: {key} differs:\nchart: {chart[key]}\noverlay: {obj}"


def check_pod_monitor(obj: dict) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PodMonitor"
    spec = obj["spec"]
    assert set(spec) <= {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}
    for ep in spec["podMetricsEndpoints"]:
        assert set(ep) <= {"port", "path", "scheme", "interval", "tlsConfig", "scrapeTimeout", "relabelings",
                           "authorization"}
        assert ep["port"] and ep["path"] == "/metrics"


@pytest.mark.parametrize("sets", [
    ["scheduler.enabled=true", "secondScheduler.enabled=true", "monitoring.podMonitor.enabled=true",
     "daemon.settings.mode=cgpu", "daemon.settings.resourceDomain=example.com", "json:daemon.settings.lookupBudget=0.5",
     "json:scheduler.settings.assumeTtl=60", "scheduler.tls.certManager=false", "scheduler.tls.caBundle=Y2E=",
     "image.pullPolicy=Always"],
    ["monitoring.podMonitor.enabled=true", "daemon.hostPaths.shimState=/run/gpushare"],
], ids=["everything-on", "node-only-monitored"])
def test_every_object_with_other_settings_is_valid_kubernetes(sets: list[str]) -> None:
    objects = render(*sets, namespace="gpu-system")
    for obj in objects:
        if obj["kind"] == "PodMonitor":
            check_pod_monitor(obj)
            continue
        validate(obj)
    keyed = by_key(objects)
    if "scheduler.enabled=true" in sets:
        hook = keyed[("ValidatingWebhookConfiguration", "", "devplugin-scheduler")]
        assert hook["webhooks"][0]["clientConfig"]["caBundle"] == "Y2E="
        assert ("Certificate", "gpu-system", "devplugin-scheduler") not in keyed
        config = yaml.safe_load(keyed[("ConfigMap", "gpu-system", "gpushare-scheduler-config")]["data"]["config.yaml"])
        assert config["extenders"][0]["urlPrefix"] == "https://devplugin-scheduler.gpu-system.svc:443/scheduler"
        assert {r["name"] for r in config["extenders"][0]["managedResources"]} == {
            "example.com/gpu-mem", "example.com/gpu-core.percentage", "example.com/gpu-count"}
        args = keyed[("Deployment", "gpu-system", "devplugin-scheduler")]["spec"]["template"]["spec"]["containers"][0]
        assert "--assume-ttl=60" in args["args"] and "--resource-domain=example.com" in args["args"]
        assert "--leader-elect-namespace=gpu-system" in args["args"]
    ds = keyed[("DaemonSet", "gpu-system", "gpushare-devplugin")]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in ds["containers"][0]["env"]}
    if "daemon.settings.mode=cgpu" in sets:
        assert env["DEVPLUGIN_MODE"] == "cgpu" and env["DEVPLUGIN_RESOURCE_DOMAIN"] == "example.com"
        assert env["DEVPLUGIN_LOOKUP_BUDGET"] == "0.5"
    if "daemon.hostPaths.shimState=/run/gpushare" in sets:
        # the daemon hands host paths to the kubelet: inside its pod the directory sits at the same path
        assert env["DEVPLUGIN_SHIM_STATE_DIR"] == "/run/gpushare"
        mounts = {m["name"]: m["mountPath"] for m in ds["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v}
        assert mounts["shim-state"] == volumes["shim-state"] == "/run/gpushare"


def schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def test_values_cover_every_setting_of_the_daemon_and_the_scheduler() -> None:
    props = schema()["properties"]
    daemon = props["daemon"]["properties"]["settings"]["properties"]
    for f in fields(Config):
        if f.name in DAEMON_BY_CHART:
            continue
        assert camel(f.name) in daemon, f"devplugin serve --{f.name.replace('_', '-')} has no chart value"
        prop, meta = daemon[camel(f.name)], f.metadata
        if meta.get("choices"):
            assert prop["enum"] == list(meta["choices"]), f.name
        if meta.get("maximum") is not None:
            assert prop["maximum"] == meta["maximum"], f.name
        # the chart passes it as the env var the daemon reads
        value = json.dumps(prop["enum"][-1] if "enum" in prop else 1 if prop["type"] != "string" else "1")
        if f.name.endswith("xids"):
            value = '"43"'
        if f.name == "mem_unit":
            value = '"512MiB"'
        objects = render(f"json:daemon.settings.{camel(f.name)}={value}")
        ds = by_key(objects)[("DaemonSet", "kube-system", "gpushare-devplugin")]
        names = {e["name"] for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert Config().env_name(f.name) in names, f.name
    assert set(daemon) == {camel(f.name) for f in fields(Config)} - {camel(n) for n in DAEMON_BY_CHART}
    parser = argparse.ArgumentParser()
    service.add_arguments(parser)
    flags = {a.dest for a in parser._actions if a.dest != "help"}
    sched = props["scheduler"]["properties"]["settings"]["properties"]
    assert set(sched) == {camel(d) for d in flags - SCHEDULER_BY_CHART}


@pytest.mark.parametrize("sets, message", [
    (["daemon.settings.mode=bogus"], "mode"),
    (["daemon.settings.notAFlag=1"], "notAFlag"),
    (["json:daemon.settings.lookupBudget=9"], "lookupBudget"),
    (["daemon.settings.healthPort=1"], "healthPort"),
    (["scheduler.enabled=true", "scheduler.replicas=0"], "replicas"),
    (["secondScheduler.enabled=true"], "needs scheduler.enabled"),
    (["scheduler.enabled=true", "scheduler.tls.certManager=false"], "caBundle"),
    (["dra.enabled=true", "dra.largestGpuMemory=80 GiB"], "largestGpuMemory"),
], ids=["bad-mode", "unknown-setting", "over-maximum", "reserved", "no-replica", "second-alone", "no-ca",
        "dra-not-a-quantity"])
def test_values_the_chart_cannot_take_are_refused_with_the_value_named(sets: list[str], message: str) -> None:
    args = ["template", "gpushare", str(CHART), "--namespace", "kube-system"]
    for s in sets:
        args += ["--set-json", s[5:]] if s.startswith("json:") else ["--set", s]
    out = run_helm(*args)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_monitoring_renders_the_same_pod_monitors_as_the_kustomize_component(tmp_path: Path) -> None:
    mine = tmp_path / "overlay"
    mine.mkdir()
    rel = os.path.relpath(REPO / "deploy", mine)
    (mine / "kustomization.yaml").write_text(textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources: [{rel}/overlays/second-scheduler]
        components: [{rel}/components/monitoring]
    """))
    kustomize = by_key([d for d in yaml.safe_load_all(render_text(mine)) if d])
    chart = by_key(render(*SETTINGS["second-scheduler"], "monitoring.podMonitor.enabled=true"))
    assert set(chart) == set(kustomize)
    monitors = [k for k in kustomize if k[0] == "PodMonitor"]
    assert len(monitors) == 2
    for key in monitors:
        check_pod_monitor(kustomize[key])
        assert chart[key] == kustomize[key], key
    # off by default
    assert not [o for o in render(*SETTINGS["second-scheduler"]) if o["kind"] == "PodMonitor"]


def test_dra_renders_the_same_classes_and_policies_as_the_kustomize_component(tmp_path: Path) -> None:
    mine = tmp_path / "overlay"
    mine.mkdir()
    rel = os.path.relpath(REPO / "deploy", mine)
    (mine / "kustomization.yaml").write_text(textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources: [{rel}/overlays/node-only]
        components: [{rel}/components/dra, {rel}/components/dra-node]
    """))
    kustomize = by_key(same_cel([d for d in yaml.safe_load_all(render_text(mine)) if d]))
    chart = by_key(same_cel(render("dra.enabled=true")))
    assert set(chart) == set(kustomize)
    plugin = [k for k in kustomize if "gpushare-dra-plugin" in k[2]]
    assert len(plugin) == 7, plugin  # the node plugin's DaemonSet, RBAC, slice policy and NetworkPolicy
    for key in plugin:
        assert chart[key] == kustomize[key], key
    ours = {("DeviceClass", "", "gpu.gpushare.io"), ("DeviceClass", "", "whole.gpu.gpushare.io"),
            ("ConfigMap", "kube-system", "gpushare-dra-limits")} | {
        (kind, "", name) for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
        for name in ("gpushare-dra-claims", "gpushare-dra-claim-memory")}
    assert ours <= set(kustomize)
    for key in kustomize:
        assert chart[key] == kustomize[key], key
    # off by default; the limit is the ConfigMap's, in the release's namespace, named in the policy's messages
    assert not [o for o in render() if o["kind"] == "DeviceClass"]
    keyed = by_key(render("dra.enabled=true", "dra.largestGpuMemory=80Gi", namespace="gpu-system"))
    assert keyed[("ConfigMap", "gpu-system", "gpushare-dra-limits")]["data"] == {"largestGpuMemory": "80Gi"}
    binding = keyed[("ValidatingAdmissionPolicyBinding", "", "gpushare-dra-claim-memory")]
    assert binding["spec"]["paramRef"]["namespace"] == "gpu-system"
    policy = json.dumps(keyed[("ValidatingAdmissionPolicy", "", "gpushare-dra-claim-memory")])
    assert "ConfigMap gpu-system/gpushare-dra-limits" in policy and "kube-system" not in policy
    own = keyed[("ValidatingAdmissionPolicy", "", "gpushare-dra-plugin-own-slices")]["spec"]["matchConditions"][0]
    assert own["expression"] == 'request.userInfo.username == "system:serviceaccount:gpu-system:gpushare-dra-plugin"'
    assert ("DaemonSet", "gpu-system", "gpushare-dra-plugin") in keyed


def notes(tmp_path: Path, *sets: str) -> str:
    """templates/NOTES.txt as `helm install` prints it (helm template leaves NOTES out, and install needs a
    cluster): a copy of the chart renders it through `tpl` into a ConfigMap."""
    chart = tmp_path / "gpushare"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
    (chart / "templates" / "notes-check.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        "data: {notes: {{ tpl (.Files.Get \"notes.txt\") . | quote }}}\n")
    args = ["template", "gpushare", str(chart), "--namespace", "kube-system", "--show-only",
            "templates/notes-check.yaml"]
    for s in sets:
        args += ["--set", s]
    out = run_helm(*args)
    assert out.returncode == 0, out.stderr
    return str(yaml.safe_load(out.stdout)["data"]["notes"])


def test_notes_say_which_label_to_set_next(tmp_path: Path) -> None:
    text = notes(tmp_path)
    assert "kubectl label node <node> ack.node.gpu.schedule=core_mem" in text
    assert "aliyun.com/gpu-mem" in text and "extender" not in text
    text = notes(tmp_path / "second", "scheduler.enabled=true", "secondScheduler.enabled=true")
    assert "spec.schedulerName: gpushare-scheduler" in text and "cert-manager" in text


def test_annotation_writers_are_the_third_party_policys_parameter() -> None:
    """`annotationWriters` lists the users the policy gpushare-third-party-annotations lets write another
    scheduler's choice annotations: the ConfigMap its binding names, in the release's namespace."""
    writers = ["system:serviceaccount:gpu-system:volcano-scheduler", "system:kube-scheduler"]
    keyed = by_key(render(f"json:annotationWriters={json.dumps(writers)}", namespace="gpu-system"))
    binding = keyed[("ValidatingAdmissionPolicyBinding", "", "gpushare-third-party-annotations")]
    ref = binding["spec"]["paramRef"]
    assert (ref["namespace"], ref["parameterNotFoundAction"]) == ("gpu-system", "Deny")
    config = keyed[("ConfigMap", "gpu-system", ref["name"])]
    assert config["data"]["usernames"].split("\n") == [*writers, ""]
    policy = keyed[("ValidatingAdmissionPolicy", "", "gpushare-third-party-annotations")]
    assert "gpu-system/gpushare-annotation-writers" in policy["spec"]["validations"][0]["messageExpression"]
    args = ["template", "gpushare", str(CHART), "--namespace", "kube-system", "--set-json", 'annotationWriters=["a b"]']
    out = run_helm(*args)
    assert out.returncode != 0 and "annotationWriters" in out.stderr, out.stderr
