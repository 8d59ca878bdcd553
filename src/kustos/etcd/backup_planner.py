"""The backup planners (pure): an EtcdBackup's next step and status, and a schedule's.

An EtcdBackup's status is its whole state machine: attempts, when the next may start,
the result. Each attempt's agent pod is named after its number, so what the pod did
(running, stuck, succeeded with a result line, failed) and what the status recorded
decide the one next step, whoever ran the last pass. A schedule keeps nothing of its
own: the scheduled EtcdBackups (their creation times and phases) are its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kustos.api.backup import BackupSchedule, BackupStorage, EtcdBackupStatus
from kustos.api.common import Condition
from kustos.api.etcd import EtcdCluster
from kustos.etcd.agent_report import SnapshotResult
from kustos.runtime import objects
from kustos.runtime.conditions import note_failure, set_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import WARNING, Note, Wait
from kustos.runtime.times import cron_ticks, parse_duration, parse_rfc3339, rfc3339

Obj = dict[str, Any]

MAX_ATTEMPTS = 5
WAIT_FOR_CLUSTER = 10.0  # no cluster, or none to stream from: look again this soon
WATCH_AGENT = 5.0  # a running agent: its pod's changes wake us, and this in case none comes
SUCCEEDED = "Succeeded"  # the one condition an EtcdBackup has (True once stored)


def retry_delay(attempts: int) -> timedelta:
    """After the n-th failed attempt: 10 s, 20 s, 40 s ... at most 5 minutes."""
    return timedelta(seconds=min(10 * 2 ** max(0, attempts - 1), 300))


# ---- an EtcdBackup -----------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """The current attempt's agent pod, as observed."""

    phase: str | None
    """The pod's phase; None: the pod is gone."""
    stuck: tuple[str, str] | None = None
    """(reason, message) of a pod that cannot start or run (an image, a volume)."""
    result: SnapshotResult | None = None
    """The result line of a pod that succeeded (None: it said none)."""
    failure: str | None = None
    """Why a failed pod failed, from its log."""


@dataclass(frozen=True)
class Source:
    """Where the next attempt streams from and stores to (None: why it cannot start)."""

    member: tuple[str, str] | None = None
    """(name, client URL) of the member."""
    storage: BackupStorage | None = None
    cluster: EtcdCluster | None = None
    """The cluster as read: the agent pod is placed and configured like its members."""
    problem: str | None = None


@dataclass(frozen=True)
class Observed:
    previous: EtcdBackupStatus
    generation: int | None
    now: datetime
    agent: Agent | None
    """None before the first attempt."""
    source: Source


@dataclass(frozen=True)
class Watch:
    """The agent runs (or cannot start yet: said, not failed, as an image or node may come)."""

    stuck: tuple[str, str] | None = None


@dataclass(frozen=True)
class Succeed:
    result: SnapshotResult


@dataclass(frozen=True)
class Fail:
    """The attempt failed: retried later, or given up after MAX_ATTEMPTS."""

    why: str


@dataclass(frozen=True)
class Pending:
    message: str


@dataclass(frozen=True)
class Start:
    attempt: int
    member: tuple[str, str]
    storage: BackupStorage


BackupStep = Watch | Succeed | Fail | Pending | Start | Wait


def plan(o: Observed) -> BackupStep:
    """The one next step of a backup not yet Succeeded or Failed."""
    agent, previous = o.agent, o.previous
    if agent is not None:
        if agent.phase == "Succeeded" and agent.result is not None:
            return Succeed(agent.result)
        if agent.phase is not None and agent.phase not in ("Succeeded", "Failed"):
            return Watch(agent.stuck)
        if previous.next_attempt_time is None:
            if agent.phase is None:
                return Fail("the agent pod disappeared")
            if agent.phase == "Succeeded":
                return Fail("the agent exited without reporting a result")
            return Fail(agent.failure or "the agent failed without a message")
        wait = ((parse_rfc3339(previous.next_attempt_time) or o.now) - o.now).total_seconds()
        if wait > 0:
            return Wait(f"attempt {previous.attempts + 1} starts at {previous.next_attempt_time}", wait)
    source = o.source
    if source.member is None or source.storage is None:
        return Pending(source.problem or "no member to stream from")
    return Start(previous.attempts + 1, source.member, source.storage)


def status(o: Observed, step: BackupStep, now: datetime, failure: ReconcileError | None) -> EtcdBackupStatus:
    """The whole status after ``step`` (or after its failure: the attempt did not start)."""
    s = o.previous.model_copy(deep=True)
    if failure is not None:
        s.message = f"attempt {s.attempts + 1} could not start: {failure.message}"
        s.conditions = _conditions(note_failure(_raw(s), failure, now, o.generation, SUCCEEDED, False))
        return s
    match step:
        case Watch(stuck=(reason, message)) if s.message != message:
            s.message = message
            return _succeeded(s, o, False, reason, now)
        case Succeed(result=r):
            s.phase, s.location, s.member, s.revision = "Succeeded", r.location, r.member, r.revision
            s.size, s.sha256, s.completion_time = r.size, r.sha256, r.completion_time
            s.start_time = s.start_time or r.start_time
            s.duration = f"{r.duration_seconds:.2f}s"
            s.message = f"{r.size} bytes at revision {r.revision} in {r.location}"
            if r.pruned:
                s.message += f"; retention removed {', '.join(r.pruned)}"
            return _succeeded(s, o, True, SUCCEEDED, now)
        case Fail(why=why):
            message = f"attempt {s.attempts} failed: {why}"
            if s.attempts >= MAX_ATTEMPTS:
                s.phase, s.message = "Failed", f"{message}; giving up after {s.attempts} attempts"
                return _succeeded(s, o, False, "Failed", now)
            delay = retry_delay(s.attempts)
            s.next_attempt_time = rfc3339(now + delay)
            s.message = f"{message}; retrying in {delay.total_seconds():.0f}s"
            return _succeeded(s, o, False, "Retrying", now)
        case Pending(message=message):
            s.phase, s.message = s.phase or "Pending", message
            return _succeeded(s, o, False, "Waiting", now)  # said where tools look, not only in Events
        case Start(attempt=attempt, member=(member, _), storage=storage):
            s.phase, s.attempts, s.next_attempt_time = "Running", attempt, None
            s.start_time = s.start_time or rfc3339(now)
            s.member, s.storage = member, storage
            s.message = f"attempt {attempt}: streaming a snapshot from {member}"
    return s


