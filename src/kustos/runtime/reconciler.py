"""The reconcile every family shares, as code: fetch, validate, observe, plan, act one step,
record once, and turn any failure into a typed error the runner backs off.

controller-runtime's ``reconcile.AsReconciler`` fetches the object and owns requeue,
backoff and terminal errors so that reconcilers only decide and act; this is that shape
for kustos. A family subclasses ``FamilyReconciler`` and supplies four things:

- ``observe(obj, now) -> Observed``: caches, indexes, live answers (etcd, a cloud API);
- ``plan(observed) -> Step``: its pure planner;
- ``act(obj, observed, step, notes) -> Step``: exactly one safe step (the step as it turned
  out, when acting taught something the plan could not know); Events to say once go in
  ``notes``;
- ``status(observed, step, now, failure) -> dict``: the whole status, pure.

The base does the rest, the same way on every path:

- gone: nothing (owner references clean up); being deleted: ``finalize`` (default nothing);
- an invalid spec (one the CRD schema lets through and the model refuses): the previous
  status kept, the failure condition naming the field, a ``TerminalError`` (not retried
  until the object changes). Keeping the previous status matters: an empty observation
  would clear what the status remembers (a rollout's heirs and donors);
- observe fails: the previous status kept with the failure on the failure condition;
- act fails: ``status(observed, step, now, failure)``;
- the status is written once (``record``: only when it changed), then the failure raised:
  the runner logs it, counts it and backs the key off (or waits what a ``RetryAfter`` said);
- the next pass starts from that write while the cache still shows the object it replaced
  (``fetch``): a pass woken by a child's event often starts before the watch brings the
  write back, and would plan on the status before it, or be refused (409) writing onto it.

Failures are ``ReconcileError``s (API refusals, ``ApiUnreachable``, provider errors); a
network error that reaches here untyped (a client other than ``runtime.api``) is made one.
Anything else is a bug and propagates with its traceback.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

import httpx2
from pydantic import BaseModel, ValidationError

from kustos.runtime import objects
from kustos.runtime.conditions import Condition
from kustos.runtime.controller import Result
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError, TerminalError, as_reconcile_error
from kustos.runtime.informer import Informer, ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note, note_failure, record, warning

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ModelT = TypeVar("ModelT", bound=BaseModel)
ObservedT = TypeVar("ObservedT")
StepT = TypeVar("StepT")

# Failures a network or timeout raised below a client that does not type them itself.
NETWORK_ERRORS = (httpx2.TransportError, TimeoutError, ConnectionError)


class InvalidSpec(TerminalError):
    """The spec passed the CRD schema but not the model: retrying cannot help until it changes."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="InvalidSpec")


def invalid_spec(err: ValidationError) -> InvalidSpec:
    """The model's refusal as one line per field, each naming it (``spec.maxUnavailable: ...``)."""
    problems = []
    for error in err.errors():
        field = ".".join(str(part) for part in error.get("loc", ())) or "spec"
        problems.append(f"{field}: {error.get('msg', 'invalid')}")
    return InvalidSpec("invalid spec: " + "; ".join(problems))


def previous_with_failure(
    raw: Obj, failure: ReconcileError, now: datetime, condition: str, status: bool = True
) -> Obj:
    """The previous status, unchanged but for the failure on ``condition``: a pass that saw
    nothing (an invalid spec, an observation that failed) must not forget what earlier passes
    recorded."""
    previous = dict(raw.get("status") or {})
    previous.pop("observedGeneration", None)
    previous["conditions"] = note_failure(
        previous.get("conditions"), failure, now, objects.generation(raw), condition, status
    )
    return previous


