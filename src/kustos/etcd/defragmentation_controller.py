"""Defragmentation of EtcdCluster members: observe every member's database, plan, defragment one.

A ``FamilyReconciler`` of EtcdClusters beside the EtcdCluster controller: it reads the
cluster's status (phase, members, client URLs) that controller writes, asks each member
for its status and health (``observe.member_health``), and takes at most one step per
pass (``defragmentation.plan``). Its status is ``status.maintenance`` alone: it replaces
the status it read with that field changed, guarded by the resourceVersion, and on a
conflict reads it again, so it never overwrites what the EtcdCluster controller records.
Before a defragmentation starts, ``status.maintenance.inProgress`` says so (the one step
that records its intent before it acts): an operator that stops in the middle leaves a
record that the next one finishes, and no second member is touched meanwhile.

Members of a TLS cluster are asked with the operator's client certificate, the one the
EtcdCluster controller keeps (``certs.operator_certificates``); this controller only reads it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.etcd import EtcdCluster, MaintenanceStatus
from kustos.etcd import defragmentation as defrag
from kustos.etcd.certs import operator_certificates
from kustos.etcd.client import Compacted, EtcdClient, EtcdError, EtcdTLS
from kustos.etcd.observe import member_health
from kustos.etcd.pods import space_shortage
from kustos.etcd.resources import ETCDCLUSTERS
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller, status_matters
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note
from kustos.runtime.steps import Wait
from kustos.runtime.times import parse_duration, rfc3339

log = logging.getLogger(__name__)

Obj = dict[str, Any]
StepOrOutcome = defrag.Step | defrag.Outcome

STATUS_TIMEOUT = 3.0
WRITE_ATTEMPTS = 5  # a conflicting write of the EtcdCluster controller: read again and retry
DEFRAGMENT_TIMEOUT = 600.0  # a large database takes a while; the member is blocked meanwhile
WAIT = 5.0  # a cluster that is not settled is looked at again this soon
AFTER_STEP = 1.0
NO_CLIENT_CERTIFICATE = "waiting for the operator's client certificate"


@dataclass(frozen=True)
class Observation:
    """One pass's view: ``gate`` is a step decided before asking etcd (cheap gates first: no
    etcd calls and no writes while nothing could start anyway); else ``planned`` is the
    planner's input, from the members' own answers."""

    raw: Obj | None
    """The object as read afresh past the gates (the cache may lag our own last write)."""
    recorded: MaintenanceStatus
    cluster: EtcdCluster
    interval: float
    gate: defrag.Step | defrag.Say | None = None
    planned: defrag.Observed | None = None
    tls: EtcdTLS | None = None

    @property
    def worth_saying(self) -> bool:
        """A planned wait is recorded only when a member wants defragmenting (or to replace a
        stale certificate wait): most clusters need nothing, most of the time."""
        stale = (self.recorded.message or "").startswith(NO_CLIENT_CERTIFICATE)
        return stale or (self.planned is not None and bool(defrag.wanting(self.planned)))


class DefragmentationReconciler(FamilyReconciler[EtcdCluster, Observation, StepOrOutcome]):
    model = EtcdCluster

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.certs = operator_certificates(manager)

    def settled(self, obj: EtcdCluster) -> bool:
        """Defragmentation off and nothing of it under way: no pass. etcd's NOSPACE alarm (the
        EtcdCluster controller reports it) is recovered whatever the settings: writes are
        refused until then."""
        recorded = _recorded(obj)
        space = _no_space_reported(obj) or recorded.no_space is not None
        return (
            not defrag.settings(obj.spec.maintenance).enabled and recorded.in_progress is None and not space
        )

    # ---- observe -----------------------------------------------------------------------

    async def observe(self, obj: EtcdCluster, now: datetime) -> Observation:
        settings = defrag.settings(obj.spec.maintenance)
        interval = parse_duration(settings.check_interval).total_seconds() or 1.0
        recorded = _recorded(obj)
        cached = Observation(None, recorded, obj, interval)
        try:
            window_open, next_tick = defrag.in_window(settings.schedule, parse_duration(settings.window), now)
        except ValueError as err:
            message = f"spec.maintenance.defragmentation.schedule: {err}"
            return _gated(cached, defrag.Say(message, invalid=True))
        if recorded.in_progress is None and not (_no_space_reported(obj) or recorded.no_space):
            if not window_open and next_tick is not None:
                wait = max(1.0, (next_tick - now).total_seconds())
                return _gated(cached, Wait("outside the schedule's window", wait))
            if (obj.status.phase if obj.status else None) != "Running":
                return _gated(cached, Wait("the cluster is not Running", WAIT))  # its status wakes us
        fresh = await self.api.get(ETCDCLUSTERS, objects.namespace(obj), objects.name(obj))
        if fresh is None:
            return _gated(cached, Wait("the cluster is gone", 0.0))
        try:
            cluster = EtcdCluster.model_validate(fresh)
        except ValidationError:
            return _gated(
                cached, Wait("the spec changed to one the model refuses", 0.0)
            )  # its change wakes us
        recorded = _recorded(cluster)
        current = Observation(fresh, recorded, cluster, interval)
        tls, problem = await self.certs.client_tls(cluster)
        if problem is not None:
            # The EtcdCluster controller reports the Secret itself (CertificatesReady, an event).
            return _gated(
                current, defrag.Say(f"{NO_CLIENT_CERTIFICATE}: {problem}", seconds=min(WAIT, interval))
            )
        status = cluster.status
        members = [m for m in (status.members if status else []) if m.client_url]
        views = await asyncio.gather(*(member_health(m.name, m.client_url, tls) for m in members))
        planned = defrag.Observed(
            phase=status.phase if status else None, size=cluster.spec.size, members=tuple(views),
            threshold=settings.threshold, min_db_size=defrag.parse_quantity(settings.min_db_size),
            enabled=settings.enabled, window_open=window_open,
            in_progress=recorded.in_progress.member if recorded.in_progress else None,
            space=_space_record(recorded),
        )  # fmt: skip
        return Observation(fresh, recorded, cluster, interval, planned=planned, tls=tls)

    def plan(self, observed: Observation) -> StepOrOutcome:
        if observed.gate is not None:
            return observed.gate
        assert observed.planned is not None
        step = defrag.plan(observed.planned)
        if isinstance(step, Wait):
            step = Wait(step.reason, min(WAIT, observed.interval))
        if isinstance(step, Wait | defrag.Idle) and observed.worth_saying:
            return defrag.Say(step.reason, seconds=step.seconds if isinstance(step, Wait) else None)
        return step

    # ---- act ---------------------------------------------------------------------------

    async def act(
        self, obj: EtcdCluster, observed: Observation, step: StepOrOutcome, notes: list[Note]
    ) -> StepOrOutcome:
        now = rfc3339(self.clock.now())
        match step:
            case defrag.Defragment():
                step = await self._defragment(observed, step, now)
            case defrag.FinishRecord(member=member):
                started = observed.recorded.in_progress
                assert started is not None  # planned only then
                error = None if member.url else "the member is gone"
                step = defrag.Defragmented(started, member, error, None, now)
            case defrag.Compact(revision=revision):
                try:
                    async with EtcdClient(
                        self._url(observed), observed.tls, timeout=DEFRAGMENT_TIMEOUT
                    ) as client:
                        await client.compact(revision, physical=True)
                except Compacted:
                    pass  # compacted already (by etcd's auto-compaction, or a pass that stopped)
                step = defrag.Compacted(revision, now)
            case defrag.Disarm():
                async with EtcdClient(self._url(observed), observed.tls, timeout=STATUS_TIMEOUT) as client:
                    for alarm in await client.alarm_list():
                        if alarm.alarm == "NOSPACE":
                            await client.alarm_disarm(alarm.member_id, alarm.alarm)
                # What is left now is live data: if it fills the quota, so will the next writes.
                members = observed.planned.members if observed.planned else ()
                in_use = max((m.db_size_in_use for m in members), default=0)
                step = defrag.Disarmed(space_shortage(observed.cluster, in_use))
        notes.extend(defrag.notes(observed.recorded, step))
        if not isinstance(step, defrag.Say | Wait | defrag.Idle):
            log.info("%s", defrag.record(observed.recorded, step, None).message)
        return step

    async def _defragment(
        self, observed: Observation, step: defrag.Defragment, now: str
    ) -> defrag.Defragmented:
        """Record the intent, defragment, and measure what it gave back."""
        member = step.member
        intent = defrag.started(observed.recorded, defrag.Started(member, step.reason, now))
        assert observed.raw is not None  # read afresh: planned past the gates
        await self.write_status(observed.raw, _status(intent), [])  # first: nothing else starts meanwhile
        log.info("defragmenting %s", step.reason)
        assert intent.in_progress is not None
        started = time.monotonic()
        error: str | None = None
        try:
            async with EtcdClient(member.url, observed.tls, timeout=STATUS_TIMEOUT) as client:
                await client.defragment(timeout=DEFRAGMENT_TIMEOUT)
        except (EtcdError, OSError, TimeoutError) as err:
            error = str(err) or type(err).__name__
        after = await member_health(member.name, member.url, observed.tls)
        for _ in range(5):  # the member may take a moment to answer after a long defragmentation
            if after.db_size:
                break
            await asyncio.sleep(0.5)
            after = await member_health(member.name, member.url, observed.tls)
        seconds = time.monotonic() - started
        return defrag.Defragmented(intent.in_progress, after, error, seconds, rfc3339(self.clock.now()))

    @staticmethod
    def _url(observed: Observation) -> str:
        views = observed.planned.members if observed.planned else ()
        return next((m.url for m in views if m.healthy), views[0].url if views else "")

    # ---- status ------------------------------------------------------------------------

    def status(
        self, observed: Observation, step: StepOrOutcome, now: datetime, failure: ReconcileError | None
    ) -> Obj:
        return _status(defrag.record(observed.recorded, step, failure))

    def rejected(self, raw: Obj, failure: Any, now: datetime) -> Obj:
        """The EtcdCluster controller reports an invalid spec; this one keeps its record."""
        return {"maintenance": (raw.get("status") or {}).get("maintenance") or {}}

    def unobserved(self, raw: Obj, failure: ReconcileError, now: datetime) -> Obj:
        return _status(defrag.record(_read(raw.get("status") or {}), defrag.Say(""), failure))

    def requeue_after(self, observed: Observation, step: StepOrOutcome) -> float | None:
        match step:
            case Wait(seconds=seconds) | defrag.Say(seconds=float() as seconds):
                return seconds or None
            case defrag.Say(invalid=True):
                return None  # a spec change wakes us
            case defrag.Say() | defrag.Idle():
                return observed.interval
        return AFTER_STEP

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """Replace status.maintenance alone (only when it changed): the EtcdCluster controller
        owns the rest.

        The status as read, with this field replaced (a finished inProgress is cleared),
        guarded by the resourceVersion: on a conflict (the EtcdCluster controller wrote
        meanwhile, or the cache had not caught up with our own last write) the object is read
        again and the write retried, so a concurrent write of the other fields neither
        conflicts with nor is undone by this one.
        """
        current = raw
        for attempt in range(WRITE_ATTEMPTS):
            before = current.get("status") or {}
            if same_record(before, status):
                break
            # replace_status stamps observedGeneration from the object's generation; what the
            # EtcdCluster controller observed stays as it recorded it (the API server ignores a
            # generation sent in a status write).
            observed = {
                **current,
                "metadata": {**current["metadata"], "generation": before.get("observedGeneration")},
            }
            try:
                updated = await self.api.replace_status(ETCDCLUSTERS, observed, {**before, **status})
            except ApiStatusError as err:
                if err.not_found:
                    return
                if not err.conflict or attempt == WRITE_ATTEMPTS - 1:
                    raise
                fresh = await self.api.get(ETCDCLUSTERS, objects.namespace(raw), objects.name(raw))
                if fresh is None:
                    return
                current = fresh
                continue
            current = updated
            break
        for note in notes:
            await self.manager.events.record(current, note.type, note.reason, note.message)


def _gated(observation: Observation, gate: defrag.Step | defrag.Say) -> Observation:
    return Observation(observation.raw, observation.recorded, observation.cluster, observation.interval, gate)


def same_record(before: Obj, after: Obj) -> bool:
    """The two statuses' ``maintenance`` say the same, however written: a new cluster's absent
    record and an empty one (``{"defragmentations": []}``) are one, and writing the second
    over the first cost every create a conflicting write and a pass of the EtcdCluster
    controller."""
    return _read(before) == _read(after)


def _read(status: Obj) -> MaintenanceStatus:
    return MaintenanceStatus.model_validate(status.get("maintenance") or {})


def _status(recorded: MaintenanceStatus) -> Obj:
    return {"maintenance": recorded.model_dump(by_alias=True, exclude_none=True)}


def _recorded(cluster: EtcdCluster) -> MaintenanceStatus:
    return (cluster.status.maintenance if cluster.status else None) or MaintenanceStatus()


def _space_record(recorded: MaintenanceStatus) -> defrag.SpaceRecovery | None:
    done = recorded.no_space
    return defrag.SpaceRecovery(done.compacted_revision, tuple(done.defragmented)) if done else None


def _no_space_reported(cluster: EtcdCluster) -> bool:
    """The EtcdCluster controller saw etcd's NOSPACE alarm (its SpaceAvailable condition)."""
    conditions = cluster.status.conditions if cluster.status else []
    return any(c.type == "SpaceAvailable" and c.status == "False" for c in conditions)


def decided_on(cluster: Obj) -> tuple[Any, ...]:
    """What of an EtcdCluster's status a pass decides on; its checks repeat on their interval."""
    status = cluster.get("status") or {}
    members = tuple((m.get("name"), m.get("clientUrl")) for m in status.get("members") or [])
    conditions = status.get("conditions") or []
    space = next((c.get("status") for c in conditions if c.get("type") == "SpaceAvailable"), None)
    return status.get("phase"), members, status.get("maintenance"), space


# The EtcdCluster controller records each step in the status: each write woke a pass, and once
# Running, each pass asked every member.
cluster_change_matters = status_matters(decided_on)


def register(manager: Manager, deps: Deps) -> None:
    reconciler = DefragmentationReconciler(manager, deps)
    # A pass may wait out one defragmentation: the runner's per-pass timeout must not cut it short.
    timeout = DEFRAGMENT_TIMEOUT + 60.0
    controller = Controller(
        "etcdmaintenance", ETCDCLUSTERS, reconciler.reconcile, workers=2, timeout=timeout,
        primary_matters=cluster_change_matters,
    )  # fmt: skip
    manager.add_controller(controller)
