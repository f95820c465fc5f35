"""Every overlay under deploy/ renders with `kubectl kustomize`, every object it renders is valid against the
Kubernetes OpenAPI schemas (strict: an unknown field fails), every name one object uses for another resolves
within the render, and daemonset.yaml is the node-only render."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from tests.support.deploy_render import OVERLAYS, TOP_MANIFEST, overlay, overlay_text

# The oldest Kubernetes the manifests support (the validating webhook's matchConditions are GA in 1.30) and the
# newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())

# cert-manager's kinds are not in the Kubernetes schemas: their spec fields as cert-manager.io/v1 defines them.
CERT_MANAGER_SPEC = {
    "Issuer": {"acme", "ca", "vault", "selfSigned", "venafi"},
    "Certificate": {"secretName", "dnsNames", "issuerRef", "isCA", "commonName", "duration", "renewBefore",
                    "privateKey", "usages", "ipAddresses", "uris", "emailAddresses", "subject", "secretTemplate",
                    "keystores", "revisionHistoryLimit", "additionalOutputFormats", "literalSubject",
                    "encodeUsagesInRequest", "nameConstraints", "otherNames", "renewBeforePercentage",
                    "signatureAlgorithm"},
}
SYSTEM_PRIORITY_CLASSES = {"system-node-critical", "system-cluster-critical"}


def check_cert_manager(obj: dict) -> None:
    kind = obj["kind"]
    assert obj["apiVersion"] == "cert-manager.io/v1", obj["apiVersion"]
    assert kind in CERT_MANAGER_SPEC, f"cert-manager kind {kind} is not checked here"
    spec = obj["spec"]
    unknown = set(spec) - CERT_MANAGER_SPEC[kind]
    assert not unknown, f"{kind} {obj['metadata']['name']}: unknown spec fields {sorted(unknown)}"
    if kind == "Certificate":
        assert spec["secretName"] and spec["issuerRef"]["name"]
        assert set(spec["issuerRef"]) <= {"name", "kind", "group"}
    else:
        assert len(spec) == 1, f"Issuer {obj['metadata']['name']} must name exactly one issuer type"


def validate(obj: dict) -> None:
    if obj["apiVersion"].startswith("cert-manager.io/"):
        check_cert_manager(obj)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_rendered_object_is_valid_kubernetes(name: str) -> None:
    objects = overlay(name)
    assert objects
    for obj in objects:
        try:
            validate(obj)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {obj['kind']} {obj['metadata']['name']}: {exc.message}") from None
    keys = [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), f"{name} renders an object twice"


def test_the_validation_refuses_a_misspelt_field() -> None:
    daemonset = copy.deepcopy(next(o for o in overlay("node-only") if o["kind"] == "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="livenesProbe"):
        validate(daemonset)
    certificate = copy.deepcopy(next(o for o in overlay("with-scheduler") if o["kind"] == "Certificate"))
    certificate["spec"]["dnsName"] = ["x"]
    with pytest.raises(AssertionError, match="dnsName"):
        validate(certificate)


def test_overlays_add_up() -> None:
    def kinds(name: str) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in overlay(name)}

    node, extender, second = (kinds(n) for n in OVERLAYS)
    assert ("DaemonSet", "gpushare-devplugin") in node
    assert {k for k, _ in node} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
                                    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ConfigMap",
                                    "NetworkPolicy"}
    assert ("ConfigMap", "gpushare-annotation-writers") in node  # the third-party annotations policy's parameter
    assert node < extender < second
    assert {("Deployment", "devplugin-scheduler"), ("ValidatingWebhookConfiguration", "devplugin-scheduler"),
            ("MutatingWebhookConfiguration", "devplugin-scheduler"), ("Certificate", "devplugin-scheduler")} <= extender
    assert {("Deployment", "gpushare-scheduler"), ("ConfigMap", "gpushare-scheduler-config")} <= second - extender


def _pod_templates(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [(o, o["spec"]["template"]) for o in objects if o["kind"] in ("DaemonSet", "Deployment")]


@pytest.mark.parametrize("name", OVERLAYS)
def test_every_name_an_object_uses_resolves_within_the_render(name: str) -> None:
    objects = overlay(name)
    have = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects}
    certificate_secrets = {(o["metadata"]["namespace"], o["spec"]["secretName"])
                           for o in objects if o["kind"] == "Certificate"}
    for owner, template in _pod_templates(objects):
        ns, spec = owner["metadata"]["namespace"], template["spec"]
        where = f"{name}: {owner['kind']} {owner['metadata']['name']}"
        assert ("ServiceAccount", ns, spec["serviceAccountName"]) in have, where
        assert spec.get("priorityClassName") in SYSTEM_PRIORITY_CLASSES, where
        assert owner["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items(), where
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                secret = volume["secret"]["secretName"]
                assert ("Secret", ns, secret) in have or (ns, secret) in certificate_secrets, f"{where}: {secret}"
            if "configMap" in volume:
                assert ("ConfigMap", ns, volume["configMap"]["name"]) in have, where
        for container in spec["containers"]:
            assert container.get("resources", {}).get("requests"), f"{where}: {container['name']} has no requests"
            mounted = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounted <= {v["name"] for v in spec.get("volumes", [])}, where
    for service in (o for o in objects if o["kind"] == "Service"):
        ns = service["metadata"]["namespace"]
        selected = [t for owner, t in _pod_templates(objects) if owner["metadata"]["namespace"] == ns
                    and service["spec"]["selector"].items() <= t["metadata"]["labels"].items()]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        ports = {p.get("name") for t in selected for c in t["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, f"Service {service['metadata']['name']}: {port['targetPort']}"
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        kind, ref = binding["roleRef"]["kind"], binding["roleRef"]["name"]
        role_ns = binding["metadata"]["namespace"] if kind == "Role" else ""
        builtin = ref.startswith("system:") or ref == "extension-apiserver-authentication-reader"
        assert builtin or (kind, role_ns, ref) in have, f"{binding['metadata']['name']} binds {ref}: not rendered"
        for subject in binding["subjects"]:
            assert ("ServiceAccount", subject["namespace"], subject["name"]) in have, binding["metadata"]["name"]
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"}
    for binding in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"):
        policy = policies[binding["spec"]["policyName"]]
        param_kind, ref = policy["spec"].get("paramKind"), binding["spec"].get("paramRef")
        assert (param_kind is None) == (ref is None), binding["metadata"]["name"]
        if ref is not None:
            assert (param_kind["kind"], ref["namespace"], ref["name"]) in have, binding["metadata"]["name"]
    for config in (o for o in objects if o["kind"].endswith("WebhookConfiguration")):
        for hook in config["webhooks"]:
            svc = hook["clientConfig"]["service"]
            assert ("Service", svc["namespace"], svc["name"]) in have, hook["name"]


def test_daemonset_yaml_is_the_node_only_render() -> None:
    text = TOP_MANIFEST.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")]
    body = "".join(line + "\n" for line in text.splitlines()[len(header):])
    assert any("make manifests" in line for line in header)
    assert body == overlay_text("node-only"), "daemonset.yaml is stale: run `make manifests`"
