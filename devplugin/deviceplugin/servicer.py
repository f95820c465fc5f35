"""The DevicePlugin gRPC service of one resource: a thin layer over Allocator and DeviceBoard."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Protocol

import grpc

from devplugin.allocation.allocator import Allocator
from devplugin.allocation.errors import RequestError
from devplugin.allocation.units import Kind
from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devplugin.deviceplugin.device_list import device_list
from devplugin.deviceplugin.devices import DeviceBoard

log = logging.getLogger(__name__)

OPTIONS = api_pb2.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


class AdmissionObserver(Protocol):
    """Told of every admission call (metrics); must be cheap and never raise."""

    def answered(self, call: str, resource: str, seconds: float) -> None: ...

    def refused(self, call: str, resource: str, exc: RequestError) -> None: ...


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):
    """Serves one resource (gpu-mem, gpu-core.percentage or gpu-count)."""

    def __init__(self, kind: Kind, allocator: Allocator, board: DeviceBoard,
                 observer: AdmissionObserver | None = None, device_list_strategy: str = "envvar") -> None:
        device_list(device_list_strategy, (), {})  # refuses an unknown strategy now, not at the first Allocate
        self.device_list_strategy = device_list_strategy
        self.kind = kind
        self.resource = allocator.node.resource_name(kind)
        self.allocator = allocator
        self.board = board
        self.observer = observer

    def GetDevicePluginOptions(  # noqa: N802 - gRPC method name
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(  # noqa: N802
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        alive = threading.Event()
        alive.set()

        def ended() -> None:
            alive.clear()
            self.board.wake()

        context.add_callback(ended)
        version, message = self.board.snapshot(self.kind)
        log.info("ListAndWatch: sending %d devices", len(message.devices),
                 extra={"fields": {"resource": self.resource, "devices": len(message.devices)}})
        yield message
        while True:
            change = self.board.wait_change(self.kind, version, alive)
            if change is None:
                return
            version, message = change
            healthy = sum(1 for d in message.devices if d.health == "Healthy")
            log.info("ListAndWatch: sending %d devices (%d healthy)", len(message.devices), healthy,
                     extra={"fields": {"resource": self.resource, "devices": len(message.devices),
                                       "healthy": healthy}})
            yield message

    def GetPreferredAllocation(  # noqa: N802
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        start = time.perf_counter()
        response = api_pb2.PreferredAllocationResponse()
        try:
            for req in request.container_requests:
                try:
                    ids = self.allocator.preferred(
                        self.kind, req.available_deviceIDs, req.must_include_deviceIDs, req.allocation_size
                    )
                except RequestError as exc:
                    self._refuse(context, "GetPreferredAllocation", exc)
                response.container_responses.add(deviceIDs=ids)
            return response
        finally:
            if self.observer is not None:
                self.observer.answered("GetPreferredAllocation", self.resource, time.perf_counter() - start)

    def Allocate(  # noqa: N802
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        start = time.perf_counter()
        response = api_pb2.AllocateResponse()
        try:
            for req in request.container_requests:
                try:
                    grant = self.allocator.allocate(self.kind, req.devices_ids)
                except RequestError as exc:
                    self._refuse(context, "Allocate", exc)
                grants = device_list(self.device_list_strategy, grant.gpus, grant.envs, grant.mounts)
                response.container_responses.add(
                    envs=grants.envs,
                    mounts=[
                        api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                        for m in grants.mounts
                    ],
                    cdi_devices=[api_pb2.CDIDevice(name=name) for name in grants.cdi_devices],
                )
            return response
        finally:
            if self.observer is not None:
                self.observer.answered("Allocate", self.resource, time.perf_counter() - start)

    def PreStartContainer(  # noqa: N802
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    def _refuse(self, context: grpc.ServicerContext, call: str, exc: RequestError) -> None:
        log.error("%s refused: %s", call, exc, extra={"fields": {"resource": self.resource, "call": call,
                                                                 "reason": exc.reason}})
        if self.observer is not None:
            self.observer.refused(call, self.resource, exc)
        context.abort(exc.code, str(exc))
