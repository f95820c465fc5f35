"""Least privilege: each ServiceAccount is granted exactly the API verbs its code calls, no more and no less.

The verbs are derived from the code: every module the program can import (from its entry module, lazy imports
included) is read for the methods it takes from a kubernetes client API object (`client.CoreV1Api(...)` and the
like), and each method maps to a (group, resource, verb) through METHODS below. A method missing from the table
fails the test, so a new call cannot slip past it; a grant the code does not use fails it too.
"""

from __future__ import annotations

import ast
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from tests.support.deploy_render import REPO, overlay

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)

# kubernetes client method -> (apiGroup, resource, verbs). list_* methods feed LIST+WATCH loops: they count for
# "watch" too when the program calls a list function with watch=True (devplugin/kube/watch_loop.py,
# devplugin/scheduler/informer.py).
METHODS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "list_pod_for_all_namespaces": ("", "pods", ("list",)),
    "list_namespaced_pod": ("", "pods", ("list",)),
    "read_namespaced_pod": ("", "pods", ("get",)),
    "patch_namespaced_pod": ("", "pods", ("patch",)),
    "replace_namespaced_pod": ("", "pods", ("update",)),
    "delete_namespaced_pod": ("", "pods", ("delete",)),
    "patch_namespaced_pod_status": ("", "pods/status", ("patch",)),
    "create_namespaced_pod_binding": ("", "pods/binding", ("create",)),
    "create_namespaced_binding": ("", "bindings", ("create",)),
    "create_namespaced_pod_eviction": ("", "pods/eviction", ("create",)),
    "list_node": ("", "nodes", ("list",)),
    "read_node": ("", "nodes", ("get",)),
    "patch_node": ("", "nodes", ("patch",)),
    "replace_node": ("", "nodes", ("update",)),
    "patch_node_status": ("", "nodes/status", ("patch",)),
    "create_namespaced_event": ("", "events", ("create",)),
    "patch_namespaced_event": ("", "events", ("patch",)),
    "list_namespaced_event": ("", "events", ("list",)),
    "read_namespaced_config_map": ("", "configmaps", ("get",)),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", ("get",)),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", ("create",)),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", ("update",)),
    "patch_namespaced_lease": ("coordination.k8s.io", "leases", ("patch",)),
    "create_token_review": ("authentication.k8s.io", "tokenreviews", ("create",)),
    "create_subject_access_review": ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
}
API_CLASSES = {name for name in dir(client) if name.endswith("Api") and name != "ApiClient"}

# The programs and who they run as (ServiceAccounts of deploy/overlays/with-scheduler).
PROGRAMS = {
    "gpushare-devplugin": "devplugin.app.serve",  # devplugin serve: the node daemon
    "devplugin-scheduler": "devplugin.scheduler.service",  # devplugin scheduler: extender and webhooks
}


@dataclass
class Uses:
    methods: dict[str, list[str]]  # client method -> "module:line" where it is taken
    watches: bool  # some call passes watch=True


