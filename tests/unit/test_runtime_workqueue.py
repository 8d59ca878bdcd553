"""The work queue: client-go's de-duplication, processing and delay semantics, rate limits and metrics."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kustos.runtime.metrics import Metrics
from kustos.runtime.workqueue import ExponentialBackoff, RateLimiter, ShutDown, TokenBucket, WorkQueue

# Timers in asyncio may fire a hair early relative to a separately read clock.
SLACK = 0.002


def _generous_bucket() -> TokenBucket:
    """A bucket that never limits, so only the per-key backoff shows."""
    return TokenBucket(rate=1e9, burst=1_000_000)


async def _nothing_within(queue: WorkQueue, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(queue.get(), seconds)


def _value(metrics: Metrics, name: str, queue: str = "q") -> float:
    value = metrics.registry.get_sample_value(name, {"name": queue})
    return 0.0 if value is None else value


# ---- queue semantics ---------------------------------------------------------------------


async def test_a_key_added_twice_is_handed_out_once() -> None:
    queue = WorkQueue("q")
    queue.add("ns/a")
    queue.add("ns/a")
    assert len(queue) == 1
    assert await queue.get() == "ns/a"
    await _nothing_within(queue, 0.02)


async def test_keys_are_handed_out_in_fifo_order() -> None:
    queue = WorkQueue("q")
    for key in ("c", "a", "b", "a", "d"):
        queue.add(key)
    assert [await queue.get() for _ in range(4)] == ["c", "a", "b", "d"]


async def test_a_key_added_while_processing_waits_for_done() -> None:
    queue = WorkQueue("q")
    queue.add("k")
    assert await queue.get() == "k"
    queue.add("k")
    queue.add("k")
    assert len(queue) == 0
    await _nothing_within(queue, 0.02)
    queue.done("k")
    assert len(queue) == 1
    assert await queue.get() == "k"
    queue.done("k")
    await _nothing_within(queue, 0.02)


async def test_done_without_a_new_add_does_not_requeue() -> None:
    queue = WorkQueue("q")
    queue.add("k")
    await queue.get()
    queue.done("k")
    assert len(queue) == 0
    await _nothing_within(queue, 0.02)


async def test_other_keys_are_handed_out_while_one_is_processing() -> None:
    queue = WorkQueue("q")
    queue.add("a")
    assert await queue.get() == "a"
    queue.add("a")
    queue.add("b")
    assert await queue.get() == "b"


async def test_get_blocks_until_a_key_is_added() -> None:
    queue = WorkQueue("q")
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    assert not getter.done()
    queue.add("k")
    assert await asyncio.wait_for(getter, 1) == "k"


async def test_each_add_wakes_one_waiting_getter() -> None:
    queue = WorkQueue("q")
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0.01)
    queue.add("a")
    queue.add("b")
    done, pending = await asyncio.wait(getters, timeout=0.2)
    assert sorted(task.result() for task in done) == ["a", "b"]
    assert len(pending) == 1
    queue.add("c")
    assert await asyncio.wait_for(pending.pop(), 1) == "c"


async def test_add_after_fires_after_the_delay() -> None:
    loop = asyncio.get_running_loop()
    queue = WorkQueue("q")
    start = loop.time()
    queue.add_after("k", 0.05)
    assert len(queue) == 0
    assert await asyncio.wait_for(queue.get(), 1) == "k"
    assert loop.time() - start >= 0.05 - SLACK


async def test_add_after_twice_keeps_the_earliest_deadline() -> None:
    loop = asyncio.get_running_loop()
    queue = WorkQueue("q")
    start = loop.time()
    queue.add_after("k", 0.2)
    queue.add_after("k", 0.05)  # earlier: replaces the first
    queue.add_after("k", 0.3)  # later: ignored
    assert await asyncio.wait_for(queue.get(), 1) == "k"
    elapsed = loop.time() - start
    assert 0.05 - SLACK <= elapsed < 0.19
    queue.done("k")
    # The replaced and the ignored timers never fire.
    await _nothing_within(queue, 0.35)


async def test_add_after_without_a_delay_adds_now() -> None:
    queue = WorkQueue("q")
    queue.add_after("k", 0)
    queue.add_after("j", -1)
    assert len(queue) == 2


async def test_add_after_a_queued_key_does_not_duplicate_it() -> None:
    queue = WorkQueue("q")
    queue.add("k")
    queue.add_after("k", 0.02)
    assert await queue.get() == "k"
    await asyncio.sleep(0.04)  # the timer fires while "k" is processing
    assert len(queue) == 0
    queue.done("k")
    assert await asyncio.wait_for(queue.get(), 1) == "k"
    queue.done("k")
    await _nothing_within(queue, 0.03)


async def test_add_rate_limited_delays_grow_per_key_and_forget_resets() -> None:
    loop = asyncio.get_running_loop()
    queue = WorkQueue("q", RateLimiter(ExponentialBackoff(base=0.005, cap=1.0), _generous_bucket()))
    delays = []
    for attempt in range(4):
        assert queue.failures("k") == attempt
        start = loop.time()
        queue.add_rate_limited("k")
        assert len(queue) == 0
        assert await asyncio.wait_for(queue.get(), 2) == "k"
        delays.append(loop.time() - start)
        queue.done("k")
    for attempt, delay in enumerate(delays):
        assert delay >= 0.005 * 2**attempt - SLACK
    assert queue.failures("k") == 4
    assert queue.failures("other") == 0

    queue.forget("k")
    assert queue.failures("k") == 0
    start = loop.time()
    queue.add_rate_limited("k")
    await asyncio.wait_for(queue.get(), 1)
    assert loop.time() - start < 0.04 - SLACK  # back to the 5 ms first step, far below the 40 ms


async def test_shut_down_wakes_waiting_getters_with_shutdown() -> None:
    queue = WorkQueue("q")
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await asyncio.sleep(0.01)
    queue.shut_down()
    results = await asyncio.wait_for(asyncio.gather(*getters, return_exceptions=True), 1)
    assert all(isinstance(result, ShutDown) for result in results)
    with pytest.raises(ShutDown):
        await queue.get()


async def test_shut_down_hands_out_no_more_work_even_with_keys_queued() -> None:
    # A stopping operator finishes what it is doing and starts nothing new: its lease goes next.
    queue = WorkQueue("q")
    queue.add("queued")
    queue.shut_down()
    with pytest.raises(ShutDown):
        await queue.get()


async def test_shut_down_ignores_new_adds_and_cancels_delayed_ones() -> None:
    queue = WorkQueue("q")
    queue.add_after("later", 0.02)
    queue.shut_down()
    queue.add("new")
    assert len(queue) == 0
    await asyncio.sleep(0.04)
    assert len(queue) == 0
    with pytest.raises(ShutDown):
        await queue.get()


async def test_a_cancelled_getter_does_not_swallow_a_key() -> None:
    queue = WorkQueue("q")
    cancelled = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    cancelled.cancel()
    await asyncio.sleep(0)
    queue.add("k")
    assert await asyncio.wait_for(queue.get(), 1) == "k"


async def test_a_getter_cancelled_after_being_woken_passes_the_key_on() -> None:
    queue = WorkQueue("q")
    first = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0.01)
    queue.add("k")  # wakes the first waiter...
    first.cancel()  # ...which is cancelled before it gets to run
    try:
        assert await asyncio.wait_for(asyncio.shield(second), 0.2) == "k"
    finally:
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)


# ---- rate limiters -----------------------------------------------------------------------


def test_exponential_backoff_doubles_from_5ms_and_is_capped() -> None:
    backoff = ExponentialBackoff()
    delays = [backoff.when("k") for _ in range(20)]
    assert delays[:4] == pytest.approx([0.005, 0.01, 0.02, 0.04])
    assert all(b == pytest.approx(2 * a) or b == 1000.0 for a, b in itertools.pairwise(delays))
    assert ExponentialBackoff(cap=0.02).when("x") == 0.005
    capped = ExponentialBackoff(cap=0.02)
    assert [capped.when("x") for _ in range(5)] == pytest.approx([0.005, 0.01, 0.02, 0.02, 0.02])


def test_exponential_backoff_is_per_key_and_forget_resets() -> None:
    backoff = ExponentialBackoff()
    backoff.when("a")
    backoff.when("a")
    assert backoff.when("b") == pytest.approx(0.005)
    assert backoff.failures("a") == 2
    backoff.forget("a")
    backoff.forget("never-seen")
    assert backoff.failures("a") == 0
    assert backoff.when("a") == pytest.approx(0.005)


def test_exponential_backoff_stays_at_the_cap_for_a_key_that_keeps_failing() -> None:
    backoff = ExponentialBackoff()
    # ~1000 retries at the 1000 s cap is under two weeks of a persistently failing object.
    delays = [backoff.when("k") for _ in range(1100)]
    assert delays[-1] == 1000.0


def test_token_bucket_allows_a_burst_then_waits_at_the_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=3)
    t = time.monotonic() + 10  # after creation: the bucket is full
    assert [bucket.reserve(t) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(t) == pytest.approx(0.1)
    assert bucket.reserve(t) == pytest.approx(0.2)
    # 0.2 s later two tokens came back, both already promised: the next waits 0.1 s.
    assert bucket.reserve(t + 0.2) == pytest.approx(0.1)
    # After a long pause the bucket is full again, but never above the burst.
    t += 100
    assert [bucket.reserve(t) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve(t) == pytest.approx(0.1)


@given(
    rate=st.floats(min_value=0.5, max_value=1000),
    burst=st.integers(min_value=1, max_value=50),
    n=st.integers(min_value=1, max_value=120),
)
def test_token_bucket_reservations_at_one_instant(rate: float, burst: int, n: int) -> None:
    bucket = TokenBucket(rate=rate, burst=burst)
    t = time.monotonic() + 1000
    waits = [bucket.reserve(t) for _ in range(n)]
    expected = [max(0, i + 1 - burst) / rate for i in range(n)]
    assert waits == pytest.approx(expected)


@given(
    rate=st.floats(min_value=0.5, max_value=100),
    burst=st.integers(min_value=1, max_value=20),
    gaps=st.lists(st.floats(min_value=0, max_value=2), min_size=1, max_size=60),
)
def test_token_bucket_never_grants_more_than_burst_plus_rate_times_time(
    rate: float, burst: int, gaps: list[float]
) -> None:
    """Each reservation becomes usable at t + wait; by any instant at most burst + rate*elapsed are usable."""
    bucket = TokenBucket(rate=rate, burst=burst)
    start = t = time.monotonic() + 1000
    usable_at = []
    for gap in gaps:
        t += gap
        wait = bucket.reserve(t)
        assert wait >= 0
        usable_at.append(t + wait)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(usable_at))
    for i, moment in enumerate(usable_at):
        assert i + 1 <= burst + rate * (moment - start) + 1e-6


def test_rate_limiter_takes_the_later_of_backoff_and_bucket() -> None:
    slow_backoff = RateLimiter(ExponentialBackoff(base=2.0), _generous_bucket())
    assert slow_backoff.when("k") == pytest.approx(2.0)
    assert slow_backoff.when("k") == pytest.approx(4.0)

    tight_bucket = RateLimiter(ExponentialBackoff(base=0.001), TokenBucket(rate=1.0, burst=1))
    assert tight_bucket.when("a") == pytest.approx(0.001)
    second = tight_bucket.when("b")  # another key: its own backoff is 1 ms, the bucket says ~1 s
    assert 0.9 < second <= 1.0

    tight_bucket.forget("a")
    assert tight_bucket.failures("a") == 0
    assert tight_bucket.failures("b") == 1


# ---- metrics -----------------------------------------------------------------------------


async def test_depth_and_adds_follow_the_queue() -> None:
    metrics = Metrics()
    queue = WorkQueue("q", metrics=metrics)
    queue.add("a")
    queue.add("a")  # de-duplicated: not an add
    queue.add("b")
    assert _value(metrics, "workqueue_depth") == 2
    assert _value(metrics, "workqueue_adds_total") == 2
    await queue.get()
    assert _value(metrics, "workqueue_depth") == 1
    queue.add("a")  # while processing: counted, but not in the queue yet
    assert _value(metrics, "workqueue_adds_total") == 3
    assert _value(metrics, "workqueue_depth") == 1
    queue.done("a")
    assert _value(metrics, "workqueue_depth") == 2
    # Another queue's series are its own.
    assert metrics.registry.get_sample_value("workqueue_adds_total", {"name": "other"}) is None


async def test_queue_and_work_duration_histograms_count_each_item() -> None:
    metrics = Metrics()
    queue = WorkQueue("q", metrics=metrics)
    for key in ("a", "b"):
        queue.add(key)
    await asyncio.sleep(0.01)
    for _ in range(2):
        key = await queue.get()
        await asyncio.sleep(0.01)
        queue.done(key)
    assert _value(metrics, "workqueue_queue_duration_seconds_count") == 2
    assert _value(metrics, "workqueue_work_duration_seconds_count") == 2
    assert _value(metrics, "workqueue_queue_duration_seconds_sum") >= 0.02 - SLACK
    assert _value(metrics, "workqueue_work_duration_seconds_sum") >= 0.02 - SLACK


async def test_retries_are_counted() -> None:
    metrics = Metrics()
    queue = WorkQueue("q", RateLimiter(ExponentialBackoff(base=0.001), _generous_bucket()), metrics)
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")
    queue.add_rate_limited("b")
    assert _value(metrics, "workqueue_retries_total") == 3
    await asyncio.wait_for(queue.get(), 1)
    await asyncio.wait_for(queue.get(), 1)


async def test_processing_gauges_show_work_in_progress() -> None:
    metrics = Metrics()
    queue = WorkQueue("q", metrics=metrics)
    queue.add("a")
    queue.add("b")
    await queue.get()
    await asyncio.sleep(0.02)
    await queue.get()
    await asyncio.sleep(0.01)
    queue.update_processing_metrics()
    longest = _value(metrics, "workqueue_longest_running_processor_seconds")
    unfinished = _value(metrics, "workqueue_unfinished_work_seconds")
    assert longest >= 0.03 - SLACK
    assert unfinished >= longest + 0.01 - SLACK
    queue.done("a")
    queue.done("b")
    queue.update_processing_metrics()
    assert _value(metrics, "workqueue_longest_running_processor_seconds") == 0
    assert _value(metrics, "workqueue_unfinished_work_seconds") == 0


# ---- interleavings -----------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c", "d"])
WORKERS = st.integers(min_value=0, max_value=2)


class QueueMachine(RuleBasedStateMachine):
    """Simulated workers take and finish keys in any order; adds come at any moment.

    ``owed`` holds the keys added since they were last handed out: each must be
    handed out (again) before the run ends.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.queue = WorkQueue("q")
        self.held: dict[int, str] = {}
        self.owed: set[str] = set()

    def _get(self) -> str:
        return self.loop.run_until_complete(asyncio.wait_for(self.queue.get(), 1))

    def _take(self, worker: int) -> None:
        key = self._get()
        assert key not in self.held.values(), f"{key} handed to a second worker"
        assert key in self.owed, f"{key} handed out without an add since it was last handed out"
        self.owed.discard(key)
        self.held[worker] = key

    @rule(key=KEYS)
    def add(self, key: str) -> None:
        self.queue.add(key)
        self.owed.add(key)

    @precondition(lambda self: len(self.queue) > 0)
    @rule(worker=WORKERS)
    def get(self, worker: int) -> None:
        if worker not in self.held:
            self._take(worker)

    @rule(worker=WORKERS)
    def done(self, worker: int) -> None:
        key = self.held.pop(worker, None)
        if key is not None:
            self.queue.done(key)

    @invariant()
    def queued_keys_are_the_owed_ones_not_being_processed(self) -> None:
        assert len(self.queue) == len(self.owed - set(self.held.values()))

    def teardown(self) -> None:
        try:
            # Every worker finishes, then one worker drains the queue until nothing is owed.
            for worker in list(self.held):
                self.done(worker)
            while len(self.queue) > 0:
                self._take(0)
                self.done(0)
            assert not self.owed, f"never processed after their last add: {self.owed}"
            self.queue.shut_down()
        finally:
            self.loop.close()


