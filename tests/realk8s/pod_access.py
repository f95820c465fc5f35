"""Looking inside a test cluster's pods, as `kubectl exec` and `kubectl logs` do: through the node agent of the
pod's node (its control API: e2e/internal/control). A mixin of the clusters (cluster.py, dra_cluster.py)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from tests.realk8s.agent import AgentError, NodeAgent
from tests.realk8s.node_runtime import NodeRuntime
from tests.realk8s.podnetwork import namespaces


class PodAccess:
    """exec, logs and the workload probe's view, and what the nodes still hold of pods; the cluster provides
    `core`, `nodes` (each with `name` and `root`), `runtime` and `agent_on(node)`."""

    core: k8s.CoreV1Api
    nodes: Sequence[Any]
    runtime: NodeRuntime | None

    def agent_on(self, node: str) -> NodeAgent:
        raise NotImplementedError

    def _agent_of(self, ns: str, pod: str) -> NodeAgent:
        p = self.core.read_namespaced_pod(pod, ns)
        if not p.spec.node_name:
            raise AssertionError(f"pod {ns}/{pod} is not bound to a node")
        return self.agent_on(p.spec.node_name)

    def exec(self, ns: str, pod: str, container: str, command: list[str], stdin: str | None = None,
             timeout: float = 120) -> dict[str, Any]:
        """`kubectl exec`: run command in the container; {"exitCode", "stdout", "stderr", "error"?}."""
        return self._agent_of(ns, pod).exec(ns, pod, container, command, stdin=stdin, timeout=timeout)

    def container_logs(self, ns: str, pod: str, container: str, previous: bool = False) -> str:
        """`kubectl logs`: the container's output."""
        return self._agent_of(ns, pod).logs(ns, pod, container, previous=previous)

    def probe(self, ns: str, pod: str, container: str, timeout: float = 60) -> dict[str, Any]:
        """The view the workload probe printed in the container (its first line), waiting for it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                for line in self.container_logs(ns, pod, container).splitlines():
                    if line.startswith('{"probe"'):
                        out: dict[str, Any] = json.loads(line)["probe"]
                        return out
            except (AgentError, AssertionError):
                pass  # not bound to a node yet, or not started yet
            if time.monotonic() > deadline:
                p = self.core.read_namespaced_pod(pod, ns)
                raise AssertionError(f"no probe output from {ns}/{pod}/{container} within {timeout:.0f} s: "
                                     f"{p.spec.node_name or 'not bound'}, {p.status.phase}, "
                                     f"{p.status.container_statuses or p.status.conditions}")
            time.sleep(0.1)

    def leftovers(self, uids: set[str]) -> list[str]:
        """What the node agents' runtimes still hold of these pods: runc containers, pod directories, mounts,
        network namespaces, container shims. Empty once the pods are gone."""
        if self.runtime is None:
            return []
        short = {u.replace("-", "")[:12]: u for u in uids}
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        procs = {}
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    procs[d.name] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    pass
        out = []
        for i, node in enumerate(self.nodes):
            listed = subprocess.run(["runc", "--root", str(node.root / "runc"), "list", "-q"], capture_output=True,
                                    text=True).stdout.split()
            out += [f"{node.name}: runc container {c}" for c in listed if c[:12] in short]
            for uid in uids:
                pod_dir = node.root / "pods" / uid
                if pod_dir.exists():
                    out.append(f"{node.name}: pod directory {pod_dir}")
                out += [f"{node.name}: mount {line.split()[4]}" for line in mounts
                        if len(line.split()) > 4 and line.split()[4].startswith(str(pod_dir))]
                out += [f"{node.name}: process {pid} {cmd[:120]}" for pid, cmd in procs.items() if str(pod_dir) in cmd]
            prefix = self.runtime.netns_prefix(i)
            out += [f"{node.name}: network namespace {n}" for n in namespaces(prefix) if n[len(prefix):] in short]
        return out
