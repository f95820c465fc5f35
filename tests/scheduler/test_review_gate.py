"""Admission reviews are bounded apart from the extender's verbs: a few run at once (half of them at most for one
client address), the rest wait their turn fairly or get 429 at once, a body that trickles in frees its slot, and
while reviews fill every slot kube-scheduler's calls are still answered on threads of their own."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest

from devplugin.scheduler import admission, http
from devplugin.scheduler.http import Service, build_app
from devplugin.scheduler.review_gate import Busy, GateSettings, ReviewGate
from devplugin.scheduler.service import server_config
from devplugin.scheduler.state import ClusterState
from tests.scheduler.test_extender import FakeCluster
from tests.scheduler.test_http import review
from tests.scheduler.uvicorn_thread import serving_on_a_free_port
from tests.support.scheduler_objects import node, pod

# --- the gate alone -----------------------------------------------------------------------------------------------


def test_the_gate_runs_at_most_its_slots_and_a_quarter_of_them_for_one_client() -> None:
    async def scenario() -> None:
        gate = ReviewGate(GateSettings(slots=8, max_wait_s=5))
        for _ in range(2):
            await gate.acquire("tenant")
        third = asyncio.ensure_future(gate.acquire("tenant"))  # the tenant's share (2 of 8) is taken: it waits
        await asyncio.sleep(0.01)
        assert not third.done() and gate.in_use == 2 and gate.queued == 1
        await gate.acquire("apiserver")  # another client takes a free slot at once
        await gate.acquire("apiserver")
        assert gate.in_use == 4
        gate.release("tenant")
        await asyncio.wait_for(third, 1)
        assert gate.running == {"tenant": 2, "apiserver": 2} and gate.queued == 0

    asyncio.run(scenario())


def test_a_freed_slot_goes_to_the_client_served_least_recently() -> None:
    async def scenario() -> list[str]:
        gate = ReviewGate(GateSettings(slots=2, max_wait_s=5))  # one slot per client while others wait
        await gate.acquire("a")
        await gate.acquire("b")
        order: list[str] = []

        async def take(client: str) -> None:
            await gate.acquire(client)
            order.append(client)

        waiters = [asyncio.ensure_future(take(c)) for c in ("a", "a", "a", "c")]
        await asyncio.sleep(0.01)
        for who in ("a", "b", "a", "c", "a"):  # each release hands the slot to the next client in turn
            gate.release(who)
            await asyncio.sleep(0.01)
        await asyncio.gather(*waiters)
        return order

    assert asyncio.run(scenario()) == ["a", "c", "a", "a"]


def test_a_full_queue_or_a_long_wait_is_busy_and_holds_nothing() -> None:
    async def scenario() -> None:
        gate = ReviewGate(GateSettings(slots=1, max_wait_s=0.2))
        await gate.acquire("a")
        waiters = [asyncio.ensure_future(gate.acquire(f"w{i}")) for i in range(gate.settings.max_waiting)]
        await asyncio.sleep(0.01)
        with pytest.raises(Busy, match="1 reviews running and 64 waiting"):
            await gate.acquire("late")
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert all(isinstance(r, Busy) and "no review slot freed within 0.2 s" in str(r) for r in results)
        assert gate.queued == 0 and gate.in_use == 1
        cancelled = asyncio.ensure_future(gate.acquire("gone"))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        gate.release("a")
        assert gate.queued == 0 and gate.in_use == 0 and gate.running == {}

    asyncio.run(scenario())


# --- the served app -----------------------------------------------------------------------------------------------

@dataclass
class Served:
    url: str
    port: int

    def client(self, source: str = "127.0.0.1", timeout: float = 30) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=timeout)


@contextmanager
def serving(svc: Service) -> Iterator[Served]:
    config = server_config(build_app(svc), "127.0.0.1", 0)  # plain HTTP: the bounds do not depend on TLS
    with serving_on_a_free_port(config) as port:
        yield Served(f"http://127.0.0.1:{port}", port)


def service(**kw: object) -> Service:
    state = ClusterState()
    state.replace_nodes([node("n1", gpus=2, units=16)])
    state.replace_pods([])
    return Service(state, FakeCluster(state), **kw)  # type: ignore[arg-type]


class Blocking:
    """admission.validate replaced: each call waits for `go` (or `hold` seconds) and records how many run at once."""

    def __init__(self, hold: float = 0.0) -> None:
        self.go = threading.Event()
        self.hold = hold
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.calls = 0

    def __call__(self, real: Callable[..., admission.Verdict]) -> Callable[..., admission.Verdict]:
        def validate(*args: object, **kw: object) -> admission.Verdict:
            with self.lock:
                self.now += 1
                self.calls += 1
                self.most = max(self.most, self.now)
            try:
                if self.hold:
                    time.sleep(self.hold)
                else:
                    self.go.wait(30)
                return real(*args, **kw)
            finally:
                with self.lock:
                    self.now -= 1

        return validate


def post_reviews(served: Served, sources: list[str], results: list[int]) -> list[threading.Thread]:
    def one(source: str) -> None:
        with served.client(source) as c:
            try:
                results.append(c.post(f"{served.url}/admission/validate", json=review(pod(mem=4))).status_code)
            except httpx.TransportError:
                results.append(0)

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in sources]
    for t in threads:
        t.start()
    return threads


def test_reviews_run_at_most_the_bound_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # 24 reviews posted together by four addresses: at most 4 are judged at once, one per address.
    slow = Blocking(hold=0.15)
    monkeypatch.setattr(admission, "validate", slow(admission.validate))
    results: list[int] = []
    with serving(service(gate_settings=GateSettings(slots=4, max_wait_s=10))) as served:
        threads = post_reviews(served, [f"127.0.0.{a}" for a in (1, 3, 4, 5) for _ in range(6)], results)
        for t in threads:
            t.join(timeout=60)
    assert results == [200] * 24
    assert slow.calls == 24 and slow.most == 4
    slow.most = 0
    with serving(service(gate_settings=GateSettings(slots=4, max_wait_s=10))) as served:
        for t in post_reviews(served, ["127.0.0.1"] * 6, results):
            t.join(timeout=60)
    assert slow.most == 1  # one address: one at a time


def test_the_extenders_verbs_are_answered_while_reviews_fill_their_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    # 45 reviews that hang, from 45 addresses (more than the 40 threads the verbs run on): kube-scheduler's filter
    # is answered all the same, and every review is answered, judged or turned away, once they move again.
    blocked = Blocking()
    monkeypatch.setattr(admission, "validate", blocked(admission.validate))
    results: list[int] = []
    with serving(service(gate_settings=GateSettings(slots=4, max_wait_s=3))) as served:
        threads = post_reviews(served, [f"127.0.0.{10 + i}" for i in range(45)], results)
        try:
            deadline = time.monotonic() + 10
            while blocked.now < 4 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)
            with served.client("127.0.0.2", timeout=3) as c:
                t0 = time.perf_counter()
                r = c.post(f"{served.url}/scheduler/filter", json={"Pod": pod(mem=20), "NodeNames": ["n1"]})
                took = time.perf_counter() - t0
            assert r.status_code == 200 and r.json()["FailedNodes"] == {
                "n1": "GPU 0,1: at most 16 GiB free on one GPU, 20 GiB asked"}
            assert took < 1.0, f"filter took {took:.2f} s behind the hanging reviews"
            assert blocked.most == 4
        finally:
            blocked.go.set()
            for t in threads:
                t.join(timeout=60)
    assert len(results) == 45 and set(results) <= {200, 429} and results.count(200) >= 4


def test_the_apiservers_review_is_answered_while_one_address_floods(monkeypatch: pytest.MonkeyPatch) -> None:
    slow = Blocking(hold=0.2)
    monkeypatch.setattr(admission, "validate", slow(admission.validate))
    flood: list[int] = []
    with serving(service(gate_settings=GateSettings(slots=4, max_wait_s=10))) as served:
        threads = post_reviews(served, ["127.0.0.1"] * 30, flood)
        time.sleep(0.2)
        with served.client("127.0.0.2") as c:  # the apiserver: a slot of its own at once, not after 30 x 0.2 s
            t0 = time.perf_counter()
            r = c.post(f"{served.url}/admission/validate", json=review(pod(mem=4)))
            took = time.perf_counter() - t0
        for t in threads:
            t.join(timeout=60)
    assert r.status_code == 200 and r.json()["response"]["allowed"] is True
    assert took < 1.0, f"{took:.2f} s"
    assert flood == [200] * 30


def test_over_the_bound_a_review_gets_429_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = Blocking()
    monkeypatch.setattr(admission, "validate", blocked(admission.validate))
    results: list[int] = []
    svc = service(gate_settings=GateSettings(slots=1, max_wait_s=30))
    with serving(svc) as served:
        threads = post_reviews(served, [f"127.0.0.{10 + i}" for i in range(65)], results)  # 1 judged, 64 waiting
        try:
            deadline = time.monotonic() + 20
            while (blocked.now < 1 or svc.gate.queued < 64) and time.monotonic() < deadline:
                time.sleep(0.02)
            with served.client("127.0.0.2", timeout=5) as c:
                t0 = time.perf_counter()
                r = c.post(f"{served.url}/admission/validate", json=review(pod(mem=4)))
                took = time.perf_counter() - t0
            assert r.status_code == 429 and took < 1.0, (r.status_code, took)
            assert r.headers["retry-after"] == "1"
            assert r.json()["error"].startswith("too many admission reviews at once: 1 reviews running and 64 waiting")
        finally:
            blocked.go.set()
            for t in threads:
                t.join(timeout=60)
    assert results == [200] * 65


def test_a_body_that_trickles_in_frees_its_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "BODY_TIMEOUT_S", 0.5)
    with serving(service(gate_settings=GateSettings(slots=1, max_wait_s=5))) as served:
        slow = socket.create_connection(("127.0.0.1", served.port))
        slow.sendall(b"POST /admission/validate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100000\r\n\r\n{\"apiVersion\": ")  # and nothing more
        try:
            time.sleep(0.1)
            with served.client("127.0.0.2") as c:  # waits for the only slot, which the trickle gives up
                t0 = time.perf_counter()
                r = c.post(f"{served.url}/admission/validate", json=review(pod(mem=4)))
                took = time.perf_counter() - t0
            slow.settimeout(5)
            answer = slow.recv(4096)
        finally:
            slow.close()
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"the body did not arrive within 0.5 s" in answer
    assert r.status_code == 200 and took < 2.0, (r.status_code, took)
