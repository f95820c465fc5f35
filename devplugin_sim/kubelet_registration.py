"""The kubelet's Registration service (v1beta1) on <plugin_dir>/kubelet.sock."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import grpc

from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("v1beta1",)  # pluginapi.SupportedVersions
KUBELET_SOCKET = "kubelet.sock"

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_PREFIX = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def is_native_resource(name: str) -> bool:
    """cpu, memory, hugepages-*, anything in a kubernetes.io domain (v1helper.IsNativeResource)."""
    return "/" not in name or "kubernetes.io/" in name


# mirrors v1helper.IsExtendedResourceName (a qualified name outside the kubernetes.io domains)
def is_extended_resource_name(name: str) -> bool:
    if is_native_resource(name) or name.startswith("requests."):
        return False
    prefix, _, short = name.partition("/")
    return (len(prefix) <= 253 and bool(_PREFIX.match(prefix))
            and len(short) <= 63 and bool(_NAME.match(short)) and "/" not in short)


# mirrors server.Register's checks before it dials
def check_register_request(r: api_pb2.RegisterRequest) -> str | None:
    """The kubelet's error text for a request it refuses before dialling, or None."""
    if r.version not in SUPPORTED_VERSIONS:
        supported = "[" + " ".join(f'"{v}"' for v in SUPPORTED_VERSIONS) + "]"
        return (f'requested API version "{r.version}" is not supported by kubelet. '
                f'Supported version is {supported}')
    if not is_extended_resource_name(r.resource_name):
        return f'the ResourceName "{r.resource_name}" is invalid'
    return None


class RegistrationServicer(api_pb2_grpc.RegistrationServicer):
    """Register: validate, then connect at once (connect raises with the error text for the plugin)."""

    def __init__(self, connect: Callable[[api_pb2.RegisterRequest], None]) -> None:
        self._connect = connect

    # mirrors server.Register: an error here is what the plugin's Register call returns (code Unknown)
    def Register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext) -> api_pb2.Empty:
        log.debug("registration request: resource %s, endpoint %s, version %s", request.resource_name,
                  request.endpoint, request.version)
        problem = check_register_request(request)
        if problem is None:
            try:
                self._connect(request)
            except Exception as err:  # the dial or options failure, sent back to the registering plugin
                problem = str(err)
        if problem is not None:
            log.debug("registration of resource %s refused: %s", request.resource_name, problem)
            context.abort(grpc.StatusCode.UNKNOWN, problem)
        return api_pb2.Empty()
