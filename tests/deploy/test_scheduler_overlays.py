"""The scheduler overlays, as rendered: the extender's Deployment, Service, certificates and webhooks fit together,
the KubeSchedulerConfigurations call the extender for the three resources, and deploy/gen-certs.sh makes a serving
pair the webhooks and kube-scheduler accept, with an overlay that uses it instead of cert-manager's."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from devplugin import contract as c
from devplugin.scheduler.http import EXTENDER_PREFIX
from tests.deploy.test_rbac import PROGRAMS, REPO, client_uses, closure
from tests.deploy.test_render import validate
from tests.support.deploy_render import DEPLOY, find, overlay, render_text, service_dns

RESOURCES = {f"{c.DEFAULT_RESOURCE_DOMAIN}/{r}" for r in (c.RESOURCE_MEM, c.RESOURCE_CORE, c.RESOURCE_COUNT)}
EXTENDER_FIELDS = {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS",
                   "tlsConfig", "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable"}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return overlay("second-scheduler")


def scheduler_parts(objects: list[dict]) -> tuple[dict, dict, dict]:
    deployment = find(objects, "Deployment", "devplugin-scheduler")
    service = find(objects, "Service", "devplugin-scheduler")
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, service, container


def test_two_extender_replicas_elect_one_leader_on_a_lease_they_may_write(objects: list[dict]) -> None:
    # Two replicas, one decider: only the Lease holder binds and is Ready. A rolling update would wait forever for
    # followers to become Ready, so the strategy is Recreate (the old leader releases the Lease when stopped).
    methods = client_uses(closure(REPO, PROGRAMS["devplugin-scheduler"])).methods
    assert "replace_namespaced_lease" in methods
    deployment, service, container = scheduler_parts(objects)
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-elect" in container["args"] and "--leader-elect-name=devplugin-scheduler" in container["args"]
    assert container["env"] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    role = find(objects, "Role", "devplugin-scheduler-leader-election")
    assert any(r.get("resourceNames") == ["devplugin-scheduler"] and set(r["verbs"]) == {"get", "update"}
               for r in role["rules"])
    assert not [o for o in objects if o["kind"] == "Service" and o["spec"].get("type") == "NodePort"]


def test_the_extenders_verbs_answer_only_kube_schedulers_client_certificate(objects: list[dict]) -> None:
    _, _, container = scheduler_parts(objects)
    assert "--client-ca-file=/etc/devplugin/tls/ca.crt" in container["args"]
    assert "--allowed-client-names=kube-scheduler" in container["args"]
    client = find(objects, "Certificate", "devplugin-scheduler-client")
    assert client["spec"]["commonName"] == "kube-scheduler" and "client auth" in client["spec"]["usages"]
    serving = find(objects, "Certificate", "devplugin-scheduler")
    assert client["spec"]["issuerRef"] == serving["spec"]["issuerRef"]  # the CA the service checks callers with
    for name, config in kube_scheduler_configs(objects).items():
        tls = config["extenders"][0]["tlsConfig"]
        assert tls["certFile"] and tls["keyFile"], name


def test_the_service_serves_tls_from_the_certificate_for_its_own_dns_name(objects: list[dict]) -> None:
    deployment, service, container = scheduler_parts(objects)
    spec = deployment["spec"]["template"]["spec"]
    certificate = find(objects, "Certificate", "devplugin-scheduler")
    assert service_dns(service) in certificate["spec"]["dnsNames"]
    [tls] = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == certificate["spec"]["secretName"]]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == tls["name"]]
    assert f"--tls-cert-file={mount['mountPath']}/tls.crt" in container["args"]
    assert f"--tls-private-key-file={mount['mountPath']}/tls.key" in container["args"]
    issuer = find(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    [ca] = [o for o in objects if o["kind"] == "Certificate"  # the CA the issuer signs with, itself self-signed
            and o["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]]
    assert ca["spec"]["isCA"] is True
    assert find(objects, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"] == {"selfSigned": {}}


def test_webhooks_spare_the_control_plane_and_answer_in_time(objects: list[dict]) -> None:
    _, service, _ = scheduler_parts(objects)
    spared = {"kube-system", service["metadata"]["namespace"]}  # the project's namespace, where the service runs
    validating = find(objects, "ValidatingWebhookConfiguration")
    mutating = find(objects, "MutatingWebhookConfiguration")
    assert {h["failurePolicy"] for h in validating["webhooks"]} == {"Fail"}  # a webhook failing open is bypassed
    # the mutating one sees every pod outside the spared namespaces: failing closed would stop all pod creation
    # while the service restarts; what it does (NVIDIA_VISIBLE_DEVICES=void) is a convenience, not a rule
    assert [h["failurePolicy"] for h in mutating["webhooks"]] == ["Ignore"]
    for config in (validating, mutating):
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{service['metadata']['namespace']}/devplugin-scheduler")
        for hook in config["webhooks"]:
            assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
            assert 1 <= hook["timeoutSeconds"] <= 10, hook["name"]
            assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
            assert hook["clientConfig"]["service"]["port"] in {p["port"] for p in service["spec"]["ports"]}
            excluded = [e for e in hook["namespaceSelector"]["matchExpressions"]
                        if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
            assert excluded and spared <= set(excluded[0]["values"]), hook["name"]


def kube_scheduler_configs(objects: list[dict]) -> dict[str, dict]:
    host = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config.yaml").read_text())
    configmap = find(objects, "ConfigMap", "gpushare-scheduler-config")
    return {"default scheduler (host file)": host, "second scheduler": yaml.safe_load(configmap["data"]["config.yaml"])}


def test_kube_scheduler_configurations_call_the_extender_for_the_three_resources(objects: list[dict]) -> None:
    _, service, _ = scheduler_parts(objects)
    urls = {"default scheduler (host file)": f"https://{service_dns(service)}:443{EXTENDER_PREFIX}",
            "second scheduler": f"https://{service_dns(service)}:443{EXTENDER_PREFIX}"}
    certificate = find(objects, "Certificate", "devplugin-scheduler")
    for name, config in kube_scheduler_configs(objects).items():
        assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1", name
        assert config["kind"] == "KubeSchedulerConfiguration", name
        [ext] = config["extenders"]
        assert set(ext) <= EXTENDER_FIELDS, f"{name}: unknown extender fields {set(ext) - EXTENDER_FIELDS}"
        assert ext["urlPrefix"] == urls[name]
        assert {m["name"] for m in ext["managedResources"]} == RESOURCES
        assert not any(m["ignoredByScheduler"] for m in ext["managedResources"])  # kube-scheduler checks totals
        assert ext["ignorable"] is False  # an unreachable extender holds GPU pods back, never misplaces them
        assert ext["bindVerb"] == "bind" and ext["nodeCacheCapable"] is True
        assert ext["enableHTTPS"] is True and ext["tlsConfig"]["serverName"] in certificate["spec"]["dnsNames"]
        assert "insecure" not in ext["tlsConfig"] and ext["tlsConfig"]["caFile"]


def test_the_second_scheduler_can_take_its_leader_lease_and_reads_the_ca(objects: list[dict]) -> None:
    config = kube_scheduler_configs(objects)["second scheduler"]
    lease = config["leaderElection"]["resourceName"]
    deployment = find(objects, "Deployment", "gpushare-scheduler")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    roles = [find(objects, "Role", b["roleRef"]["name"]) for b in objects if b["kind"] == "RoleBinding"
             and b["roleRef"]["kind"] == "Role" and {"kind": "ServiceAccount", "name": account,
                                                     "namespace": "kube-system"} in b["subjects"]
             and b["roleRef"]["name"] != "extension-apiserver-authentication-reader"]
    rules = [r for role in roles for r in role["rules"] if "leases" in r["resources"]]
    assert any(lease in r.get("resourceNames", []) and {"get", "update"} <= set(r["verbs"]) for r in rules), (
        "system:kube-scheduler only lets a scheduler take the lease named kube-scheduler")
    spec = deployment["spec"]["template"]["spec"]
    [container] = spec["containers"]
    ca_file = Path(config["extenders"][0]["tlsConfig"]["caFile"])
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(ca_file.parent)]
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == find(objects, "Certificate", "devplugin-scheduler")["spec"]["secretName"]
    assert {"key": "ca.crt", "path": ca_file.name} in volume["secret"]["items"]


def test_the_apiserver_has_a_client_certificate_for_the_webhooks(objects: list[dict]) -> None:
    # Issued whether or not the cluster uses it: --webhook-client-names=kube-apiserver turns it on, once every
    # apiserver's AdmissionConfiguration presents it (docs/guide/install.md).
    _, _, container = scheduler_parts(objects)
    assert not [a for a in container["args"] if a.startswith("--webhook-client-names")]  # anyone, by default
    apiserver = find(objects, "Certificate", "devplugin-scheduler-apiserver")
    assert apiserver["spec"]["commonName"] == "kube-apiserver" and "client auth" in apiserver["spec"]["usages"]
    assert apiserver["spec"]["issuerRef"] == find(objects, "Certificate", "devplugin-scheduler")["spec"]["issuerRef"]


def network_policy_overlay(directory: Path, cidr: str) -> list[dict]:
    """overlays/second-scheduler with the component deploy/scheduler/network-policy and the control-plane hosts'
    `cidr` added as the component's comment shows."""
    directory.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(DEPLOY, directory)
    (directory / "kustomization.yaml").write_text(textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources: [{rel}/overlays/second-scheduler]
        components: [{rel}/scheduler/network-policy]
        patches:
          - target: {{kind: NetworkPolicy, name: devplugin-scheduler}}
            patch: |-
              - {{op: add, path: /spec/ingress/0/from/-, value: {{ipBlock: {{cidr: {cidr}}}}}}}
    """))
    return [d for d in yaml.safe_load_all(render_text(directory)) if d]


def test_the_network_policy_lets_only_kube_system_pods_and_the_control_plane_hosts_reach_the_service(
        tmp_path: Path, objects: list[dict]) -> None:
    assert not [o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "devplugin-scheduler"]
    rendered = network_policy_overlay(tmp_path / "mine", "10.0.0.0/24")
    policy = find(rendered, "NetworkPolicy", "devplugin-scheduler")
    validate(policy)
    deployment, service, container = scheduler_parts(rendered)
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    [rule] = policy["spec"]["ingress"]  # one rule: no other port, no other peer
    assert rule["ports"] == [{"port": p["targetPort"], "protocol": "TCP"} for p in service["spec"]["ports"]]
    assert {p["name"] for p in container["ports"]} == {p["port"] for p in rule["ports"]}
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}, "podSelector": {}},
        {"ipBlock": {"cidr": "10.0.0.0/24"}}]
    # the second scheduler, a pod, is among those let in
    second = find(rendered, "Deployment", "gpushare-scheduler")
    assert second["metadata"]["namespace"] == "kube-system" and not second["spec"]["template"]["spec"].get(
        "hostNetwork")


# --- deploy/gen-certs.sh --------------------------------------------------------------------------------------------

def openssl(*args: str, stdin: bytes | None = None) -> str:
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, check=True, timeout=30).stdout.decode()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    out = tmp_path_factory.mktemp("certs") / "tls"
    subprocess.run([str(DEPLOY / "gen-certs.sh"), str(out), str(DEPLOY / "overlays" / "second-scheduler")],
                   check=True, capture_output=True, timeout=120)
    return out


def test_gen_certs_makes_a_serving_pair_for_the_service_signed_by_its_ca(generated: Path, objects: list[dict]) -> None:
    _, service, _ = scheduler_parts(objects)
    san = openssl("x509", "-in", str(generated / "tls.crt"), "-noout", "-ext", "subjectAltName")
    assert f"DNS:{service_dns(service)}," in san and f"DNS:{service_dns(service)}.cluster.local" in san
    assert openssl("verify", "-CAfile", str(generated / "ca.crt"), str(generated / "tls.crt")).strip().endswith("OK")
    usage = openssl("x509", "-in", str(generated / "tls.crt"), "-noout", "-ext", "extendedKeyUsage,basicConstraints")
    assert "TLS Web Server Authentication" in usage and "CA:FALSE" in usage
    key_pub = openssl("pkey", "-in", str(generated / "tls.key"), "-pubout")
    cert_pub = openssl("x509", "-in", str(generated / "tls.crt"), "-noout", "-pubkey")
    assert key_pub == cert_pub
    assert (generated / "ca.key").stat().st_mode & 0o077 == 0  # the CA key is the owner's alone
    # the apiserver's client certificate for the webhooks, signed by the same CA
    subject = openssl("x509", "-in", str(generated / "apiserver.crt"), "-noout", "-subject").strip()
    assert subject == "subject=CN = kube-apiserver"
    assert "TLS Web Client Authentication" in openssl("x509", "-in", str(generated / "apiserver.crt"), "-noout",
                                                      "-ext", "extendedKeyUsage")
    assert openssl("verify", "-CAfile", str(generated / "ca.crt"), str(generated / "apiserver.crt")).strip().endswith(
        "OK")


def test_gen_certs_overlay_replaces_cert_manager_with_the_secret_and_the_ca_bundle(
        generated: Path, objects: list[dict]) -> None:
    rendered = [d for d in yaml.safe_load_all(render_text(generated)) if d]
    assert not [o for o in rendered if o["apiVersion"].startswith("cert-manager.io/")]
    for obj in rendered:
        validate(obj)
    ca = (generated / "ca.crt").read_bytes()
    _, _, container = scheduler_parts(rendered)
    secret_name = find(objects, "Certificate", "devplugin-scheduler")["spec"]["secretName"]
    secret = find(rendered, "Secret", secret_name)
    assert secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["ca.crt"]) == ca
    assert base64.b64decode(secret["data"]["tls.crt"]) == (generated / "tls.crt").read_bytes()
    for config in (o for o in rendered if o["kind"].endswith("WebhookConfiguration")):
        assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
        for hook in config["webhooks"]:
            assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca, hook["name"]
    # everything else is the overlay's, unchanged
    client = find(rendered, "Secret", "devplugin-scheduler-client")
    assert base64.b64decode(client["data"]["tls.crt"]) == (generated / "client.crt").read_bytes()
    assert openssl("verify", "-CAfile", str(generated / "ca.crt"), str(generated / "client.crt")).strip().endswith("OK")
    subject = openssl("x509", "-in", str(generated / "client.crt"), "-noout", "-subject").strip()
    assert subject == "subject=CN = kube-scheduler"
    others = {(o["kind"], o["metadata"]["name"]) for o in rendered} - {("Secret", secret_name),
                                                                         ("Secret", "devplugin-scheduler-client")}
    assert others == {(o["kind"], o["metadata"]["name"]) for o in objects
                      if not o["apiVersion"].startswith("cert-manager.io/")}


def test_gen_certs_keeps_the_ca_when_run_again(generated: Path) -> None:
    ca, serving = (generated / "ca.crt").read_bytes(), (generated / "tls.crt").read_bytes()
    subprocess.run([str(DEPLOY / "gen-certs.sh"), str(generated), str(DEPLOY / "overlays" / "second-scheduler")],
                   check=True, capture_output=True, timeout=120)
    assert (generated / "ca.crt").read_bytes() == ca  # kube-scheduler hosts keep trusting the renewed pair
    assert (generated / "tls.crt").read_bytes() != serving
    assert openssl("verify", "-CAfile", str(generated / "ca.crt"), str(generated / "tls.crt")).strip().endswith("OK")


def test_gen_certs_names_what_is_wrong(tmp_path: Path) -> None:
    bad = subprocess.run([str(DEPLOY / "gen-certs.sh"), str(tmp_path / "o"), str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "has no kustomization.yaml" in bad.stderr
    usage = subprocess.run([str(DEPLOY / "gen-certs.sh")], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage:" in usage.stderr
