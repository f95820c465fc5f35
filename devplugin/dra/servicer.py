"""The kubelet's two gRPC services of a DRA driver, thin over devplugin/dra/prepare.py:
- `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` on the DRA socket (NodePrepareResources, NodeUnprepareResources);
- `pluginregistration.Registration` on the registration socket in the kubelet's plugins_registry directory, which
  the kubelet's plugin watcher finds: GetInfo names the driver, the DRA socket and the services it speaks."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from devplugin.api.dra.v1 import api_pb2 as dra_pb2
from devplugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from devplugin.api.pluginregistration.v1 import api_pb2 as reg_pb2
from devplugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from devplugin.dra.claims import ClaimRef
from devplugin.dra.prepare import Preparer

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"  # k8s.io/kubelet/pkg/apis/pluginregistration/v1.DRAPlugin
# The kubelet (1.36, pkg/kubelet/cm/dra/plugin) picks from these the service it speaks: v1.DRAPlugin is
# k8s.io/kubelet/pkg/apis/dra/v1.DRAPluginService.
SUPPORTED_SERVICES = ("v1.DRAPlugin",)


def _refs(claims: object) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]  # type: ignore[attr-defined]


class DraServicer(dra_grpc.DRAPluginServicer):
    def __init__(self, preparer: Preparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(  # noqa: N802 - the gRPC method name
        self, request: dra_pb2.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodePrepareResourcesResponse:
        answer = dra_pb2.NodePrepareResourcesResponse()
        for uid, outcome in self.preparer.prepare(_refs(request.claims)).items():
            entry = answer.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for d in outcome.devices:
                dev = entry.devices.add(request_names=list(d.request_names), pool_name=d.pool, device_name=d.device,
                                        cdi_device_ids=list(d.cdi_device_ids))
                if d.share_id:
                    dev.share_id = d.share_id
        return answer

    def NodeUnprepareResources(  # noqa: N802 - the gRPC method name
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        answer = dra_pb2.NodeUnprepareResourcesResponse()
        for uid, error in self.preparer.unprepare(_refs(request.claims)).items():
            answer.claims[uid].error = error
        return answer


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """`on_status(registered, error)` hears the kubelet's verdict (the plugin re-registers on an error)."""

    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool, str], None]) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.on_status = on_status

    def GetInfo(self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext) -> reg_pb2.PluginInfo:  # noqa: N802
        return reg_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                                  supported_versions=list(SUPPORTED_SERVICES))

    def NotifyRegistrationStatus(  # noqa: N802 - the gRPC method name
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        self.on_status(bool(request.plugin_registered), request.error)
        return reg_pb2.RegistrationStatusResponse()


def add_dra(servicer: DraServicer) -> Callable[[grpc.Server], None]:
    return lambda server: dra_grpc.add_DRAPluginServicer_to_server(servicer, server)


def add_registration(servicer: RegistrationServicer) -> Callable[[grpc.Server], None]:
    return lambda server: reg_grpc.add_RegistrationServicer_to_server(servicer, server)