def notes(o: Observed, step: BackupStep, after: EtcdBackupStatus) -> list[Note]:
    """The Events a step says once (none when it changed nothing)."""
    message = after.message or ""
    if message == (o.previous.message or "") and after.phase == o.previous.phase:
        return []
    match step:
        case Watch(stuck=(reason, _)):
            return [Note(reason, message, WARNING)]
        case Succeed():
            return [Note("BackupSucceeded", message)]
        case Fail():
            reason = "BackupFailed" if after.phase == "Failed" else "BackupAttemptFailed"
            return [Note(reason, message, WARNING)]
        case Pending():
            return [Note("BackupWaiting", message, WARNING)]
        case Start():
            return [Note("BackupStarted", message)]
    return []


def requeue_after(o: Observed, step: BackupStep) -> float | None:
    match step:
        case Watch() | Start():
            return WATCH_AGENT
        case Pending():
            return WAIT_FOR_CLUSTER
        case Wait(seconds=seconds):
            return seconds
        case Fail() if o.previous.attempts < MAX_ATTEMPTS:
            return retry_delay(o.previous.attempts).total_seconds()
    return None


def _succeeded(s: EtcdBackupStatus, o: Observed, ok: bool, reason: str, now: datetime) -> EtcdBackupStatus:
    """``s`` with the Succeeded condition saying its message."""
    s.conditions = _conditions(
        set_condition(_raw(s), SUCCEEDED, ok, reason, s.message or "", o.generation, now)
    )
    return s


def _raw(s: EtcdBackupStatus) -> list[Obj]:
    return [c.model_dump(by_alias=True, exclude_none=True) for c in s.conditions]


def _conditions(raw: list[Obj]) -> list[Condition]:
    return [Condition.model_validate(c) for c in raw]


# ---- a schedule --------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleObserved:
    schedule: BackupSchedule
    scheduled: tuple[Obj, ...]
    """This cluster's scheduled EtcdBackups."""
    created: datetime
    """When the cluster was created (the schedule counts from it before the first backup)."""
    formed: bool
    """The cluster has formed (a cluster ID): nothing to back up before."""
    now: datetime


@dataclass(frozen=True)
class Prune:
    """Delete scheduled backups beyond what the schedule keeps."""

    expired: tuple[Obj, ...]


@dataclass(frozen=True)
class TakeBackup:
    """Create the scheduled EtcdBackup that is due."""

    due: datetime


@dataclass(frozen=True)
class InvalidSchedule:
    """spec.backup.schedule never fires (admitted while the webhook was down): said as a
    Warning Event naming the field; nothing is taken until the spec changes."""

    message: str


ScheduleStep = Prune | TakeBackup | InvalidSchedule | Wait


def plan_schedule(o: ScheduleObserved) -> ScheduleStep:
    old = expired(list(o.scheduled), o.schedule.keep)
    if old:
        return Prune(tuple(old))
    created = [parse_rfc3339(b["metadata"].get("creationTimestamp")) for b in o.scheduled]
    last = max([c for c in created if c is not None], default=None) or o.created
    try:
        due = next_scheduled(o.schedule, last)
    except ValueError as err:
        return InvalidSchedule(f"spec.backup.schedule: {err}")
    if due > o.now:
        return Wait(f"the next backup is due at {rfc3339(due)}", (due - o.now).total_seconds())
    if not o.formed:
        return Wait("the cluster has not formed yet", WAIT_FOR_CLUSTER)
    return TakeBackup(o.now)


def schedule_requeue_after(o: ScheduleObserved, step: ScheduleStep) -> float | None:
    match step:
        case Wait(seconds=seconds):
            return seconds
        case InvalidSchedule():
            return None  # the spec's change wakes the controller
        case TakeBackup():
            return (next_scheduled(o.schedule, o.now) - o.now).total_seconds()
    return 1.0  # pruned: look again at once for what is due


def next_scheduled(schedule: BackupSchedule, last: datetime) -> datetime:
    """When the next scheduled backup is due, after one taken (or the cluster created) at ``last``."""
    if schedule.interval:
        return last + parse_duration(schedule.interval)
    assert schedule.schedule is not None
    return next(cron_ticks(schedule.schedule, last))


def expired(backups: list[Obj], keep: int) -> list[Obj]:
    """Scheduled backups beyond the newest ``keep`` successes, and beyond the newest ``keep``
    failures: failures never push a good backup out, and a running one is never deleted."""
    old: list[Obj] = []
    for phase in (SUCCEEDED, "Failed"):
        done = [b for b in backups if (b.get("status") or {}).get("phase") == phase]
        done.sort(key=lambda b: (b["metadata"].get("creationTimestamp", ""), objects.name(b)))
        old += done[: max(0, len(done) - keep)]
    return old
