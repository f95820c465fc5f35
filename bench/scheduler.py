"""The control-plane service's own time: extender filter + prioritize over 1,000 nodes x 8 GPUs with 10 pods
per node placed, bind (the apiserver replaced by a no-op: its own time excluded), and the admission webhooks.

Each call goes through the real Starlette app (JSON body in, pydantic models, JSON out) as uvicorn drives it
(one ASGI call on an asyncio loop), without a socket: the figures are what the service adds per call; network,
TLS and HTTP parsing come on top. `function` rows time the plain functions alone. Prints milliseconds, p50 and
p99.

Run: .venv/bin/python bench/scheduler.py [--nodes 1000] [--calls 200]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncio  # noqa: E402

from bench.common import percentile  # noqa: E402
from devplugin.contract import ANN_ALLOCATED, GpuShare, PodAssignment  # noqa: E402
from devplugin.scheduler import admission, extender  # noqa: E402
from devplugin.scheduler.http import Service, build_app  # noqa: E402
from devplugin.scheduler.state import ClusterState  # noqa: E402
from tests.scheduler_objects import container, node, pod  # noqa: E402

GPUS, UNITS, PODS_PER_NODE = 8, 80, 10


class NoApiserver:
    def get_pod(self, namespace: str, name: str) -> dict:
        raise LookupError(name)

    def bind_pod(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        return None


def cluster(nodes: int, rng: random.Random) -> tuple[ClusterState, list[str]]:
    state = ClusterState()
    names = [f"gpu-node-{i:04d}" for i in range(nodes)]
    state.replace_nodes(node(n, gpus=GPUS, units=UNITS, placement=rng.choice(("binpack", "spread")))
                        for n in names)
    placed = []
    for n in names:
        for j in range(PODS_PER_NODE):
            gpu, mem, core = rng.randrange(GPUS), rng.choice((4, 8, 10, 20)), rng.choice((0, 10, 20, 30))
            ann = {ANN_ALLOCATED: PodAssignment(n, 1, {"main": (GpuShare(gpu, "", mem, core),)}).render()}
            placed.append(pod(f"{n}-p{j}", mem=mem, core=core, node_name=n, annotations=ann, phase="Running"))
    state.replace_pods(placed)
    return state, names


def timed(fn: Callable[[], object], calls: int) -> list[float]:
    fn()  # warm
    out = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def row(name: str, ms: list[float]) -> None:
    print(f"{name:<46} p50 {percentile(ms, 50):8.3f} ms   p99 {percentile(ms, 99):8.3f} ms   ({len(ms)} calls)")


class Asgi:
    """POST a body to the app as uvicorn would: one ASGI call; returns (status, body)."""

    def __init__(self, app: object) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()

    def post(self, path: str, content: bytes) -> tuple[int, bytes]:
        return self.loop.run_until_complete(self._call(path, content))

    async def _call(self, path: str, body: bytes) -> tuple[int, bytes]:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "https", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "server": ("127.0.0.1", 8443), "client": ("127.0.0.1", 50000)}
        messages = [{"type": "http.request", "body": body, "more_body": False}]
        out: list[dict] = []

        async def receive() -> dict:
            return messages.pop() if messages else {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            out.append(message)

        await self.app(scope, receive, send)  # type: ignore[operator]
        return out[0]["status"], b"".join(m.get("body", b"") for m in out[1:])


def review(obj: dict) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                   "namespace": "default", "operation": "CREATE", "object": obj}}).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rng = random.Random(7)
    t = time.perf_counter()
    state, names = cluster(args.nodes, rng)
    print(f"cluster: {args.nodes} nodes x {GPUS} GPUs x {UNITS} GiB, {args.nodes * PODS_PER_NODE} pods placed "
          f"(built in {time.perf_counter() - t:.1f} s)")
    http = Asgi(build_app(Service(state, NoApiserver())))
    asks = pod("bench", containers=[container(mem=12, core=20)])
    body = json.dumps({"Pod": asks, "NodeNames": names}).encode()
    for verb in ("filter", "prioritize"):
        status, answer = http.post(f"/scheduler/{verb}", content=body)
        assert status == 200, answer

    row("filter (HTTP, NodeNames)", timed(lambda: http.post("/scheduler/filter", content=body), args.calls))
    row("prioritize (HTTP, NodeNames)", timed(lambda: http.post("/scheduler/prioritize", content=body), args.calls))
    row("filter (function)", timed(lambda: extender.filter_nodes(state, asks, names), args.calls))
    row("prioritize (function)", timed(lambda: extender.prioritize(state, asks, names), args.calls))

    # bind: a fresh pod each call, on a random node; the apiserver write is a no-op.
    binds = []
    for i in range(args.calls * 5):
        p = pod(f"b{i}", mem=2, core=5)
        state.upsert_pod(p)
        binds.append(p)
    it = iter(binds)

    def one_bind() -> None:
        p = next(it)
        args = {"PodName": p["metadata"]["name"], "PodNamespace": "default", "PodUID": p["metadata"]["uid"],
                "Node": rng.choice(names)}
        status, answer = http.post("/scheduler/bind", json.dumps(args).encode())
        assert status == 200 and json.loads(answer)["Error"] == "", answer

    row("bind (HTTP, apiserver excluded)", timed(one_bind, args.calls * 2))

    def one_bind_fn() -> None:
        p = next(it)
        extender.bind(state, NoApiserver(), "default", p["metadata"]["name"], p["metadata"]["uid"],
                      rng.choice(names))

    row("bind (function)", timed(one_bind_fn, args.calls * 2))

    gpu_pod = review(pod("w", containers=[container("a", mem=8, core=20), container("sidecar")]))
    row("validating webhook (HTTP)", timed(lambda: http.post("/admission/validate", content=gpu_pod),
                                           args.calls * 5))
    row("mutating webhook (HTTP)", timed(lambda: http.post("/admission/mutate", content=gpu_pod), args.calls * 5))
    obj = json.loads(gpu_pod)["request"]["object"]
    row("validate (function)", timed(lambda: admission.validate(obj, UNITS), args.calls * 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
