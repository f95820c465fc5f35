"""One gRPC server on its own unix socket in the device-plugin directory, for one resource."""

from __future__ import annotations

import logging
import os
from concurrent import futures
from pathlib import Path

import grpc

from devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from devplugin.deviceplugin.servicer import DevicePluginServicer

log = logging.getLogger(__name__)


class PluginServer:
    """Serves a DevicePluginServicer on `<plugin_dir>/<socket_name>`; restartable."""

    def __init__(self, plugin_dir: Path, socket_name: str, servicer: DevicePluginServicer) -> None:
        self.path = plugin_dir / socket_name
        self.socket_name = socket_name
        self.servicer = servicer
        self._server: grpc.Server | None = None
        self._inode: int | None = None

    def start(self) -> None:
        """Serve (replacing a stale socket file); returns once the socket accepts connections."""
        self.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.socket_name))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.servicer, server)
        server.add_insecure_port(f"unix://{self.path}")
        server.start()
        self._server = server
        self._inode = os.stat(self.path).st_ino
        log.info("serving %s on %s", self.servicer.resource, self.path,
                 extra={"fields": {"resource": self.servicer.resource, "socket": str(self.path)}})

    def serving(self) -> bool:
        """True while our socket file is still in place (the kubelet deletes it when it restarts)."""
        return self._server is not None and self._socket_is_ours()

    def stop(self, grace_s: float = 0.2) -> None:
        if self._server is None:
            return
        self._server.stop(grace_s).wait()
        self._server = None
        if self._socket_is_ours():
            self.path.unlink()
        self._inode = None

    def _socket_is_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            return False
