"""Defragmentation of EtcdCluster members: observe every member's database, plan, defragment one.

A controller of its own beside the EtcdCluster controller: it reads the cluster's
status (phase, members, client URLs) that controller writes, asks each member for its
status and health, and defragments at most one member per pass (``maintenance.plan``).
It writes only ``status.maintenance``, with merge patches of that subtree, so it never
overwrites what the EtcdCluster controller records. Before a defragmentation starts,
``status.maintenance.inProgress`` says so: an operator that stops in the middle leaves a
record that the next one finishes, and no second member is touched meanwhile.

Members of a TLS cluster are asked with the operator's client certificate, the one the
EtcdCluster controller keeps (``certs.operator_certificates``); this controller only reads it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.etcd import DefragmentationRecord, EtcdCluster, MaintenanceStatus
from kustos.etcd import maintenance as plan
from kustos.etcd.certs import operator_certificates
from kustos.etcd.client import EtcdClient, EtcdError, EtcdTLS, Status
from kustos.etcd.controller import ETCDCLUSTERS
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller, Result
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.manager import Manager
from kustos.runtime.times import parse_duration, rfc3339

log = logging.getLogger(__name__)

STATUS_TIMEOUT = 3.0
DEFRAGMENT_TIMEOUT = 600.0  # a large database takes a while; the member is blocked meanwhile
WAIT = 5.0  # a cluster that is not settled is looked at again this soon
AFTER_STEP = 1.0
NO_CLIENT_CERTIFICATE = "waiting for the operator's client certificate"


def _now() -> datetime:
    return datetime.now(UTC)


async def member_view(name: str, url: str, tls: EtcdTLS | None = None) -> plan.MemberView:
    """Status and health of one member; anything that does not answer in time is unhealthy."""
    try:
        async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
            status: Status = await client.status()
            healthy = not status.errors and await client.health(serializable=True)
    except (EtcdError, OSError, TimeoutError):
        return plan.MemberView(name, url, healthy=False)
    return plan.MemberView(
        name, url, healthy=healthy, learner=status.is_learner, leader=status.is_leader,
        db_size=status.db_size, db_size_in_use=status.db_size_in_use,
    )  # fmt: skip


class MaintenanceReconciler:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.api = manager.api
        self.clusters = manager.informer(ETCDCLUSTERS)
        self.certs = operator_certificates(manager)

    async def reconcile(self, key: str) -> Result | None:
        cached = self.clusters.get(key)
        if cached is None or cached["metadata"].get("deletionTimestamp"):
            return None
        try:
            cluster = EtcdCluster.model_validate(cached)
        except ValidationError:
            return None  # the EtcdCluster controller reports an invalid spec
        settings = plan.settings(cluster.spec.maintenance)
        recorded = (cluster.status.maintenance if cluster.status else None) or MaintenanceStatus()
        if not settings.enabled and recorded.in_progress is None:
            return None
        interval = parse_duration(settings.check_interval).total_seconds() or 1.0
        now = _now()
        try:
            window_open, next_tick = plan.in_window(settings.schedule, parse_duration(settings.window), now)
        except ValueError as err:
            await self._note(
                cached, recorded, f"spec.maintenance.defragmentation.schedule: {err}", warning=True
            )
            return None  # a spec change wakes us
        if recorded.in_progress is None:
            # Cheap gates first: no etcd calls and no writes while nothing could start anyway.
            if not window_open and next_tick is not None:
                return Result(requeue_after=max(1.0, (next_tick - now).total_seconds()))
            if (cluster.status.phase if cluster.status else None) != "Running":
                return Result(requeue_after=WAIT)  # its status changes wake us too
        # Read it afresh: the cache may not hold our own last write to status.maintenance yet.
        raw = await self.api.get(ETCDCLUSTERS, cached["metadata"]["namespace"], cached["metadata"]["name"])
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
        views = await asyncio.gather(*(member_view(m.name, m.client_url, tls) for m in members))
        observed = plan.Observed(
            phase=status.phase if status else None, size=cluster.spec.size, members=tuple(views),
            threshold=settings.threshold, min_db_size=plan.parse_quantity(settings.min_db_size),
            enabled=settings.enabled, window_open=window_open,
            in_progress=recorded.in_progress.member if recorded.in_progress else None,
        )  # fmt: skip
        step = plan.plan(observed)
        if isinstance(step, plan.Defragment):
            await self._defragment(raw, recorded, step, tls)
            return Result(requeue_after=AFTER_STEP)
        if isinstance(step, plan.FinishRecord):
            await self._finish_interrupted(raw, recorded, step.member)
            return Result(requeue_after=AFTER_STEP)
        if plan.wanting(observed) or (recorded.message or "").startswith(NO_CLIENT_CERTIFICATE):
            # Only then is a reason worth a status write: most clusters need nothing, most of the time.
            await self._note(raw, recorded, step.reason)
        if isinstance(step, plan.Wait):
            return Result(requeue_after=min(WAIT, interval))
        return Result(requeue_after=interval)

    # ---- act ---------------------------------------------------------------------------

    async def _defragment(
        self, raw: dict[str, Any], recorded: MaintenanceStatus, step: plan.Defragment, tls: EtcdTLS | None
    ) -> None:
        member = step.member
        record = DefragmentationRecord(
            member=member.name,
            started_at=rfc3339(_now()),
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
        after = await member_view(member.name, member.url, tls)
        for _ in range(5):  # the member may take a moment to answer after a long defragmentation
            if after.db_size:
                break
            await asyncio.sleep(0.5)
            after = await member_view(member.name, member.url, tls)
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
        record.completed_at = rfc3339(_now())
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
        recorded.defragmentations = [d for d in recorded.defragmentations if d.member != record.member]
        recorded.defragmentations.append(record)
        recorded.message = message
        await self._write(raw, recorded)
        if error is None:
            await self.manager.events.record(raw, NORMAL, "Defragmented", message)
        else:
            await self.manager.events.record(raw, WARNING, "DefragmentationFailed", message)

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
        """A merge patch of status.maintenance alone: the EtcdCluster controller owns the rest.

        Nulls included, so that a finished inProgress is cleared; no resourceVersion, so a
        concurrent write of the other fields neither conflicts with nor is undone by this one.
        """
        meta = raw["metadata"]
        patch = {"status": {"maintenance": recorded.model_dump(by_alias=True)}}
        try:
            await self.api.patch(ETCDCLUSTERS, meta["namespace"], meta["name"], patch, subresource="status")
        except ApiStatusError as err:
            if not err.not_found:
                raise


def register(manager: Manager) -> None:
    reconciler = MaintenanceReconciler(manager)
    manager.add_controller(Controller("etcdmaintenance", ETCDCLUSTERS, reconciler.reconcile, workers=2))
