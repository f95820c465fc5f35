"""How many admission reviews run at once, and whose turn is next.

At most `slots` reviews are read, parsed and judged at a time, and at most `per_client` of them (a quarter) for one
client address: a tenant posting from one address cannot take every slot from the apiserver.
The rest wait, at most `max_waiting` of them and each at most `max_wait_s`; a slot that frees goes to the waiting
client that has been served least recently (round robin over addresses), oldest request first. A request that
cannot wait (the queue is full, or its wait ran out) gets `Busy` at once, which the service answers with 429: the
apiserver then applies the webhook's failurePolicy. A slot is taken before the body is read, so waiting requests
hold no body (the server stops reading their connections).

Everything runs on the service's event loop; the gate is not thread-safe.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass

DEFAULT_SLOTS = 4
DEFAULT_MAX_WAIT_S = 2.0


class Busy(Exception):
    """No slot for this review: the reason, for the answer."""


@dataclass(frozen=True)
class GateSettings:
    slots: int = DEFAULT_SLOTS
    max_wait_s: float = DEFAULT_MAX_WAIT_S

    @property
    def per_client(self) -> int:
        """Slots one client address may hold at once: a quarter of them. The interpreter runs one review at a
        time anyway; what a slot buys is reading one body while another is judged. A flood from one address thus
        contends with the apiserver's review for the interpreter with one review, not with several."""
        return max(1, self.slots // 4)

    @property
    def max_waiting(self) -> int:
        """Reviews that may wait at once: enough for the apiserver's bursts (a controller creating hundreds of
        pods); a waiting review holds a connection, not its body."""
        return 64 * self.slots


class ReviewGate:
    def __init__(self, settings: GateSettings = GateSettings()) -> None:
        self.settings = settings
        self.running: dict[str, int] = {}
        self._total = 0
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()  # client -> its waiters
        self._queued = 0

    @property
    def in_use(self) -> int:
        return self._total

    @property
    def queued(self) -> int:
        return self._queued

    def _may_run(self, client: str) -> bool:
        return self._total < self.settings.slots and self.running.get(client, 0) < self.settings.per_client

    def _take(self, client: str) -> None:
        self._total += 1
        self.running[client] = self.running.get(client, 0) + 1

    async def acquire(self, client: str) -> None:
        """Take a slot for `client`, waiting for its turn; Busy when it cannot."""
        if self._may_run(client) and client not in self._waiting:
            self._take(client)
            return
        s = self.settings
        if self._queued >= s.max_waiting:
            raise Busy(f"{self._total} reviews running and {self._queued} waiting (the most that may wait: "
                       f"{s.max_waiting}, --max-concurrent-reviews {s.slots} x 64); retry")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(client, deque()).append(waiter)
        self._queued += 1
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout=s.max_wait_s)
        except (asyncio.TimeoutError, asyncio.CancelledError) as exc:
            if waiter.done() and not waiter.cancelled():  # the slot was handed over as the wait ended: give it back
                self.release(client)
            else:
                self._forget(client, waiter)
                waiter.cancel()
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise Busy(f"no review slot freed within {s.max_wait_s:g} s ({s.slots} reviews at a time, "
                       f"at most {s.per_client} per client address, --max-concurrent-reviews); retry") from None

    def release(self, client: str) -> None:
        """Give a slot back and hand the next one out."""
        self._total -= 1
        left = self.running.get(client, 1) - 1
        if left:
            self.running[client] = left
        else:
            self.running.pop(client, None)
        self._hand_out()

    def _forget(self, client: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(client)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self._queued -= 1
            if not queue:
                del self._waiting[client]

    def _hand_out(self) -> None:
        while self._total < self.settings.slots:
            chosen = next((c for c in self._waiting if self.running.get(c, 0) < self.settings.per_client), None)
            if chosen is None:
                return
            queue = self._waiting.pop(chosen)
            waiter = queue.popleft()
            self._queued -= 1
            if queue:
                self._waiting[chosen] = queue  # to the back: the next free slot goes to another client first
            self._take(chosen)
            waiter.set_result(None)
