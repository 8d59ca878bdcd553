"""Defragmentation of EtcdCluster members: observe every member's database, plan, defragment one.

A controller of its own beside the EtcdCluster controller: it reads the cluster's
status (phase, members, client URLs) that controller writes, asks each member for its
status and health (``observe.member_health``), and defragments at most one member
per pass (``maintenance.plan``). It changes only ``status.maintenance``: it replaces the
status it read with that field changed, guarded by the resourceVersion, and on a
conflict reads it again, so it never overwrites what the EtcdCluster controller records.
Before a defragmentation starts, ``status.maintenance.inProgress`` says so: an operator
that stops in the middle leaves a record that the next one finishes, and no second
member is touched meanwhile.

Members of a TLS cluster are asked with the operator's client certificate, the one the
EtcdCluster controller keeps (``certs.operator_certificates``); this controller only reads it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from pydantic import ValidationError

from kustos.api.etcd import DefragmentationRecord, EtcdCluster, MaintenanceStatus, NoSpaceRecovery
from kustos.etcd import maintenance as plan
from kustos.etcd.certs import operator_certificates
from kustos.etcd.client import Compacted, EtcdClient, EtcdError, EtcdTLS
from kustos.etcd.observe import member_health
from kustos.etcd.pods import space_shortage
from kustos.etcd.resources import ETCDCLUSTERS
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.clock import Clock
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.manager import Manager
from kustos.runtime.steps import Wait
from kustos.runtime.times import parse_duration, rfc3339

log = logging.getLogger(__name__)

STATUS_TIMEOUT = 3.0
WRITE_ATTEMPTS = 5  # a conflicting write of the EtcdCluster controller: read again and retry
DEFRAGMENT_TIMEOUT = 600.0  # a large database takes a while; the member is blocked meanwhile
WAIT = 5.0  # a cluster that is not settled is looked at again this soon
AFTER_STEP = 1.0
NO_CLIENT_CERTIFICATE = "waiting for the operator's client certificate"


class MaintenanceReconciler:
    def __init__(self, manager: Manager, deps: Deps | None = None) -> None:
        self.manager = manager
        self.api = manager.api
        self.clock: Clock = (deps or Deps()).clock
        self.clusters = manager.informer(ETCDCLUSTERS)
        self.certs = operator_certificates(manager)

    async def reconcile(self, key: str) -> Result | None:
        cached = self.clusters.get(key)
        if cached is None or objects.deleting(cached):
            return None
        try:
            cluster = EtcdCluster.model_validate(cached)
        except ValidationError:
            return None  # the EtcdCluster controller reports an invalid spec
        settings = plan.settings(cluster.spec.maintenance)
        recorded = (cluster.status.maintenance if cluster.status else None) or MaintenanceStatus()
        # etcd's NOSPACE alarm (the EtcdCluster controller reports it) is recovered whatever the
        # defragmentation settings: writes are refused until then.
        space = _no_space_reported(cached) or recorded.no_space is not None
        if not settings.enabled and recorded.in_progress is None and not space:
            return None
        interval = parse_duration(settings.check_interval).total_seconds() or 1.0
        now = self.clock.now()
        try:
            window_open, next_tick = plan.in_window(settings.schedule, parse_duration(settings.window), now)
        except ValueError as err:
            await self._note(  # a copy: the write below updates its object, never the cache's
                {**cached}, recorded, f"spec.maintenance.defragmentation.schedule: {err}", warning=True
            )
            return None  # a spec change wakes us
        if recorded.in_progress is None and not space:
            # Cheap gates first: no etcd calls and no writes while nothing could start anyway.
            if not window_open and next_tick is not None:
                return Result(requeue_after=max(1.0, (next_tick - now).total_seconds()))
            if (cluster.status.phase if cluster.status else None) != "Running":
                return Result(requeue_after=WAIT)  # its status changes wake us too
        # Read it afresh: the cache may not hold our own last write to status.maintenance yet.
        raw = await self.api.get(ETCDCLUSTERS, objects.namespace(cached), objects.name(cached))
        if raw is None:
            return None
        try:
            cluster = EtcdCluster.model_validate(raw)
        except ValidationError:
            return None
        status = cluster.status
        recorded = (status.maintenance if status else None) or MaintenanceStatus()
        tls, problem = await self.certs.client_tls(cluster)
        if problem is not None:
            # The EtcdCluster controller reports the Secret itself (CertificatesReady, an event).
            await self._note(raw, recorded, f"{NO_CLIENT_CERTIFICATE}: {problem}")
            return Result(requeue_after=min(WAIT, interval))
        members = [m for m in (status.members if status else []) if m.client_url]
        views = await asyncio.gather(*(member_health(m.name, m.client_url, tls) for m in members))
        observed = plan.Observed(
            phase=status.phase if status else None, size=cluster.spec.size, members=tuple(views),
            threshold=settings.threshold, min_db_size=plan.parse_quantity(settings.min_db_size),
            enabled=settings.enabled, window_open=window_open,
            in_progress=recorded.in_progress.member if recorded.in_progress else None,
            space=_space_record(recorded),
        )  # fmt: skip
        step = plan.plan(observed)
        if isinstance(step, plan.Compact | plan.Disarm | plan.FinishSpace):
            await self._recover_space(raw, cluster, recorded, step, views, tls)
            return Result(requeue_after=AFTER_STEP)
        if isinstance(step, plan.Defragment):
            await self._defragment(raw, recorded, step, tls)
            return Result(requeue_after=AFTER_STEP)
        if isinstance(step, plan.FinishRecord):
            await self._finish_interrupted(raw, recorded, step.member)
            return Result(requeue_after=AFTER_STEP)
        if plan.wanting(observed) or (recorded.message or "").startswith(NO_CLIENT_CERTIFICATE):
            # Only then is a reason worth a status write: most clusters need nothing, most of the time.
            await self._note(raw, recorded, step.reason)
        if isinstance(step, Wait):
            return Result(requeue_after=min(WAIT, interval))
        return Result(requeue_after=interval)

    # ---- act ---------------------------------------------------------------------------

    async def _defragment(
        self, raw: dict[str, Any], recorded: MaintenanceStatus, step: plan.Defragment, tls: EtcdTLS | None
    ) -> None:
        member = step.member
        record = DefragmentationRecord(
            member=member.name,
            started_at=rfc3339(self.clock.now()),
            db_size_before=member.db_size,
            leader=member.leader,
        )
        recorded.in_progress = record
        recorded.message = f"defragmenting {step.reason}"
        await self._write(raw, recorded)  # first, so that nothing else starts while it runs
        log.info("defragmenting %s", step.reason)
        started = time.monotonic()
        error: str | None = None
        try:
            async with EtcdClient(member.url, tls, timeout=STATUS_TIMEOUT) as client:
                await client.defragment(timeout=DEFRAGMENT_TIMEOUT)
        except (EtcdError, OSError, TimeoutError) as err:
            error = str(err) or type(err).__name__
        after = await member_health(member.name, member.url, tls)
        for _ in range(5):  # the member may take a moment to answer after a long defragmentation
            if after.db_size:
                break
            await asyncio.sleep(0.5)
            after = await member_health(member.name, member.url, tls)
        await self._complete(raw, recorded, record, after, error, time.monotonic() - started)

    async def _finish_interrupted(
        self, raw: dict[str, Any], recorded: MaintenanceStatus, member: plan.MemberView
    ) -> None:
        record = recorded.in_progress
        assert record is not None
        error = None if member.url else "the member is gone"
        await self._complete(raw, recorded, record, member, error, None)

    async def _complete(
        self, raw: dict[str, Any], recorded: MaintenanceStatus, record: DefragmentationRecord,
        after: plan.MemberView, error: str | None, seconds: float | None,
    ) -> None:  # fmt: skip
        record.completed_at = rfc3339(self.clock.now())
        if after.db_size:
            record.db_size_after = after.db_size
            record.reclaimed = max(0, record.db_size_before - after.db_size)
        record.error = error
        took = f" in {seconds:.1f}s" if seconds is not None else ""
        if error is None:
            message = (
                f"defragmented {'leader' if record.leader else 'follower'} {record.member}{took}: "
                f"{record.db_size_before} -> {record.db_size_after} bytes ({record.reclaimed} reclaimed)"
            )
        else:
            message = f"defragmenting {record.member} failed: {error}"
        log.info("%s", message)
        recorded.in_progress = None
        if (
            error is None
            and recorded.no_space is not None
            and record.member not in recorded.no_space.defragmented
        ):
            recorded.no_space.defragmented.append(record.member)
        recorded.defragmentations = [d for d in recorded.defragmentations if d.member != record.member]
        recorded.defragmentations.append(record)
        recorded.message = message
        await self._write(raw, recorded)
        if error is None:
            await self.manager.events.record(raw, NORMAL, "Defragmented", message)
        else:
            await self.manager.events.record(raw, WARNING, "DefragmentationFailed", message)

    async def _recover_space(
        self, raw: dict[str, Any], cluster: EtcdCluster, recorded: MaintenanceStatus, step: plan.Step,
        views: list[plan.MemberView], tls: EtcdTLS | None,
    ) -> None:  # fmt: skip
        """Compact, or disarm, or close the record of a NOSPACE recovery (the defragmentations
        between are ordinary ones, counted in the record)."""
        url = next((m.url for m in views if m.healthy), views[0].url if views else "")
        now = rfc3339(self.clock.now())
        match step:
            case plan.Compact(revision=revision):
                try:
                    async with EtcdClient(url, tls, timeout=DEFRAGMENT_TIMEOUT) as client:
                        await client.compact(revision, physical=True)
                except Compacted:
                    pass  # compacted already (by etcd's auto-compaction, or a pass that stopped)
                recorded.no_space = NoSpaceRecovery(started_at=now, compacted_revision=revision)
                recorded.message = f"NOSPACE: compacted the history to revision {revision}"
                await self._write(raw, recorded)
                await self.manager.events.record(
                    raw, WARNING, "NoSpaceRecovering",
                    f"etcd's NOSPACE alarm is raised: compacted to revision {revision}; "
                    "defragmenting each member, then disarming",
                )  # fmt: skip
            case plan.Disarm():
                async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
                    for alarm in await client.alarm_list():
                        if alarm.alarm == "NOSPACE":
                            await client.alarm_disarm(alarm.member_id, alarm.alarm)
                done = recorded.no_space or NoSpaceRecovery(started_at=now)
                message = (
                    f"NOSPACE alarm disarmed after compacting to revision {done.compacted_revision} and "
                    f"defragmenting {', '.join(done.defragmented) or 'no member'}: writes are accepted again"
                )
                # What is left now is live data: if it fills the quota, so will the next writes.
                shortage = space_shortage(cluster, max((m.db_size_in_use for m in views), default=0))
                recorded.no_space, recorded.message = None, f"{message}; {shortage}" if shortage else message
                await self._write(raw, recorded)
                await self.manager.events.record(raw, NORMAL, "SpaceRecovered", message)
                if shortage:
                    await self.manager.events.record(raw, WARNING, "VolumeTooSmall", shortage)
            case plan.FinishSpace():
                recorded.no_space, recorded.message = None, "the NOSPACE alarm is no longer raised"
                await self._write(raw, recorded)
                await self.manager.events.record(raw, NORMAL, "SpaceRecovered", recorded.message)

    # ---- record ------------------------------------------------------------------------

    async def _note(
        self, raw: dict[str, Any], recorded: MaintenanceStatus, message: str, warning: bool = False
    ) -> None:
        """Say what we wait for, writing only when it changed (a pass that changes nothing writes nothing)."""
        if recorded.message == message:
            return
        recorded.message = message
        await self._write(raw, recorded)
        if warning:
            await self.manager.events.record(raw, WARNING, "MaintenanceInvalid", message)

    async def _write(self, raw: dict[str, Any], recorded: MaintenanceStatus) -> None:
        """Replace status.maintenance alone: the EtcdCluster controller owns the rest.

        The status as read, with this field replaced (a finished inProgress is cleared),
        guarded by the resourceVersion: on a conflict (the EtcdCluster controller wrote
        meanwhile) the object is read again and the write retried, so a concurrent write of
        the other fields neither conflicts with nor is undone by this one.
        """
        current = raw
        for attempt in range(WRITE_ATTEMPTS):
            status = {**(current.get("status") or {})}
            status["maintenance"] = recorded.model_dump(by_alias=True, exclude_none=True)
            # replace_status stamps observedGeneration from the object's generation; what the
            # EtcdCluster controller observed stays as it recorded it (the API server ignores a
            # generation sent in a status write).
            observed = {
                **current,
                "metadata": {**current["metadata"], "generation": status.get("observedGeneration")},
            }
            try:
                updated = await self.api.replace_status(ETCDCLUSTERS, observed, status)
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
            raw["metadata"] = updated["metadata"]
            raw["status"] = updated.get("status") or {}
            return


def _space_record(recorded: MaintenanceStatus) -> plan.SpaceRecovery | None:
    done = recorded.no_space
    return plan.SpaceRecovery(done.compacted_revision, tuple(done.defragmented)) if done else None


def _no_space_reported(cluster: dict[str, Any]) -> bool:
    """The EtcdCluster controller saw etcd's NOSPACE alarm (its SpaceAvailable condition)."""
    conditions = (cluster.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "SpaceAvailable" and c.get("status") == "False" for c in conditions)


def register(manager: Manager, deps: Deps) -> None:
    reconciler = MaintenanceReconciler(manager, deps)
    # A pass may wait out one defragmentation: the runner's per-pass timeout must not cut it short.
    timeout = DEFRAGMENT_TIMEOUT + 60.0
    manager.add_controller(
        Controller("etcdmaintenance", ETCDCLUSTERS, reconciler.reconcile, workers=2, timeout=timeout)
    )
