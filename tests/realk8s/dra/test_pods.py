"""On the real kube-apiserver, with deploy/components/dra-node's RBAC and a token bound to its node as the
DaemonSet mounts it, `devplugin dra`'s watch of the pods bound to its node (devplugin/dra/pods.py) lists and
watches them: the conflict check at prepare reads the pods a claim is reserved for from it, not with a GET each."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from devplugin.dra.pods import PodsOnNode
from devplugin.kube.client import load_api_client
from tests.deploy.test_dra_node_component import COMPONENT, KUBECTL, kubectl
from tests.realk8s import kubeconfigs
from tests.realk8s.apiserver import bare_apiserver

pytestmark = pytest.mark.realk8s


def create(kc: Path, obj: dict) -> dict:
    out = subprocess.run([str(KUBECTL), "--kubeconfig", str(kc), "create", "-o", "yaml", "-f", "-"], check=True,
                         input=yaml.safe_dump(obj), text=True, capture_output=True).stdout
    return dict(yaml.safe_load(out))


def test_the_plugins_token_lists_and_watches_the_pods_bound_to_its_node() -> None:
    root = Path(tempfile.mkdtemp(prefix="gs-drapods-", dir="/tmp"))
    try:
        with bare_apiserver(root, "admintoken") as api:
            kc = api.kubeconfig
            kubectl(kc, "apply", "-f", str(COMPONENT / "rbac.yaml"))
            create(kc, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}})
            create(kc, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default",
                                                                                   "namespace": "default"}})
            token = kubectl(kc, "-n", "kube-system", "create", "token", "gpushare-dra-plugin",
                            "--bound-object-kind", "Node", "--bound-object-name", "node-a").strip()
            path = kubeconfigs.write(root / "kc-plugin", api.server, None, "plugin", token=token)
            pods = PodsOnNode(load_api_client(str(path)), "node-a").start()
            try:
                pod = create(kc, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                                  "spec": {"nodeName": "node-a", "automountServiceAccountToken": False,
                                           "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}],
                                           "containers": [{"name": "main", "image": "cuda",
                                                           "resources": {"claims": [{"name": "gpu"}]}}]}})
                uid = pod["metadata"]["uid"]
                deadline = time.monotonic() + 30
                while pods.get("default", "p", uid) is None:
                    assert time.monotonic() < deadline, "the plugin's watch never showed the pod bound to its node"
                    time.sleep(0.1)
                seen = pods.get("default", "p", uid)
                assert seen is not None and seen["spec"]["containers"] == [
                    {"name": "main", "resources": {"claims": [{"name": "gpu"}]}}]
            finally:
                pods.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
