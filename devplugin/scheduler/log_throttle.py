"""At most a few log lines a second for one kind of event: a flood of refused requests must not become a flood of
log lines (each costs the service CPU and the node disk). The first line after a quiet spell says how many were
left out."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LogThrottle:
    def __init__(self, per_second: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.clock = clock
        self._lock = threading.Lock()
        self._allowance = per_second
        self._last = clock()
        self.left_out = 0  # lines not logged since the last one that was

    def allow(self) -> bool:
        """Whether to log this event now (a token bucket of `per_second`); callers that log may read and report
        `taken_left_out()`."""
        with self._lock:
            now = self.clock()
            self._allowance = min(self.per_second, self._allowance + (now - self._last) * self.per_second)
            self._last = now
            if self._allowance >= 1:
                self._allowance -= 1
                return True
            self.left_out += 1
            return False

    def taken_left_out(self) -> int:
        """How many were left out since the last call, and start counting again."""
        with self._lock:
            n, self.left_out = self.left_out, 0
            return n
