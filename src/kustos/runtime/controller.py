"""A controller: a primary resource, what wakes it, a queue, and workers that reconcile.

A reconciler is ``async def reconcile(key) -> Result | None``. It observes (from
the caches), plans and acts one step; it may return ``Result(requeue_after=...)``
to be called again later, or raise to be retried with exponential backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from kustos.runtime.informer import InformerOptions, Obj, ResourceRef
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


@dataclass
class Watch:
    """A secondary resource whose changes wake the primary objects ``map_keys`` names."""

    resource: ResourceRef
    map_keys: KeyMapper
    options: InformerOptions | None = None


@dataclass
class Controller:
    name: str
    primary: ResourceRef
    reconcile: Reconciler
    workers: int = 1
    watches: list[Watch] = field(default_factory=list)
    primary_options: InformerOptions | None = None
    limiter: RateLimiter | None = None

    def owns(self, resource: ResourceRef, options: InformerOptions | None = None) -> Controller:
        """Wake the owner when an object it owns (by ownerReference) changes."""
        self.watches.append(Watch(resource, owner_keys(self.primary), options))
        return self

    def watch(
        self, resource: ResourceRef, map_keys: KeyMapper, options: InformerOptions | None = None
    ) -> Controller:
        self.watches.append(Watch(resource, map_keys, options))
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
        self._tasks.append(asyncio.create_task(self._gauges()))

    async def stop(self, timeout: float) -> None:
        """Stop taking work; give in-flight reconciles ``timeout`` seconds to finish."""
        self.queue.shut_down()
        # Workers leave once their current reconcile is done (the queue says ShutDown).
        workers = self._tasks[: self.controller.workers]
        if workers:
            await asyncio.wait(workers, timeout=timeout)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks, timeout=5)

    def abandon(self) -> None:
        """Stop at once, cancelling in-flight reconciles (the lease is gone)."""
        self.queue.shut_down()
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()

    async def _gauges(self) -> None:
        while True:
            self.queue.update_processing_metrics()
            await asyncio.sleep(1)

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
                result = await self.controller.reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.metrics.reconcile_total.labels(name, "error").inc()
                self.metrics.reconcile_errors.labels(name).inc()
                log.warning(
                    "reconcile failed (retry %d): %s", self.queue.failures(key) + 1, err,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )  # fmt: skip
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
