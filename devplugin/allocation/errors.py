"""Errors that Allocate and GetPreferredAllocation return to the kubelet, each with the gRPC code it maps to."""

from __future__ import annotations

import grpc


class RequestError(Exception):
    """A request the daemon refuses; the message says what was wrong and what to do."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NoRoom(RequestError):
    """No GPU has room for the request."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PairingConflict(RequestError):
    """A container's resources cannot be placed on one GPU together."""

    code = grpc.StatusCode.FAILED_PRECONDITION