def module_path(root: Path, name: str) -> Path | None:
    base = root / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Every module name the source imports, at any depth (lazy imports in functions too)."""
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def closure(root: Path, entry: str, prefix: str = "devplugin") -> dict[str, ast.Module]:
    """The modules under `prefix` that `entry` can import, parsed."""
    seen: dict[str, ast.Module] = {}
    todo = deque([entry])
    while todo:
        name = todo.popleft()
        path = module_path(root, name)
        if name in seen or path is None:
            continue
        tree = ast.parse(path.read_text(), str(path))
        seen[name] = tree
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        for dep in [*_imported(tree, name, path.name == "__init__.py"), *parents]:
            if dep == prefix or dep.startswith(prefix + "."):
                todo.append(dep)
    return seen


def _is_api_construction(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in API_CLASSES


def client_uses(modules: dict[str, ast.Module]) -> Uses:
    """The client methods the modules take from API objects, and whether they watch."""
    methods: dict[str, list[str]] = {}
    watches = False
    for name, tree in modules.items():
        receivers = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_api_construction(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                receivers.update(ast.unparse(t) for t in targets)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (
                    ast.unparse(node.value) in receivers or _is_api_construction(node.value)):
                methods.setdefault(node.attr, []).append(f"{name}:{node.lineno}")
            if isinstance(node, ast.Call) and any(
                    k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in node.keywords):
                watches = True
    return Uses(methods, watches)


def needed(uses: Uses) -> set[Grant]:
    unknown = {m: where for m, where in uses.methods.items() if m not in METHODS}
    assert not unknown, (f"client methods with no entry in tests/deploy/test_rbac.py METHODS: {unknown}; add each with "
                         "the (apiGroup, resource, verbs) it needs, and grant them in deploy/")
    grants: set[Grant] = set()
    for method in uses.methods:
        group, resource, verbs = METHODS[method]
        grants.update((group, resource, v) for v in verbs)
        if "list" in verbs and uses.watches:
            grants.add((group, resource, "watch"))
    return grants


def granted(objects: list[dict], account: str, namespace: str) -> set[Grant]:
    """What the ClusterRoles and Roles bound to a ServiceAccount allow; wildcards are refused outright."""
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects if o["kind"] in ("ClusterRole", "Role")}
    grants: set[Grant] = set()
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} not in binding.get("subjects", []):
            continue
        ref = binding["roleRef"]
        role = roles.get((ref["kind"], ref["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds {ref['kind']} {ref['name']}, not in deploy/"
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{role['metadata']['name']} grants {field} '*'"
            grants.update((g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"])
    return grants


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return overlay("with-scheduler")


@pytest.mark.parametrize("account", sorted(PROGRAMS))
def test_each_service_account_is_granted_exactly_what_its_code_calls(objects: list[dict], account: str) -> None:
    [sa] = [o for o in objects if o["kind"] == "ServiceAccount" and o["metadata"]["name"] == account]
    uses = client_uses(closure(REPO, PROGRAMS[account]))
    want = needed(uses)
    have = granted(objects, account, sa["metadata"]["namespace"])
    assert want - have == set(), f"{account}: the code calls these and deploy/ does not grant them"
    assert have - want == set(), f"{account}: deploy/ grants these and the code never calls them"


def test_the_derivation_sees_what_the_programs_call() -> None:
    """The scan finds the calls we know of (a scan that found nothing would pass any empty grant)."""
    daemon = needed(client_uses(closure(REPO, PROGRAMS["gpushare-devplugin"])))
    assert {("", "pods", "watch"), ("", "pods", "patch"), ("", "nodes", "patch"), ("", "events", "create")} <= daemon
    scheduler = needed(client_uses(closure(REPO, PROGRAMS["devplugin-scheduler"])))
    assert ("", "pods/binding", "create") in scheduler and ("", "events", "create") not in scheduler


def test_a_new_client_call_is_caught_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    pkg = tmp_path / "devplugin"
    (pkg / "kube").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kube" / "__init__.py").write_text("")
    (pkg / "main.py").write_text("def run():\n    from devplugin.kube import lease\n    lease.renew(None)\n")
    (pkg / "kube" / "lease.py").write_text(
        "from kubernetes import client\n\n"
        "def renew(api):\n"
        "    leases = client.CoordinationV1Api(api)\n"
        "    leases.replace_namespaced_lease('x', 'kube-system', {})\n"
        "    return client.CoreV1Api(api).list_namespaced_pod('ns', watch=True)\n")
    grants = needed(client_uses(closure(tmp_path, "devplugin.main")))
    assert grants == {("coordination.k8s.io", "leases", "update"), ("", "pods", "list"), ("", "pods", "watch")}
    (pkg / "kube" / "lease.py").write_text(
        "from kubernetes import client\n\ndef renew(api):\n    client.CoreV1Api(api).delete_collection_node()\n")
    with pytest.raises(AssertionError, match="delete_collection_node"):
        needed(client_uses(closure(tmp_path, "devplugin.main")))
