"""What the node agents need to run pods for real, shared by the test clusters (cluster.py, dra_cluster.py): the
image table (images.py), the pod network (podnetwork.py), the NVIDIA container toolkit's setting each node plays
(and writes as its config file, for the node's GPU daemon to read), and the cleanup of every container, mount and
network namespace when the cluster stops."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devplugin_sim.driver_socket import DriverSocket
from devplugin_sim.fake_driver import FakeDriver
from tests.realk8s import images
from tests.realk8s.agent import cleanup_node
from tests.realk8s.podnetwork import PodNetwork

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "build" / "fakes"
NS_PER_BLOCK = 1000  # the fake GPU's time per kernel block (fakes/README.md, "The timeline")
QUEUE_US = 20000  # work a process may have queued on it before a launch blocks


@dataclass
class NodeRuntime:
    """The cluster's image table and pod network, and the toolkit setting of its nodes: `volume_mounts` True is
    the secure one (the device list from /dev/null mounts under /var/run/nvidia-container-devices, a container's
    NVIDIA_VISIBLE_DEVICES ignored unless privileged); False the toolkit's defaults (the env names the GPUs)."""

    image_table: Path
    network: PodNetwork
    volume_mounts: bool = True
    crash_backoff: str = "10s"
    driver_sockets: list[DriverSocket] = field(default_factory=list)

    @classmethod
    def create(cls, root: Path, *, volume_mounts: bool = True, crash_backoff: str = "10s") -> NodeRuntime:
        table = images.build(root / "images", images.default_tools())
        return cls(table, PodNetwork.create(), volume_mounts, crash_backoff)

    def add_image(self, ref: str, entry: dict[str, Any]) -> None:
        """Add an image to the table (the node agents read it afresh for every container)."""
        table = json.loads(self.image_table.read_text())
        table["images"][ref] = entry
        self.image_table.write_text(json.dumps(table, indent=1))

    def netns_prefix(self, i: int) -> str:
        """Node i's pod network namespaces: the bridge's name and the node's number (unique on the machine)."""
        return f"{self.network.name[:8]}{i}-"

    def toolkit_config(self, node_root: Path) -> Path:
        """The node's NVIDIA container toolkit config (what its agent plays), for its GPU daemon to read."""
        path = node_root / "nvidia-container-runtime" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        mounts = self.volume_mounts
        path.write_text(f"accept-nvidia-visible-devices-envvar-when-unprivileged = {str(not mounts).lower()}\n"
                        f"accept-nvidia-visible-devices-as-volume-mounts = {str(mounts).lower()}\n")
        return path

    def serve_driver_socket(self, node_root: Path) -> None:
        """Serve the node's fake driver socket (where its agent would: <root>/nvidia-fake/driver.sock) for the
        node's life, as a kernel driver outlives the kubelet: a container's processes that start just before an
        agent restart, or during it, still find their driver (the agent leaves a socket that answers to it)."""
        path = node_root / "nvidia-fake" / "driver.sock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.driver_sockets.append(DriverSocket(path))

    def agent_args(self, i: int, driver: FakeDriver | None) -> list[str]:
        """Node agent i's container runtime flags: runc, the image table, the pod network, the toolkit (over the
        node's fake driver when it has one: its knobs reach the GPU containers' processes)."""
        args = ["--runtime", "runc", "--images", str(self.image_table), *self.network.agent_args(i),
                "--netns-prefix", self.netns_prefix(i), "--crash-backoff", self.crash_backoff, "--v=2",
                f"--toolkit-accept-volume-mounts={str(self.volume_mounts).lower()}",
                f"--toolkit-accept-envvar-when-unprivileged={str(not self.volume_mounts).lower()}"]
        if driver is not None:
            args += ["--nvidia-config", str(driver.config_path), "--nvidia-libs", str(FAKES)]
            # kernels take GPU time on the node's shared timeline (1 us per block), as on a GPU: compute shares and
            # their throttling are then what a workload meets
            args += ["--nvidia-env", f"FAKE_CUDA_NS_PER_BLOCK={NS_PER_BLOCK}", "--nvidia-env",
                     f"FAKE_CUDA_QUEUE_US={QUEUE_US}"]
            for k, v in sorted(driver.env().items()):
                if k not in ("FAKE_NVML_CONFIG", "LD_LIBRARY_PATH"):
                    args += ["--nvidia-env", f"{k}={v}"]
        return args

    def cleanup(self, node_roots: list[Path]) -> None:
        """Every container, mount and pod network namespace the nodes left, then the bridge."""
        for i, root in enumerate(node_roots):
            cleanup_node(root, self.netns_prefix(i))
        self.stop_driver_sockets()
        self.network.delete()

    def stop_driver_sockets(self) -> None:
        for sock in self.driver_sockets:
            sock.close()
        self.driver_sockets.clear()
