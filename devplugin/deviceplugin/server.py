"""One gRPC server on its own unix socket in the device-plugin directory, for one resource."""

from __future__ import annotations

from pathlib import Path

import grpc

from devplugin.api.deviceplugin.v1beta1 import api_pb2_grpc
from devplugin.deviceplugin.servicer import DevicePluginServicer
from devplugin.socket_server import SocketServer


class PluginServer(SocketServer):
    """Serves a DevicePluginServicer on `<plugin_dir>/<socket_name>`; restartable. `serving()` turns False once
    the kubelet, restarting, deletes the socket file."""

    def __init__(self, plugin_dir: Path, socket_name: str, servicer: DevicePluginServicer) -> None:
        def add(server: grpc.Server) -> None:
            api_pb2_grpc.add_DevicePluginServicer_to_server(servicer, server)

        super().__init__(plugin_dir / socket_name, add, name=servicer.resource, grace_s=0.2,
                         fields={"resource": servicer.resource})
        self.socket_name = socket_name
        self.servicer = servicer
