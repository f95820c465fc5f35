"""deploy/components/dra renders on top of an overlay: the DeviceClasses, the claim policies with their bindings
and parameter, each object valid against the Kubernetes 1.34+ schemas (resource.k8s.io/v1 is GA from 1.34), and
the example claims of deploy/examples/dra valid too and naming only the component's DeviceClasses. What the
policies refuse is tested on the real apiserver (tests/realk8s/dra/test_claim_policies.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.support.deploy_render import DEPLOY, render_text

VERSIONS = ("1.34.0", kubernetes_validate.latest_version())
EXAMPLES = DEPLOY / "examples" / "dra"


def render_with_dra(tmp_path: Path) -> list[dict]:
    mine = tmp_path / "overlay"
    mine.mkdir()
    rel = os.path.relpath(DEPLOY, mine)
    (mine / "kustomization.yaml").write_text(textwrap.dedent(f"""\
        apiVersion: kustomize.config.k8s.io/v1beta1
        kind: Kustomization
        resources: [{rel}/overlays/node-only]
        components: [{rel}/components/dra]
    """))
    return [d for d in yaml.safe_load_all(render_text(mine)) if d]


def _valid(obj: dict) -> None:
    for version in VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{obj['kind']} {obj['metadata']['name']} ({version}): {exc.message}") from None


def test_the_component_adds_the_classes_and_the_claim_policies(tmp_path: Path) -> None:
    objects = render_with_dra(tmp_path)
    keys = {(o["kind"], o["metadata"]["name"]) for o in objects}
    ours = {("DeviceClass", "gpu.gpushare.io"), ("DeviceClass", "whole.gpu.gpushare.io"),
            ("ValidatingAdmissionPolicy", "gpushare-dra-claims"),
            ("ValidatingAdmissionPolicyBinding", "gpushare-dra-claims"),
            ("ValidatingAdmissionPolicy", "gpushare-dra-claim-memory"),
            ("ValidatingAdmissionPolicyBinding", "gpushare-dra-claim-memory"), ("ConfigMap", "gpushare-dra-limits")}
    assert ours <= keys
    for obj in objects:
        if (obj["kind"], obj["metadata"]["name"]) in ours:
            _valid(obj)
    bindings = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    # the parameter is optional (no ConfigMap: memory is not checked against a maximum), the rules are not
    assert bindings["gpushare-dra-claim-memory"]["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
    assert "paramRef" not in bindings["gpushare-dra-claims"]["spec"]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_each_example_is_valid_and_asks_our_classes(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert any(d["kind"] in ("ResourceClaim", "ResourceClaimTemplate") for d in docs)
    for doc in docs:
        _valid(doc)
        if doc["kind"] not in ("ResourceClaim", "ResourceClaimTemplate"):
            continue
        spec = doc["spec"]["spec"] if doc["kind"] == "ResourceClaimTemplate" else doc["spec"]
        for request in spec["devices"]["requests"]:
            asks = [request["exactly"]] if "exactly" in request else request["firstAvailable"]
            assert {a["deviceClassName"] for a in asks} <= {"gpu.gpushare.io", "whole.gpu.gpushare.io"}


def test_the_install_overlay_of_docs_dra_md_renders_with_the_limit_set(tmp_path: Path) -> None:
    """The overlay docs/guide/dra.md shows: both components, and the patch that sets the largest GPU memory."""
    docs = (DEPLOY.parent / "docs" / "guide" / "dra.md").read_text()
    shown = docs[docs.index("## Install"):]
    shown = shown[shown.index("```yaml\n") + 8:shown.index("```\n", shown.index("```yaml\n"))]
    mine = tmp_path / "overlay"
    mine.mkdir()
    rel = os.path.relpath(DEPLOY.parent, mine)
    (mine / "kustomization.yaml").write_text(shown.replace("../gpushare", rel))
    objects = [d for d in yaml.safe_load_all(render_text(mine)) if d]
    keys = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("DeviceClass", "gpu.gpushare.io"), ("DaemonSet", "gpushare-dra-plugin"),
            ("DaemonSet", "gpushare-devplugin")} <= keys
    (limits,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpushare-dra-limits"]
    assert limits["data"] == {"largestGpuMemory": "80Gi"}