class FamilyReconciler(ABC, Generic[ModelT, ObservedT, StepT]):
    """One family's reconcile: subclasses set ``model`` and supply observe, plan, act, status."""

    model: ClassVar[type[BaseModel]]
    failure_condition: ClassVar[str] = "Degraded"
    """The condition a failure (and an invalid spec) shows on, True while it lasts."""
    failure_status: ClassVar[bool] = True
    announce: ClassVar[Collection[str] | None] = None
    """Condition types whose transitions are Events (None: every one)."""
    plans_deletion: ClassVar[bool] = False
    """True: an object being deleted is observed, planned and acted on like any other (its
    planner removes the finalizer); False: ``finalize`` is called instead."""

    def __init__(self, manager: Manager, deps: Deps, cache: Informer | None = None) -> None:
        self.manager = manager
        self.api = manager.api
        self.deps = deps
        self.clock = deps.clock
        self.ref: ResourceRef = self.model.crd.ref  # type: ignore[attr-defined]
        self.cache = cache if cache is not None else manager.informer(self.ref)
        # Per object: the resourceVersions this reconciler's status writes replaced since the
        # cache last caught up, and the object the last write returned (``fetch``).
        self._written: dict[str, tuple[frozenset[str | None], Obj]] = {}

    # ---- what a family supplies -------------------------------------------------------------

    @abstractmethod
    async def observe(self, obj: ModelT, now: datetime) -> ObservedT: ...

    @abstractmethod
    def plan(self, observed: ObservedT) -> StepT: ...

    @abstractmethod
    async def act(self, obj: ModelT, observed: ObservedT, step: StepT, notes: list[Note]) -> StepT: ...

    @abstractmethod
    def status(self, observed: ObservedT, step: StepT, now: datetime, failure: ReconcileError | None) -> Obj:
        """The whole status (a replace), pure."""

    def requeue_after(self, observed: ObservedT, step: StepT) -> float | None:
        """Seconds until the next pass after a step that did not fail (None: until a change)."""
        return None

    def settled(self, obj: ModelT) -> bool:
        """True when nothing can change any more (a completed job): no pass at all."""
        return False

    async def finalize(self, raw: Obj) -> Result | None:
        """The object is being deleted (default: owner references clean up)."""
        return None

    # ---- the reconcile -----------------------------------------------------------------------

    def fetch(self, key: str) -> Obj | None:
        """The object ``key`` names (None: gone, nothing to do): the cache's copy, or this
        reconciler's own last status write while the cache still shows an object that write (or
        one just before it) replaced."""
        cached = self.cache.get(key)
        written = self._written.get(key)
        if cached is None or written is None:
            return cached
        replaced, newest = written
        if objects.resource_version(cached) in replaced:
            return newest
        del self._written[key]  # the cache has caught up, or someone else wrote since
        return cached

    def forget(self, key: str) -> None:
        """The object is gone or going: nothing of it to remember."""
        self._written.pop(key, None)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.fetch(key)
        if raw is None:
            self.forget(key)
            return None
        if objects.deleting(raw) and not self.plans_deletion:
            return await self.finalize(raw)
        now = self.clock.now()
        try:
            obj: ModelT = self.model.model_validate(raw)  # type: ignore[assignment]
        except ValidationError as err:
            invalid = invalid_spec(err)
            await self.write_status(raw, self.rejected(raw, invalid, now), [])
            raise invalid from None
        if self.settled(obj):
            return None
        try:
            observed = await self.observe(obj, now)
        except ReconcileError as err:
            await self.write_status(raw, self.unobserved(raw, err, now), [])
            raise
        except NETWORK_ERRORS as err:
            failure = as_reconcile_error(err)
            await self.write_status(raw, self.unobserved(raw, failure, now), [])
            raise failure from err
        step = self.plan(observed)
        notes: list[Note] = []
        failed: ReconcileError | None = None
        try:
            step = await self.act(obj, observed, step, notes)
        except ReconcileError as err:
            failed = err
        except NETWORK_ERRORS as err:
            failed = as_reconcile_error(err)
        await self.write_status(raw, self.status(observed, step, now, failed), notes)
        if failed is not None:
            raise failed
        after = self.requeue_after(observed, step)
        return Result(requeue_after=after) if after is not None else None

    def unobserved(self, raw: Obj, failure: ReconcileError, now: datetime) -> Obj:
        """The status of a pass whose observation failed: the previous one, failure noted."""
        return previous_with_failure(raw, failure, now, self.failure_condition, self.failure_status)

    def rejected(self, raw: Obj, failure: InvalidSpec, now: datetime) -> Obj:
        """The status of an invalid spec (default: the previous one, failure noted)."""
        return previous_with_failure(raw, failure, now, self.failure_condition, self.failure_status)

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """The pass's one status write and its Events (``record``: only when it changed)."""
        await self.record_status(raw, status, notes, announce=self.announce)

    async def record_status(
        self,
        onto: Obj,
        status: Obj,
        notes: list[Note] | None,
        *,
        announce: Collection[str] | None = None,
        is_warning: Callable[[Condition], bool] = warning,
    ) -> Obj:
        """``record`` onto ``onto`` (no Events at all when ``notes`` is None), remembered for
        ``fetch``: a family's own ``write_status`` writes through here too."""
        events = None if notes is None else self.manager.events
        updated = await record(
            self.api,
            self.ref,
            onto,
            status,
            events,
            notes=notes or (),
            announce=announce,
            is_warning=is_warning,
        )
        if updated is not onto:
            key, version = objects.key(onto), objects.resource_version(onto)
            replaced, newest = self._written.get(key, (frozenset(), None))
            if newest is None or objects.resource_version(newest) != version:
                replaced = frozenset()  # onto a copy other than our last write: a new chain
            self._written[key] = (replaced | {version}, updated)
        return updated


__all__ = ["NETWORK_ERRORS", "FamilyReconciler", "InvalidSpec", "invalid_spec", "previous_with_failure"]
