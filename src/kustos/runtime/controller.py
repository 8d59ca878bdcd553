"""A controller: a primary resource, what wakes it, a queue, and workers that reconcile.

A reconciler is ``async def reconcile(key) -> Result | None``. It observes (from
the caches), plans and acts one step; it may return ``Result(requeue_after=...)``
to be called again later, or raise to be retried with exponential backoff.

Failures (controller-runtime's reconcileHandler): every error is counted in
``controller_runtime_reconcile_errors_total`` and retried with the key's own
exponential backoff, capped. An expected failure (``ReconcileError``, an API or
network error) is logged as one line; anything else is a bug and keeps its
traceback. A ``RetryAfter`` that says how long is retried after exactly that, not its
growing backoff. A ``TerminalError`` is not retried: the object's next change wakes it.
A pass longer than the controller's ``timeout`` is cancelled as a
``ReconcileTimeout``, so one hung call cannot hold a worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import httpx2

from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError, namespace_terminating
from kustos.runtime.errors import ReconcileError, ReconcileTimeout, RetryAfter, TerminalError
from kustos.runtime.informer import Informer, InformerOptions, Obj, ResourceRef
from kustos.runtime.logs import reconcile_context
from kustos.runtime.metrics import Metrics
from kustos.runtime.workqueue import RateLimiter, ShutDown, WorkQueue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next: nothing (None) or another pass after a delay."""

    requeue_after: float | None = None


Reconciler = Callable[[str], Awaitable[Result | None]]
KeyMapper = Callable[[Obj], Iterable[str]]


def owner_keys(owner: ResourceRef) -> KeyMapper:
    """Map an owned object to its owners of kind ``owner`` through ownerReferences."""

    def keys(obj: Obj) -> Iterable[str]:
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace")
        for ref in meta.get("ownerReferences") or []:
            group = ref.get("apiVersion", "").rpartition("/")[0]
            if ref.get("kind") == owner.kind and group == owner.group:
                yield f"{namespace}/{ref['name']}" if owner.namespaced and namespace else ref["name"]

    return keys


def label_keys(label: str, namespaced: bool = True) -> KeyMapper:
    """Map an object to the owner named by one of its labels (e.g. ``kustos.dev/cluster``)."""

    def keys(obj: Obj) -> Iterable[str]:
        meta = obj.get("metadata") or {}
        value = (meta.get("labels") or {}).get(label)
        if value:
            namespace = meta.get("namespace")
            yield f"{namespace}/{value}" if namespaced and namespace else value

    return keys


def through_index(
    informer: Informer, index: str, value: Callable[[Obj], str | None], map_keys: KeyMapper
) -> KeyMapper:
    """Map a watched object through an index of another cache: e.g. a Node -> the pods indexed
    under its name (``Informer.index_by_node_name``) -> the clusters their labels name. A lookup,
    not a scan of every cached object per event."""

    def keys(obj: Obj) -> Iterable[str]:
        found = value(obj)
        if not found:
            return []
        return sorted({key for item in informer.by_index(index, found) for key in map_keys(item)})

    return keys


# (old, new) of an update: whether it changed anything the woken controller decides on.
ChangeFilter = Callable[[Obj, Obj], bool]


def status_matters(decided_on: Callable[[Obj], object]) -> ChangeFilter:
    """A ``primary_matters`` for a controller that reads a few fields of an object another
    controller records its steps in: an update wakes it when more than the status changed, or
    what ``decided_on`` takes from the object did."""

    def matters(old: Obj, new: Obj) -> bool:
        return objects.changed_beyond_status(old, new) or decided_on(old) != decided_on(new)

    return matters


@dataclass
class Watch:
    """A secondary resource whose changes wake the primary objects ``map_keys`` names."""

    resource: ResourceRef
    map_keys: KeyMapper
    options: InformerOptions | None = None
    matters: ChangeFilter | None = None
    """An update for which this says False wakes nobody (additions and deletions always wake)."""


@dataclass
class Controller:
    name: str
    primary: ResourceRef
    reconcile: Reconciler
    workers: int = 1
    watches: list[Watch] = field(default_factory=list)
    primary_options: InformerOptions | None = None
    limiter: RateLimiter | None = None
    timeout: float | None = 120.0
    """Seconds one reconcile may take before it is cancelled (None: no limit)."""
    wakes_on_own_status: bool = True
    """False: the watch event of a status this controller's own pass wrote (that very write,
    nobody's since) does not wake it again. For a controller whose every pass ends in a requeue
    or a failure, so that event only repeats a pass: it cost the etcd controller a pass (and a
    round of questions to every member) per status write (issue 28)."""
    primary_matters: ChangeFilter | None = None
    """An update of the primary object for which this says False wakes nobody: for a controller
    that decides on a few fields of an object another controller records every step in."""

    def owns(
        self,
        resource: ResourceRef,
        options: InformerOptions | None = None,
        matters: ChangeFilter | None = None,
    ) -> Controller:
        """Wake the owner when an object it owns (by ownerReference) changes (in a way that
        ``matters``, when given)."""
        self.watches.append(Watch(resource, owner_keys(self.primary), options, matters))
        return self

    def watch(
        self,
        resource: ResourceRef,
        map_keys: KeyMapper,
        options: InformerOptions | None = None,
        matters: ChangeFilter | None = None,
    ) -> Controller:
        self.watches.append(Watch(resource, map_keys, options, matters))
        return self


