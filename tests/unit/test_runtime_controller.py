"""Controllers: key mappers, and the runner's workers against real in-process reconcile functions."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.runtime.api import ApiStatusError, namespace_terminating, raise_for
from kustos.runtime.cloud import ProviderError, Throttled
from kustos.runtime.controller import Controller, ControllerRunner, Result, label_keys, owner_keys
from kustos.runtime.errors import ReconcileError, ReconcileTimeout, RetryAfter, TerminalError
from kustos.runtime.informer import ResourceRef
from kustos.runtime.metrics import Metrics
from kustos.runtime.workqueue import ExponentialBackoff, RateLimiter, TokenBucket

CLUSTERS = ResourceRef("kustos.dev", "v1alpha1", "etcdclusters", "EtcdCluster")
NODES = ResourceRef("", "v1", "nodes", "Node", namespaced=False)
SLACK = 0.002


def _owned(namespace: str | None, *refs: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "child", "ownerReferences": list(refs)}
    if namespace is not None:
        meta["namespace"] = namespace
    return {"metadata": meta}


def _ref(api_version: str, kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": f"uid-{name}"}


# ---- key mappers -------------------------------------------------------------------------


def test_owner_keys_maps_matching_owner_references_to_namespaced_keys() -> None:
    obj = _owned(
        "team-a",
        _ref("kustos.dev/v1alpha1", "EtcdCluster", "main"),
        _ref("apps/v1", "StatefulSet", "main"),  # another kind
        _ref("other.dev/v1alpha1", "EtcdCluster", "impostor"),  # same kind, another group
        _ref("kustos.dev/v1beta1", "EtcdCluster", "second"),  # another version of the group: still ours
    )
    assert list(owner_keys(CLUSTERS)(obj)) == ["team-a/main", "team-a/second"]


def test_owner_keys_core_group_and_cluster_scoped_owners() -> None:
    pod = _owned("team-a", _ref("v1", "Node", "worker-1"), _ref("apps/v1", "Node", "not-core"))
    assert list(owner_keys(NODES)(pod)) == ["worker-1"]
    namespaces = ResourceRef("", "v1", "namespaces", "Namespace", namespaced=False)
    assert list(owner_keys(namespaces)(_owned(None, _ref("v1", "Namespace", "ns")))) == ["ns"]


def test_owner_keys_without_owners_or_metadata_yields_nothing() -> None:
    mapper = owner_keys(CLUSTERS)
    assert list(mapper({})) == []
    assert list(mapper({"metadata": None})) == []
    assert list(mapper({"metadata": {"name": "x", "ownerReferences": None}})) == []


@given(
    namespace=st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
    names=st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True), max_size=5),
    kinds=st.lists(st.sampled_from(["EtcdCluster", "StatefulSet", "Pod"]), min_size=5, max_size=5),
)
def test_owner_keys_yields_exactly_the_matching_owners(
    namespace: str, names: list[str], kinds: list[str]
) -> None:
    refs = [_ref("kustos.dev/v1alpha1", kind, name) for name, kind in zip(names, kinds, strict=False)]
    expected = [f"{namespace}/{r['name']}" for r in refs if r["kind"] == "EtcdCluster"]
    assert list(owner_keys(CLUSTERS)(_owned(namespace, *refs))) == expected


def test_label_keys() -> None:
    label = "kustos.dev/cluster"
    labelled = {"metadata": {"namespace": "team-a", "name": "pod-0", "labels": {label: "main"}}}
    assert list(label_keys(label)(labelled)) == ["team-a/main"]
    assert list(label_keys(label, namespaced=False)(labelled)) == ["main"]
    cluster_scoped = {"metadata": {"name": "node-1", "labels": {label: "main"}}}
    assert list(label_keys(label)(cluster_scoped)) == ["main"]
    assert list(label_keys(label)({"metadata": {"namespace": "team-a", "labels": {"other": "x"}}})) == []
    assert list(label_keys(label)({"metadata": {"namespace": "team-a", "labels": {label: ""}}})) == []
    assert list(label_keys(label)({"metadata": {"labels": None}})) == []
    assert list(label_keys(label)({})) == []


def test_controller_owns_and_watch_register_watches() -> None:
    async def reconcile(key: str) -> None:
        return None

    pods = ResourceRef("", "v1", "pods", "Pod")
    controller = Controller("etcd", CLUSTERS, reconcile).owns(pods).watch(NODES, label_keys("x", False))
    assert [w.resource for w in controller.watches] == [pods, NODES]
    owned = _owned("team-a", _ref("kustos.dev/v1alpha1", "EtcdCluster", "main"))
    assert list(controller.watches[0].map_keys(owned)) == ["team-a/main"]


# ---- the runner --------------------------------------------------------------------------


def _fast_limiter() -> RateLimiter:
    return RateLimiter(ExponentialBackoff(base=0.01, cap=0.5), TokenBucket(rate=1e9, burst=1_000_000))


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"controller": "test", **labels})
    return 0.0 if value is None else value


@asynccontextmanager
async def _running(
    reconcile: Callable[[str], Awaitable[Result | None]], workers: int = 1, stop_timeout: float = 1.0
) -> AsyncIterator[tuple[ControllerRunner, Metrics]]:
    metrics = Metrics()
    runner = ControllerRunner(
        Controller("test", CLUSTERS, reconcile, workers=workers, limiter=_fast_limiter()), metrics
    )
    runner.start()
    try:
        yield runner, metrics
    finally:
        await runner.stop(stop_timeout)


async def test_a_successful_reconcile_is_counted() -> None:
    seen: list[str] = []
    done = asyncio.Event()

    async def reconcile(key: str) -> None:
        seen.append(key)
        done.set()

    async with _running(reconcile) as (runner, metrics):
        runner.enqueue("ns/a")
        await asyncio.wait_for(done.wait(), 1)
        await asyncio.sleep(0.01)
        assert seen == ["ns/a"]
        assert _sample(metrics, "controller_runtime_reconcile_total", result="success") == 1
        assert _sample(metrics, "controller_runtime_reconcile_total", result="error") == 0
        assert _sample(metrics, "controller_runtime_reconcile_time_seconds_count") == 1
        assert _sample(metrics, "controller_runtime_active_workers") == 0
        assert _sample(metrics, "controller_runtime_max_concurrent_reconciles") == 1
    await asyncio.sleep(0.05)
    assert seen == ["ns/a"]  # success: not called again


async def test_a_failing_reconcile_is_retried_with_backoff_until_it_succeeds() -> None:
    loop = asyncio.get_running_loop()
    calls: list[float] = []
    done = asyncio.Event()

    async def reconcile(key: str) -> None:
        calls.append(loop.time())
        if len(calls) <= 3:
            raise RuntimeError(f"boom {len(calls)}")
        done.set()

    async with _running(reconcile) as (runner, metrics):
        runner.enqueue("ns/a")
        await asyncio.wait_for(done.wait(), 2)
        await asyncio.sleep(0.01)
        assert len(calls) == 4
        gaps = [b - a for a, b in itertools.pairwise(calls)]
        for attempt, gap in enumerate(gaps):
            assert gap >= 0.01 * 2**attempt - SLACK
        assert _sample(metrics, "controller_runtime_reconcile_errors_total") == 3
        assert _sample(metrics, "controller_runtime_reconcile_total", result="error") == 3
        assert _sample(metrics, "controller_runtime_reconcile_total", result="success") == 1
        assert metrics.registry.get_sample_value("workqueue_retries_total", {"name": "test"}) == 3
        assert runner.queue.failures("ns/a") == 0  # success forgets the backoff
        assert _sample(metrics, "controller_runtime_active_workers") == 0


async def test_a_failing_reconcile_logs_a_warning_with_the_retry(caplog: pytest.LogCaptureFixture) -> None:
    done = asyncio.Event()

    async def reconcile(key: str) -> None:
        done.set()
        raise ValueError("broken spec")

    with caplog.at_level(logging.WARNING, logger="kustos.runtime.controller"):
        async with _running(reconcile) as (runner, _):
            runner.enqueue("ns/a")
            await asyncio.wait_for(done.wait(), 1)
            await asyncio.sleep(0.005)
    messages = [r.getMessage() for r in caplog.records if r.name == "kustos.runtime.controller"]
    assert any("retry 1" in m and "broken spec" in m for m in messages)


async def test_requeue_after_calls_again_after_the_delay() -> None:
    loop = asyncio.get_running_loop()
    calls: list[float] = []
    done = asyncio.Event()

    async def reconcile(key: str) -> Result | None:
        calls.append(loop.time())
        if len(calls) == 1:
            return Result(requeue_after=0.05)
        done.set()
        return None

    async with _running(reconcile) as (runner, metrics):
        runner.enqueue("ns/a")
        await asyncio.wait_for(done.wait(), 1)
        assert calls[1] - calls[0] >= 0.05 - SLACK
        await asyncio.sleep(0.01)
        assert _sample(metrics, "controller_runtime_reconcile_total", result="requeue_after") == 1
        assert _sample(metrics, "controller_runtime_reconcile_total", result="success") == 1
        assert _sample(metrics, "controller_runtime_reconcile_errors_total") == 0


async def test_result_without_requeue_is_a_plain_success() -> None:
    done = asyncio.Event()

    async def reconcile(key: str) -> Result:
        done.set()
        return Result()

    async with _running(reconcile) as (runner, metrics):
        runner.enqueue("a")
        await asyncio.wait_for(done.wait(), 1)
        await asyncio.sleep(0.01)
        assert _sample(metrics, "controller_runtime_reconcile_total", result="success") == 1


async def test_never_two_concurrent_reconciles_of_one_key() -> None:
    keys = [f"ns/k{i}" for i in range(6)]
    in_flight: set[str] = set()
    overlaps: list[str] = []
    peak = 0
    starts: dict[str, list[int]] = {key: [] for key in keys}
    clock = 0

    async def reconcile(key: str) -> None:
        nonlocal peak, clock
        if key in in_flight:
            overlaps.append(key)
        in_flight.add(key)
        clock += 1
        starts[key].append(clock)
        peak = max(peak, len(in_flight))
        try:
            await asyncio.sleep(0.002 * (1 + int(key[-1]) % 3))
        finally:
            in_flight.discard(key)

    last_enqueue: dict[str, int] = {}
    async with _running(reconcile, workers=4) as (runner, metrics):
        for round_ in range(30):
            for key in keys[round_ % 3 :]:
                clock += 1
                last_enqueue[key] = clock
                runner.enqueue(key)
            await asyncio.sleep(0.001)
        for _ in range(500):
            if not in_flight and len(runner.queue) == 0:
                break
            await asyncio.sleep(0.005)
        assert _sample(metrics, "controller_runtime_max_concurrent_reconciles") == 4
    assert overlaps == []
    assert peak > 1  # the workers did run different keys side by side
    for key in keys:
        assert starts[key][-1] > last_enqueue[key], f"{key} not reconciled after its last enqueue"


async def test_stop_waits_for_an_in_flight_reconcile() -> None:
    started = asyncio.Event()
    finished: list[str] = []

    async def reconcile(key: str) -> None:
        started.set()
        await asyncio.sleep(0.1)
        finished.append(key)

    metrics = Metrics()
    runner = ControllerRunner(Controller("test", CLUSTERS, reconcile, workers=2), metrics)
    runner.start()
    runner.enqueue("ns/a")
    await asyncio.wait_for(started.wait(), 1)
    await runner.stop(timeout=5)
    assert finished == ["ns/a"]
    assert _sample(metrics, "controller_runtime_reconcile_total", result="success") == 1
    assert _sample(metrics, "controller_runtime_active_workers") == 0


async def test_stop_cancels_a_reconcile_that_outlives_the_timeout() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    outcome: list[str] = []

    async def reconcile(key: str) -> None:
        started.set()
        try:
            await asyncio.sleep(10)
            outcome.append("finished")
        except asyncio.CancelledError:
            outcome.append("cancelled")
            raise

    metrics = Metrics()
    runner = ControllerRunner(Controller("test", CLUSTERS, reconcile), metrics)
    runner.start()
    runner.enqueue("ns/a")
    await asyncio.wait_for(started.wait(), 1)
    begin = loop.time()
    await runner.stop(timeout=0.05)
    assert 0.05 - SLACK <= loop.time() - begin < 1
    assert outcome == ["cancelled"]
    assert _sample(metrics, "controller_runtime_active_workers") == 0
    assert _sample(metrics, "controller_runtime_reconcile_total", result="success") == 0


async def test_stop_returns_promptly_when_idle() -> None:
    async def reconcile(key: str) -> None:
        return None

    loop = asyncio.get_running_loop()
    runner = ControllerRunner(Controller("test", CLUSTERS, reconcile, workers=3), Metrics())
    runner.start()
    await asyncio.sleep(0.01)
    begin = loop.time()
    await runner.stop(timeout=5)
    assert loop.time() - begin < 0.5


async def test_a_key_that_keeps_failing_does_not_stop_the_workers() -> None:
    other_done = asyncio.Event()

    async def reconcile(key: str) -> None:
        if key == "ns/broken":
            raise RuntimeError("still broken")
        other_done.set()

    limiter = _fast_limiter()
    for _ in range(1100):  # the key's history: it has been failing for a long time
        with suppress(OverflowError):
            limiter.when("ns/broken")
    runner = ControllerRunner(Controller("test", CLUSTERS, reconcile, workers=1, limiter=limiter), Metrics())
    runner.start()
    try:
        runner.enqueue("ns/broken")
        await asyncio.sleep(0.02)
        runner.enqueue("ns/fine")
        await asyncio.wait_for(other_done.wait(), 0.5)
    finally:
        await runner.stop(0.5)


# ---- typed failures and the per-reconcile timeout ----------------------------------------


async def _fail_once_with(err: Exception, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    done = asyncio.Event()

    async def reconcile(key: str) -> None:
        done.set()
        raise err

    with caplog.at_level(logging.INFO, logger="kustos.runtime.controller"):
        async with _running(reconcile) as (runner, _):
            runner.enqueue("ns/a")
            await asyncio.wait_for(done.wait(), 1)
            await asyncio.sleep(0.005)
    return [r for r in caplog.records if r.name == "kustos.runtime.controller"]


async def test_a_reconcile_error_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    records = await _fail_once_with(ReconcileError("etcd unreachable", "EtcdUnavailable"), caplog)
    assert records[0].levelno == logging.WARNING and records[0].exc_info is None
    assert records[0].getMessage() == "reconcile failed (retry 1): etcd unreachable"


async def test_a_network_error_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    records = await _fail_once_with(httpx2.ConnectError("All connection attempts failed"), caplog)
    assert records[0].exc_info is None
    assert "ConnectError: All connection attempts failed" in records[0].getMessage()


async def test_an_unexpected_exception_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    records = await _fail_once_with(KeyError("name"), caplog)
    assert records[0].levelno == logging.ERROR and records[0].exc_info is not None


async def test_a_conflict_is_routine(caplog: pytest.LogCaptureFixture) -> None:
    records = await _fail_once_with(ApiStatusError(409, "Conflict", "the object has been modified"), caplog)
    assert records[0].levelno == logging.INFO


async def test_a_terminal_error_is_counted_and_not_retried() -> None:
    calls: list[str] = []

    async def reconcile(key: str) -> None:
        calls.append(key)
        raise TerminalError("spec.size must be odd", "InvalidSpec")

    async with _running(reconcile) as (runner, metrics):
        runner.enqueue("ns/a")
        await asyncio.sleep(0.2)
        assert calls == ["ns/a"]
        assert _sample(metrics, "controller_runtime_reconcile_errors_total") == 1
        assert runner.queue.failures("ns/a") == 0
        runner.enqueue("ns/a")  # the object changed: called again
        await asyncio.sleep(0.05)
        assert calls == ["ns/a", "ns/a"]


# The API server's answer to a create in a namespace being deleted (namespace lifecycle admission).
TERMINATING = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'pods "bench-2" is forbidden: unable to create new content in namespace gone because '
               "it is being terminated",
    "details": {"name": "bench-2", "kind": "pods", "causes": [
        {"reason": "NamespaceTerminating", "message": "namespace gone is being terminated",
         "field": "metadata.namespace"}]},
}  # fmt: skip


def _refusal(body: dict[str, Any]) -> ApiStatusError:
    with pytest.raises(ApiStatusError) as refused:
        raise_for(httpx2.Response(body["code"], json=body))
    return refused.value


def test_a_refusal_in_a_namespace_being_deleted_is_told_apart_from_other_refusals() -> None:
    refusal = _refusal(TERMINATING)
    assert namespace_terminating(refusal)
    with pytest.raises(ReconcileError) as wrapped:  # a family's own error, raised from it
        raise ReconcileError(f"the API server refused pod bench-2: {refusal}", "PodRefused") from refusal
    assert namespace_terminating(wrapped.value)
    quota = {**TERMINATING, "message": "exceeded quota", "details": {"causes": [{"message": "pods: 10"}]}}
    assert not namespace_terminating(_refusal(quota))
    assert not namespace_terminating(ApiStatusError(403, "Forbidden", "RBAC: cannot create pods"))


async def test_a_pass_refused_in_a_namespace_being_deleted_is_retried_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    async def reconcile(key: str) -> None:
        calls.append(key)
        if len(calls) < 3:
            raise _refusal(TERMINATING)

    with caplog.at_level(logging.INFO, logger="kustos.runtime.controller"):
        async with _running(reconcile) as (runner, _):
            runner.enqueue("gone/a")
            await asyncio.sleep(0.2)  # backoff of 10 and 20 ms
            assert calls == ["gone/a"] * 3 and runner.queue.failures("gone/a") == 0
    records = [r for r in caplog.records if r.name == "kustos.runtime.controller"]
    assert [r.levelno for r in records] == [logging.INFO, logging.INFO]
    assert "namespace being deleted (retry 2)" in records[1].getMessage()


async def test_a_hung_reconcile_times_out_and_frees_the_worker() -> None:
    calls: list[str] = []
    second = asyncio.Event()

    async def reconcile(key: str) -> None:
        calls.append(key)
        if key == "ns/hung":
            await asyncio.sleep(3600)
        second.set()

    metrics = Metrics()
    controller = Controller("test", CLUSTERS, reconcile, workers=1, limiter=_fast_limiter(), timeout=0.05)
    runner = ControllerRunner(controller, metrics)
    runner.start()
    try:
        runner.enqueue("ns/hung")
        runner.enqueue("ns/b")
        await asyncio.wait_for(second.wait(), 2)
        assert _sample(metrics, "controller_runtime_reconcile_errors_total") >= 1
        assert runner.queue.failures("ns/hung") >= 1  # retried with backoff
    finally:
        await runner.stop(0.1)


async def test_a_timeout_raised_inside_is_not_mistaken_for_ours() -> None:
    async def reconcile(key: str) -> None:
        raise TimeoutError("etcd did not answer")

    runner = ControllerRunner(Controller("test", CLUSTERS, reconcile, timeout=5), Metrics())
    with pytest.raises(TimeoutError, match="etcd did not answer"):
        await runner._call("ns/a")

    async def slow(key: str) -> None:
        await asyncio.sleep(1)

    runner = ControllerRunner(Controller("test", CLUSTERS, slow, timeout=0.01), Metrics())
    with pytest.raises(ReconcileTimeout):
        await runner._call("ns/a")


async def test_a_retry_after_is_waited_for_instead_of_the_backoff() -> None:
    """A provider that says "retry after 0.3 s" is asked again after that, not after the backoff's
    first few milliseconds; the failure still counts toward the key's backoff."""
    loop = asyncio.get_running_loop()
    calls: list[float] = []

    async def reconcile(key: str) -> None:
        calls.append(loop.time())
        if len(calls) == 1:
            raise RetryAfter("throttled by the provider", retry_after=0.3)

    async with _running(reconcile) as (runner, _metrics):
        runner.enqueue("ns/a")
        await asyncio.sleep(0.1)
        assert len(calls) == 1  # the backoff alone (5 ms) would have called it again by now
        assert runner.queue.failures("ns/a") == 1
        await asyncio.sleep(0.4)
        assert len(calls) == 2
        assert calls[1] - calls[0] >= 0.3 - SLACK


def test_throttled_is_a_retry_after() -> None:
    err = Throttled("rate exceeded", retry_after=2.0)
    assert isinstance(err, RetryAfter) and isinstance(err, ProviderError)
    assert (err.retry_after, err.reason, err.message) == (2.0, "ProviderThrottled", "rate exceeded")
