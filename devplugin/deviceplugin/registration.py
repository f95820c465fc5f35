"""Register one resource with the kubelet over `kubelet.sock`."""

from __future__ import annotations

import grpc

from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devplugin.deviceplugin.servicer import OPTIONS

API_VERSION = "v1beta1"


class RegistrationError(RuntimeError):
    """The kubelet did not accept the registration; the message says why and what to check."""


def register(kubelet_socket: str, endpoint: str, resource_name: str, timeout_s: float = 10.0) -> None:
    """Call Registration.Register; the plugin must already be serving on `endpoint` (the kubelet dials at once)."""
    with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        try:
            stub.Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=endpoint, resource_name=resource_name, options=OPTIONS
                ),
                timeout=timeout_s,
                wait_for_ready=True,
            )
        except grpc.RpcError as exc:
            raise RegistrationError(
                f"registering {resource_name} with the kubelet at {kubelet_socket} failed: "
                f"{exc.code().name}: {exc.details()} (is the kubelet running and the device-plugin directory "
                "mounted into this pod?)"
            ) from None
