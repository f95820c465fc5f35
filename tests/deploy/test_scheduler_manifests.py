"""The shipped manifests say what the service expects: paths, fail-closed policies, the extender's settings."""

from __future__ import annotations

from pathlib import Path

import yaml

from devplugin.scheduler.http import EXTENDER_PREFIX, Service, build_app
from devplugin.scheduler.state import ClusterState

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "scheduler"
RESOURCES = {"aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def routes() -> set[str]:
    return {r.path for r in build_app(Service(ClusterState(), None)).routes}


def extender_configs() -> list[dict]:
    configs = [docs("kube-scheduler-config.yaml")[0],
               yaml.safe_load(docs("../overlays/second-scheduler/second-scheduler.yaml")[0]["data"]["config.yaml"])]
    for c in configs:
        assert c["apiVersion"] == "kubescheduler.config.k8s.io/v1" and c["kind"] == "KubeSchedulerConfiguration"
    return configs


def test_extender_config_matches_the_service_and_kube_schedulers_rules() -> None:
    for config in extender_configs():
        (ext,) = config["extenders"]
        assert ext["urlPrefix"].rstrip("/").endswith(EXTENDER_PREFIX)
        for verb in ("filterVerb", "prioritizeVerb", "preemptVerb", "bindVerb"):
            assert f"{EXTENDER_PREFIX}/{ext[verb]}" in routes()
        assert ext["weight"] > 0  # kube-scheduler refuses a prioritizeVerb without a positive weight
        assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False and ext["enableHTTPS"] is True
        assert ext["tlsConfig"]["serverName"] == "devplugin-scheduler.kube-system.svc"
        assert {m["name"] for m in ext["managedResources"]} == RESOURCES
        assert len(ext["managedResources"]) == len(RESOURCES)
    second = extender_configs()[1]
    assert second["profiles"] == [{"schedulerName": "gpushare-scheduler"}]


def test_webhooks_fail_closed_where_it_matters_and_spare_kube_system() -> None:
    validating, mutating = docs("webhooks.yaml")
    assert validating["kind"] == "ValidatingWebhookConfiguration"
    v, void = validating["webhooks"]
    (m,) = mutating["webhooks"]
    assert v["failurePolicy"] == "Fail" and m["failurePolicy"] == "Ignore"
    # the void the mutating webhook adds, enforced by a webhook that fails closed over the same namespaces
    assert void["name"] == "void.gpushare.io" and void["failurePolicy"] == "Fail"
    assert void["clientConfig"]["service"]["path"] == "/admission/validate-void"
    assert void["namespaceSelector"] == m["namespaceSelector"]
    for hook in (v, void, m):
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        assert 1 <= hook["timeoutSeconds"] <= 30
        assert hook["clientConfig"]["service"]["path"] in routes()
        assert hook["rules"][0]["resources"] == ["pods"] and hook["rules"][0]["operations"] == ["CREATE"]
        # kubectl debug adds ephemeral containers by UPDATE of this subresource: they are seen too
        assert hook["rules"][1]["resources"] == ["pods/ephemeralcontainers"] and hook["rules"][1]["operations"] == [
            "UPDATE"]
        spared = hook["namespaceSelector"]["matchExpressions"][0]
        assert spared == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
    assert {"key": "gpushare.io/visible-devices", "operator": "NotIn", "values": ["keep"]} in (
        m["namespaceSelector"]["matchExpressions"])
    assert "matchConditions" not in v  # every pod, with or without a GPU request (docs/reference/security.md, item 2)


def test_deployment_serves_tls_from_the_certificates_secret() -> None:
    deployment, service = docs("deployment.yaml")
    spec = deployment["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["command"] == ["devplugin", "scheduler"]
    assert "--tls-cert-file=/etc/devplugin/tls/tls.crt" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] in routes() and c["livenessProbe"]["httpGet"]["path"] in routes()
    certificate = next(d for d in docs("certificate.yaml") if d["metadata"]["name"] == "devplugin-scheduler")
    assert spec["volumes"][0]["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert "devplugin-scheduler.kube-system.svc" in certificate["spec"]["dnsNames"]
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"  # no NodePort: the verbs are kube-scheduler's
    assert "--client-ca-file=/etc/devplugin/tls/ca.crt" in c["args"] and "--leader-elect" in c["args"]
    assert spec["serviceAccountName"] == docs("rbac.yaml")[0]["metadata"]["name"]
    rules = docs("rbac.yaml")[1]["rules"]
    assert any("pods/binding" in r["resources"] and r["verbs"] == ["create"] for r in rules)