class ControllerRunner:
    """The queue and workers of one controller, once the manager has wired its informers."""

    def __init__(self, controller: Controller, metrics: Metrics) -> None:
        self.controller = controller
        self.metrics = metrics
        self.queue = WorkQueue(controller.name, controller.limiter, metrics)
        self._tasks: list[asyncio.Task[None]] = []

    def enqueue(self, key: str) -> None:
        self.queue.add(key)

    def start(self) -> None:
        name = self.controller.name
        self.metrics.max_concurrent.labels(name).set(self.controller.workers)
        self.metrics.active_workers.labels(name).set(0)
        for _ in range(self.controller.workers):
            self._tasks.append(asyncio.create_task(self._worker()))
        self.metrics.before_scrape.add(self.queue.update_processing_metrics)

    async def stop(self, timeout: float) -> None:
        """Stop taking work; give in-flight reconciles ``timeout`` seconds to finish."""
        self.queue.shut_down()
        self.metrics.before_scrape.discard(self.queue.update_processing_metrics)
        # Workers leave once their current reconcile is done (the queue says ShutDown).
        workers = self._tasks[: self.controller.workers]
        if workers:
            await asyncio.wait(workers, timeout=timeout)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:  # none when the controller never started (its caches never synced)
            await asyncio.wait(tasks, timeout=5)

    def abandon(self) -> None:
        """Stop at once, cancelling in-flight reconciles (the lease is gone)."""
        self.queue.shut_down()
        self.metrics.before_scrape.discard(self.queue.update_processing_metrics)
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except ShutDown:
                return
            try:
                await self._reconcile(key)
            finally:
                self.queue.done(key)

    async def _reconcile(self, key: str) -> None:
        name = self.controller.name
        active = self.metrics.active_workers.labels(name)
        active.inc()
        started = time.monotonic()
        with reconcile_context(name, key, uuid.uuid4().hex[:12]):
            try:
                result = await self._call(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.metrics.reconcile_total.labels(name, "error").inc()
                self.metrics.reconcile_errors.labels(name).inc()
                self._log_failure(key, err)
                if isinstance(err, TerminalError):
                    self.queue.forget(key)  # not retried: the object's next change wakes it
                elif isinstance(err, RetryAfter) and err.retry_after:
                    self.queue.add_rate_limited(key, retry_after=err.retry_after)
                else:
                    self.queue.add_rate_limited(key)
                return
            finally:
                self.metrics.reconcile_time.labels(name).observe(time.monotonic() - started)
                active.dec()
        self.queue.forget(key)
        if result is not None and result.requeue_after is not None:
            self.metrics.reconcile_total.labels(name, "requeue_after").inc()
            self.queue.add_after(key, result.requeue_after)
        else:
            self.metrics.reconcile_total.labels(name, "success").inc()

    async def _call(self, key: str) -> Result | None:
        limit = self.controller.timeout
        if limit is None:
            return await self.controller.reconcile(key)
        try:
            async with asyncio.timeout(limit) as scope:  # cancel-safe, unlike wait_for on 3.11
                return await self.controller.reconcile(key)
        except TimeoutError as err:
            if scope.expired():
                raise ReconcileTimeout(f"reconcile took longer than {limit:g}s and was cancelled") from err
            raise

    def _log_failure(self, key: str, err: Exception) -> None:
        if isinstance(err, TerminalError):
            log.warning("reconcile failed, not retried until %s changes: %s", key, err)
        elif namespace_terminating(err):
            # Routine while a namespace goes, its objects with it; retried with backoff all the
            # same (the refused namespace need not be the object's, and may come back).
            log.info("reconcile refused, namespace being deleted (retry %d): %s",
                     self.queue.failures(key) + 1, describe(err))  # fmt: skip
        elif isinstance(err, ApiStatusError) and err.conflict:
            # Someone wrote the object since the cache showed it: routine, retried on fresh state.
            log.info("reconcile retried (retry %d): %s", self.queue.failures(key) + 1, err)
        elif expected(err):
            log.warning("reconcile failed (retry %d): %s", self.queue.failures(key) + 1, describe(err))
        else:
            log.error("reconcile failed (retry %d): %s", self.queue.failures(key) + 1, describe(err),
                      exc_info=err)  # fmt: skip


def expected(err: BaseException) -> bool:
    """Failures that are not bugs and need no traceback: typed reconcile errors, API and network
    errors, timeouts."""
    return isinstance(err, ReconcileError | httpx2.HTTPError | TimeoutError | ConnectionError)


def describe(err: BaseException) -> str:
    """One line for a failure; the type when the message alone says nothing (a bare ConnectError)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if not isinstance(err, ReconcileError) or not text else text
