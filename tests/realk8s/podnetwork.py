"""The test cluster's pod network: a bridge in a network namespace of the cluster's own, joined to nothing outside
the machine. Each node agent gives its pods a namespace of their own on it (a veth pair, an address from the node's
part of the range: e2e/internal/podnet). Pods reach each other on the bridge; the bridge's namespace holds the
gateway address through which the Services' range is routed; that range is local there, where the Service proxy
(e2e/cmd/serviceproxy) listens on each ClusterIP. No traffic leaves the machine."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

CLUSTER_CIDR = "10.88.0.0/16"
GATEWAY = "10.88.0.1"
SERVICE_CIDR = "10.0.0.0/24"


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


@dataclass
class PodNetwork:
    """The bridge namespace `name` (under /run/netns) and the address plan."""

    name: str

    @classmethod
    def create(cls, prefix: str = "rk") -> PodNetwork:
        net = cls(f"{prefix}{os.urandom(3).hex()}-br")
        _ip("netns", "add", net.name)
        try:
            _ip("-n", net.name, "link", "set", "lo", "up")
            _ip("-n", net.name, "link", "add", "br0", "type", "bridge")
            _ip("-n", net.name, "addr", "add", f"{GATEWAY}/16", "dev", "br0")
            _ip("-n", net.name, "link", "set", "br0", "up")
            # the whole service range is local in the bridge's namespace: the Service proxy listens there
            _ip("-n", net.name, "addr", "add", SERVICE_CIDR, "dev", "lo")
        except BaseException:
            net.delete()
            raise
        return net

    @staticmethod
    def node_cidr(i: int) -> str:
        """Node i's part of the range: 10.88.<i+1>.0/24."""
        return f"10.88.{i + 1}.0/24"

    def agent_args(self, i: int) -> list[str]:
        return ["--pod-bridge-netns", self.name, "--cluster-cidr", CLUSTER_CIDR, "--pod-cidr", self.node_cidr(i),
                "--pod-gateway", GATEWAY, "--service-cidr", SERVICE_CIDR]

    def delete(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


def namespaces(prefix: str) -> list[str]:
    """The network namespaces on the machine whose names start with prefix."""
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))
    except FileNotFoundError:
        return []
