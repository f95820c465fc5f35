"""Errors that Allocate and GetPreferredAllocation return to the kubelet, each with the gRPC code it maps to."""

from __future__ import annotations

import grpc


class RequestError(Exception):
    """A request the daemon refuses; the message says what was wrong and what to do. `reason`: a short stable
    code for metrics (refusals by reason); the class's own when not given."""

    code = grpc.StatusCode.INVALID_ARGUMENT
    error = "invalid_request"  # the class of refusal, a metrics label

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or self.error


class NoRoom(RequestError):
    """No GPU has room for the request."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    error = "no_room"


class PairingConflict(RequestError):
    """A container's resources cannot be placed on one GPU together."""

    code = grpc.StatusCode.FAILED_PRECONDITION
    error = "conflict"