TestQueueInterleavings = QueueMachine.TestCase
TestQueueInterleavings.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@settings(max_examples=25, deadline=None)
@given(
    script=st.lists(st.tuples(KEYS, st.integers(min_value=0, max_value=3)), min_size=1, max_size=30),
    work=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=8),
)
def test_concurrent_workers_never_share_a_key_and_finish_every_add(
    script: list[tuple[str, int]], work: list[int]
) -> None:
    """Real tasks: adds spread over event-loop turns, workers yield for varying turns per key."""

    async def scenario() -> None:
        queue = WorkQueue("q")
        in_flight: set[str] = set()
        last_add: dict[str, int] = {}
        last_start: dict[str, int] = {}
        clock = 0

        async def worker(index: int) -> None:
            nonlocal clock
            turns = 0
            while True:
                try:
                    key = await queue.get()
                except ShutDown:
                    return
                assert key not in in_flight
                in_flight.add(key)
                clock += 1
                last_start[key] = clock
                for _ in range(work[(index + turns) % len(work)]):
                    await asyncio.sleep(0)
                turns += 1
                in_flight.discard(key)
                queue.done(key)

        workers = [asyncio.create_task(worker(i)) for i in range(3)]
        for key, pause in script:
            clock += 1
            last_add[key] = clock
            queue.add(key)
            for _ in range(pause):
                await asyncio.sleep(0)
        for _ in range(100_000):
            if len(queue) == 0 and not in_flight:
                break
            await asyncio.sleep(0)
        queue.shut_down()
        await asyncio.wait_for(asyncio.gather(*workers), 1)
        for key, added in last_add.items():
            assert last_start.get(key, -1) > added, f"{key} not processed after its last add"

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
