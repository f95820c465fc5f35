"""The kubelet's client side of one registered device plugin: dial, options, ListAndWatch, RPCs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from devplugin_sim.kubelet_results import PluginOptions

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S = 10.0  # the kubelet's dial timeout (plugin/v1beta1 client.go dial)
PRE_START_TIMEOUT_S = 30.0  # pluginapi.KubeletPreStartContainerRPCTimeoutInSecs
# The kubelet puts no deadline on GetPreferredAllocation and Allocate; a test must not hang forever.
RPC_TIMEOUT_S = 30.0


class EndpointError(Exception):
    """A failed RPC or dial; str() is the kubelet-style text, with Go's gRPC error format."""


def rpc_error_text(err: grpc.RpcError) -> str:
    """Go's text of a gRPC status error, as the kubelet prints it: "rpc error: code = X desc = Y"."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    if code is None:
        return f"rpc error: {details}"
    go_code = "".join(part.capitalize() for part in code.name.split("_"))
    if code is grpc.StatusCode.OK:
        go_code = "OK"
    return f"rpc error: code = {go_code} desc = {details}"


def _device_view(d: api_pb2.Device) -> api_pb2.Device:
    copy = api_pb2.Device()
    copy.CopyFrom(d)
    return copy


class PluginEndpoint:
    """One connection to a plugin. Mirrors plugin/v1beta1 client + devicemanager endpointImpl.

    The stop time is set when the ListAndWatch stream ends or the kubelet stops; from then on RPCs fail
    and the manager's grace period runs.
    """

    def __init__(self, resource: str, socket_path: str | None) -> None:
        self.resource = resource
        self.socket_path = socket_path
        self.options = PluginOptions()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.DevicePluginStub | None = None
        self._lock = threading.Lock()
        self._stop_time: float | None = None
        self._call: grpc.Future | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"PluginEndpoint({self.resource!r}, {self.socket_path!r})"

    # mirrors newStoppedEndpointImpl: a placeholder for a resource known from the checkpoint
    @classmethod
    def stopped(cls, resource: str) -> PluginEndpoint:
        e = cls(resource, None)
        e._stop_time = time.monotonic()
        e._closing = True
        return e

    # mirrors client.Connect -> dial: blocking, with a timeout; the plugin must already serve
    @classmethod
    def dial(cls, resource: str, socket_path: str, timeout_s: float = DIAL_TIMEOUT_S) -> PluginEndpoint:
        e = cls(resource, socket_path)
        # The kubelet keeps gRPC's default 4 MiB receive limit; grpc-python's default is the same.
        channel = grpc.insecure_channel(f"unix://{socket_path}",
                                        options=[("grpc.default_authority", "localhost")])
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            channel.close()
            raise EndpointError(
                f"failed to dial device plugin: {socket_path}: no connection within {timeout_s:g} s "
                "(context deadline exceeded); the plugin must serve on its socket before it calls Register"
            ) from None
        e._channel = channel
        e._stub = api_pb2_grpc.DevicePluginStub(channel)
        log.debug("resource %s: dialled plugin at %s", resource, socket_path)
        return e

    # mirrors ManagerImpl.PluginConnected: the options kept are the plugin's answer, not the RegisterRequest's
    def fetch_options(self) -> PluginOptions:
        assert self._stub is not None
        try:
            o = self._stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            raise EndpointError(f"failed to get device plugin options: {rpc_error_text(err)}") from None
        self.options = PluginOptions(o.pre_start_required, o.get_preferred_allocation_available)
        return self.options

    # mirrors client.Run: consume the ListAndWatch stream until it ends, then report the end once
    def start_watch(self, on_update: Callable[[PluginEndpoint, list[api_pb2.Device]], None],
                    on_end: Callable[[PluginEndpoint, str], None]) -> None:
        self._thread = threading.Thread(target=self._watch, args=(on_update, on_end),
                                        name=f"kubelet-law-{self.resource}", daemon=True)
        self._thread.start()

    def _watch(self, on_update: Callable[[PluginEndpoint, list[api_pb2.Device]], None],
               on_end: Callable[[PluginEndpoint, str], None]) -> None:
        assert self._stub is not None
        reason = "stream closed by the plugin"
        try:
            call = self._stub.ListAndWatch(api_pb2.Empty())
            with self._lock:
                self._call = call
                closing = self._closing
            if closing:
                call.cancel()
            for response in call:
                devices = [_device_view(d) for d in response.devices]
                log.debug("resource %s: ListAndWatch pushed %d devices", self.resource, len(devices))
                on_update(self, devices)
        except grpc.RpcError as err:
            reason = rpc_error_text(err)
        except Exception as err:  # a handler bug must still end the endpoint, not leave it half alive
            log.exception("resource %s: ListAndWatch handler failed", self.resource)
            reason = f"handler error: {err}"
        log.debug("resource %s: ListAndWatch ended: %s", self.resource, reason)
        self.set_stop_time()
        on_end(self, reason)

    def set_stop_time(self) -> None:
        with self._lock:
            if self._stop_time is None:
                self._stop_time = time.monotonic()

    def is_stopped(self) -> bool:
        with self._lock:
            return self._stop_time is not None

    # mirrors endpointImpl.stopGracePeriodExpired
    def grace_expired(self, grace_s: float) -> bool:
        with self._lock:
            return self._stop_time is not None and time.monotonic() - self._stop_time > grace_s

    def seconds_until_expiry(self, grace_s: float) -> float:
        with self._lock:
            if self._stop_time is None:
                return grace_s
            return max(0.0, grace_s - (time.monotonic() - self._stop_time))

    def close(self) -> None:
        """Cancel the stream and close the channel (client.Disconnect); the stream end is still reported."""
        with self._lock:
            self._closing = True
            call = self._call
        if call is not None:
            call.cancel()
        if self._channel is not None:
            self._channel.close()

    def join(self, timeout: float = 5.0) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _check_usable(self) -> api_pb2_grpc.DevicePluginStub:
        if self.is_stopped() or self._stub is None:
            raise EndpointError(f"endpoint {self!r} has been stopped")
        return self._stub

    # mirrors endpointImpl.getPreferredAllocation (one container request)
    def get_preferred_allocation(self, available: list[str], must_include: list[str], size: int) -> list[str]:
        stub = self._check_usable()
        req = api_pb2.PreferredAllocationRequest(container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must_include, allocation_size=size)])
        try:
            resp = stub.GetPreferredAllocation(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            # mirrors ManagerImpl.callGetPreferredAllocationIfAvailable's error text
            raise EndpointError(
                f"device plugin GetPreferredAllocation rpc failed with err: {rpc_error_text(err)}") from None
        if resp.container_responses:
            return list(resp.container_responses[0].deviceIDs)
        return []

    # mirrors endpointImpl.allocate (one ContainerAllocateRequest)
    def allocate(self, device_ids: list[str]) -> api_pb2.AllocateResponse:
        stub = self._check_usable()
        req = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=device_ids)])
        try:
            return stub.Allocate(req, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            raise EndpointError(rpc_error_text(err)) from None

    # mirrors endpointImpl.preStartContainer (30 s timeout)
    def pre_start_container(self, device_ids: list[str]) -> None:
        stub = self._check_usable()
        try:
            stub.PreStartContainer(api_pb2.PreStartContainerRequest(devices_ids=device_ids),
                                   timeout=PRE_START_TIMEOUT_S)
        except grpc.RpcError as err:
            # mirrors ManagerImpl.callPreStartContainerIfNeeded's error text
            raise EndpointError(
                f"device plugin PreStartContainer rpc failed with err: {rpc_error_text(err)}") from None
