"""Kubelet-side admission clients driven one container at a time: the compiled C++ client in `--driven` mode
(bench/cpp) or the Python gRPC client. Each admission = GetPreferredAllocation + Allocate per resource, in the
order given, over the plugin's unix sockets; the client keeps the kubelet's view of held device IDs and offers
the rest as available. Times are measured inside the client, around the RPCs only."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from bench.common import CORE, MEM
from devplugin.api.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

SHORT = {MEM: "mem", CORE: "core"}


@dataclass(frozen=True)
class Outcome:
    ok: bool
    total_ms: float = 0.0
    gpa_ms: float = 0.0
    allocate_ms: float = 0.0
    why: str = ""


class DrivenClient(Protocol):
    name: str
    empty_rpc_ms: float

    def admit(self, token: str, request: list[tuple[str, int]]) -> Outcome:
        """Admit one container asking `request` ((resource, amount) in call order)."""

    def release(self, token: str) -> None:
        """The container is gone: its device IDs are available again."""

    def close(self) -> None:
        """End the client."""


class CppClient:
    """build/bench/admission_client --driven, one command line and one answer line per step."""

    name = "cpp"

    def __init__(self, binary: Path, sockets: dict[str, Path]) -> None:
        self.proc = subprocess.Popen(
            [str(binary), "--driven", "--mem-socket", str(sockets[MEM]), "--core-socket", str(sockets[CORE])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        ready = self._line()
        if not ready.startswith("ready "):
            raise RuntimeError(f"{binary.name} did not start: {ready!r}")
        fields = dict(kv.split("=", 1) for kv in ready.split()[1:])
        self.empty_rpc_ms = float(fields["empty_rpc_p50_ms"])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"admission_client ended: {err.strip() or 'no output'}")
        return line.strip()

    def _ask(self, command: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._line()

    def admit(self, token: str, request: list[tuple[str, int]]) -> Outcome:
        answer = self._ask(f"admit {token} " + " ".join(f"{SHORT[r]}={n}" for r, n in request))
        word, _, rest = answer.partition(" ")
        _, _, detail = rest.partition(" ")
        if word == "refused":
            return Outcome(False, why=detail)
        fields = dict(kv.split("=", 1) for kv in detail.split())
        return Outcome(True, float(fields["total_ms"]), float(fields["gpa_ms"]), float(fields["allocate_ms"]))

    def release(self, token: str) -> None:
        self._ask(f"release {token}")

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


class PythonClient:
    """The Python gRPC client (its own per-call cost, ~0.3 ms an RPC on a small machine, is in its figures)."""

    name = "python"

    def __init__(self, sockets: dict[str, Path], all_ids: dict[str, list[str]]) -> None:
        self.channels = {r: grpc.insecure_channel(f"unix://{p}") for r, p in sockets.items()}
        self.stubs = {r: api_pb2_grpc.DevicePluginStub(c) for r, c in self.channels.items()}
        self.all_ids = all_ids
        self.held: dict[str, set[str]] = {r: set() for r in sockets}
        self.live: dict[str, dict[str, list[str]]] = {}
        times = []
        for _ in range(100):
            t0 = time.perf_counter()
            self.stubs[MEM].GetDevicePluginOptions(api_pb2.Empty())
            times.append(time.perf_counter() - t0)
        self.empty_rpc_ms = sorted(times)[len(times) // 2] * 1000

    def admit(self, token: str, request: list[tuple[str, int]]) -> Outcome:
        avail = {r: [d for d in self.all_ids[r] if d not in self.held[r]] for r, _ in request}
        got: dict[str, list[str]] = {}
        gpa = alloc = 0.0
        t0 = time.perf_counter()
        try:
            for res, n in request:
                t1 = time.perf_counter()
                pref = self.stubs[res].GetPreferredAllocation(api_pb2.PreferredAllocationRequest(container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=avail[res], allocation_size=n)]))
                ids = list(pref.container_responses[0].deviceIDs)
                t2 = time.perf_counter()
                self.stubs[res].Allocate(api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]))
                t3 = time.perf_counter()
                gpa += t2 - t1
                alloc += t3 - t2
                got[res] = ids
        except grpc.RpcError as exc:
            return Outcome(False, why=f"{exc.code().name}: {exc.details()}")  # type: ignore[attr-defined]
        total = time.perf_counter() - t0
        for res, ids in got.items():
            self.held[res].update(ids)
        self.live[token] = got
        return Outcome(True, total * 1000, gpa * 1000, alloc * 1000)

    def release(self, token: str) -> None:
        for res, ids in self.live.pop(token, {}).items():
            self.held[res].difference_update(ids)

    def close(self) -> None:
        for channel in self.channels.values():
            channel.close()
