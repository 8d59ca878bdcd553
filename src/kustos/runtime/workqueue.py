"""A de-duplicating, rate-limited work queue with client-go's semantics.

- a key waits in the queue at most once, however often it is added;
- a key is never handed to two workers at once: one added while it is being
  processed is queued again when that worker calls ``done``;
- ``add_rate_limited`` delays a key by its own exponential backoff (5 ms doubling
  to 1000 s, as controller-runtime) or by an overall token bucket, whichever is
  later; ``forget`` resets the key's backoff after a success;
- ``add_after`` re-queues a key after a delay, keeping the earliest when asked twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from kustos.runtime.metrics import Metrics


@dataclass
class TokenBucket:
    """The overall limit: ``rate`` keys per second with bursts up to ``burst``."""

    rate: float = 10.0
    burst: int = 100
    _tokens: float = field(init=False)
    _stamp: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens = float(self.burst)
        self._stamp = time.monotonic()

    def reserve(self, now: float | None = None) -> float:
        """Take a token; return how long to wait until it is really ours."""
        now = time.monotonic() if now is None else now
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


@dataclass
class ExponentialBackoff:
    """Per key: ``base * 2**failures``, capped."""

    base: float = 0.005
    cap: float = 1000.0
    _failures: dict[str, int] = field(default_factory=dict)

    def when(self, key: str) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        if failures >= 64:  # 2**failures would overflow a float long after reaching the cap
            return self.cap
        return float(min(self.cap, self.base * 2**failures))

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)


class RateLimiter:
    """The later of the key's own backoff and the overall bucket."""

    def __init__(self, backoff: ExponentialBackoff | None = None, bucket: TokenBucket | None = None):
        self.backoff = backoff or ExponentialBackoff()
        self.bucket = bucket or TokenBucket()

    def when(self, key: str) -> float:
        return max(self.backoff.when(key), self.bucket.reserve())

    def forget(self, key: str) -> None:
        self.backoff.forget(key)

    def failures(self, key: str) -> int:
        return self.backoff.failures(key)


class ShutDown(Exception):
    """The queue is shut down: workers stop."""


class WorkQueue:
    """Keys to reconcile, for one controller's workers."""

    def __init__(self, name: str, limiter: RateLimiter | None = None, metrics: Metrics | None = None):
        self.name = name
        self.limiter = limiter or RateLimiter()
        self._metrics = metrics
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: dict[str, float] = {}
        self._added_at: dict[str, float] = {}
        self._waiting: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._shutting_down = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        if self._metrics is not None:
            self._metrics.queue_adds.labels(self.name).inc()
        self._dirty.add(key)
        self._added_at.setdefault(key, time.monotonic())
        if key in self._processing:
            return  # done() queues it again
        self._queue.append(key)
        self._signal()

    def add_after(self, key: str, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + delay
        existing = self._waiting.get(key)
        if existing is not None:
            if existing[0] <= deadline:
                return
            existing[1].cancel()
        self._waiting[key] = (deadline, loop.call_at(deadline, self._fire, key))

    def _fire(self, key: str) -> None:
        self._waiting.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str, retry_after: float | None = None) -> None:
        """Retry ``key`` after its backoff, or after ``retry_after`` seconds when the failure's
        answer said when (a Retry-After); the failure counts toward the backoff either way."""
        if self._metrics is not None:
            self._metrics.retries.labels(self.name).inc()
        backoff = self.limiter.when(key)
        self.add_after(key, backoff if retry_after is None else retry_after)

    def forget(self, key: str) -> None:
        self.limiter.forget(key)

    def failures(self, key: str) -> int:
        return self.limiter.failures(key)

    async def get(self) -> str:
        """The next key; ``ShutDown`` once shutting down, even with keys left (no new work then)."""
        while not self._queue or self._shutting_down:
            if self._shutting_down:
                raise ShutDown()
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, but leaving without a key: wake the next waiter
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        key = self._queue.popleft()
        now = time.monotonic()
        self._dirty.discard(key)
        self._processing[key] = now
        added = self._added_at.pop(key, now)
        if self._metrics is not None:
            self._metrics.queue_latency.labels(self.name).observe(now - added)
        self._update_depth()
        return key

    def done(self, key: str) -> None:
        started = self._processing.pop(key, None)
        if started is not None and self._metrics is not None:
            self._metrics.work_duration.labels(self.name).observe(time.monotonic() - started)
        if key in self._dirty:
            self._queue.append(key)
            self._signal()
        self._update_depth()

    def update_processing_metrics(self) -> None:
        """Refresh the gauges that show stuck work (before each scrape)."""
        if self._metrics is None:
            return
        now = time.monotonic()
        running = [now - started for started in self._processing.values()]
        self._metrics.unfinished_work.labels(self.name).set(sum(running))
        self._metrics.longest_running.labels(self.name).set(max(running, default=0.0))

    def shut_down(self) -> None:
        """Take no more keys and wake every waiting worker with ``ShutDown``."""
        self._shutting_down = True
        for _, handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        while self._waiters:
            self._wake_one()

    def _signal(self) -> None:
        self._update_depth()
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _update_depth(self) -> None:
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.name).set(len(self._queue))
