"""Compaction flags and the defragmentation planner (pure: no I/O, time is an input).

Defragmenting a member rewrites its whole database file and blocks its reads and
writes while it runs, so the plan takes at most one member at a time, only when the
cluster is settled and every member healthy, followers before the leader: the leader
goes last, and only once no follower needs it any more.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kustos.api.etcd import (
    AutoCompactionSpec,
    DefragmentationRecord,
    DefragmentationSpec,
    MaintenanceSpec,
    MaintenanceStatus,
    NoSpaceRecovery,
)
from kustos.runtime import quantity
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import WARNING, Note
from kustos.runtime.steps import Wait as Wait  # the shared step, in this planner's Step union
from kustos.runtime.times import cron_ticks


def parse_quantity(text: str) -> int:
    """A storage size as Kubernetes writes it (64Mi, 1G, 1000) in bytes."""
    try:
        return int(quantity.parse_quantity(text))
    except ValueError:
        raise ValueError(f"not a size: {text!r} (like 64Mi or 1Gi)") from None


def compaction_args(spec: MaintenanceSpec | None) -> list[str]:
    """etcd flags for automatic compaction; none (etcd's defaults) when it is not configured."""
    compaction: AutoCompactionSpec | None = spec.auto_compaction if spec else None
    if compaction is None:
        return []
    return [
        f"--auto-compaction-mode={compaction.mode}",
        f"--auto-compaction-retention={compaction.retention}",
    ]


def free_fraction(db_size: int, db_size_in_use: int) -> float:
    """The fraction of the database file that is free pages: what a defragmentation gives back."""
    if db_size <= 0:
        return 0.0
    return max(0, db_size - db_size_in_use) / db_size


def needs_defragmentation(db_size: int, db_size_in_use: int, threshold: float, min_db_size: int) -> bool:
    return db_size >= min_db_size and db_size > 0 and free_fraction(db_size, db_size_in_use) > threshold


def in_window(schedule: str | None, window: timedelta, now: datetime) -> tuple[bool, datetime | None]:
    """Whether ``now`` is within ``window`` after a tick of the cron ``schedule``, and if not,
    when the next tick is. No schedule: always. An invalid schedule raises ValueError."""
    if schedule is None:
        return True, None
    tick = next(cron_ticks(schedule, now - window))
    if tick <= now:
        return True, None
    return False, tick


# ---- the planner -------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberView:
    """One member as observed for maintenance."""

    name: str
    url: str
    healthy: bool
    """Answered its status without errors and passed etcd's /health."""
    learner: bool = False
    leader: bool = False
    db_size: int = 0
    db_size_in_use: int = 0
    no_space: bool = False
    """It reports etcd's NOSPACE alarm."""
    member_id: int = 0
    revision: int = 0


@dataclass(frozen=True)
class Observed:
    phase: str | None
    """The EtcdCluster's phase, as its own controller last wrote it."""
    size: int
    """spec.size: a cluster that has fewer or more members is not settled."""
    members: tuple[MemberView, ...]
    threshold: float
    min_db_size: int
    enabled: bool = True
    window_open: bool = True
    in_progress: str | None = None
    """The member a recorded, unfinished defragmentation was started on."""
    space: SpaceRecovery | None = None
    """The NOSPACE recovery under way, as recorded."""


@dataclass(frozen=True)
class SpaceRecovery:
    compacted_revision: int = 0
    defragmented: tuple[str, ...] = ()


@dataclass(frozen=True)
class Defragment:
    member: MemberView
    reason: str


@dataclass(frozen=True)
class FinishRecord:
    """A defragmentation was started (by an operator that then stopped) and its member is
    healthy again: record how it ended."""

    member: MemberView


@dataclass(frozen=True)
class Idle:
    """Nothing to do until the next check."""

    reason: str


@dataclass(frozen=True)
class Compact:
    """Drop the history before ``revision``: the first step out of NOSPACE (what a
    defragmentation can then give back)."""

    revision: int


@dataclass(frozen=True)
class Disarm:
    """Every member defragmented: clear the NOSPACE alarm so that etcd takes writes again."""


@dataclass(frozen=True)
class FinishSpace:
    """The alarm is gone (disarmed here or by someone else): close the record."""


Step = Defragment | FinishRecord | Compact | Disarm | FinishSpace | Wait | Idle


def alarmed(o: Observed) -> bool:
    return any(m.no_space for m in o.members)


def plan_space(o: Observed) -> Step | None:
    """Out of etcd's NOSPACE alarm (writes refused) without a human, as etcd's own runbook
    says: compact, defragment every member (one at a time, followers first, the leader
    last), disarm. None: no alarm and nothing recorded."""
    if not alarmed(o):
        return FinishSpace() if o.space is not None else None
    unhealthy = sorted(m.name for m in o.members if not m.healthy)
    if unhealthy:
        return Wait(f"NOSPACE: members not healthy: {', '.join(unhealthy)}")
    if o.space is None or not o.space.compacted_revision:
        return Compact(max(m.revision for m in o.members))
    done = set(o.space.defragmented)
    todo = sorted((m for m in o.members if m.name not in done), key=lambda m: (m.leader, m.name))
    if todo:
        member = todo[0]
        free = member.db_size - member.db_size_in_use
        role = "leader" if member.leader else "follower"
        return Defragment(member, f"{role} {member.name} (NOSPACE: {free} of {member.db_size} bytes free)")
    return Disarm()


def wanting(o: Observed) -> list[MemberView]:
    """Members whose database is fragmented enough, followers first (most to gain first), leader last."""
    needy = [
        m for m in o.members if needs_defragmentation(m.db_size, m.db_size_in_use, o.threshold, o.min_db_size)
    ]
    return sorted(needy, key=lambda m: (m.leader, -(m.db_size - m.db_size_in_use), m.name))


def plan(o: Observed) -> Step:
    """The one next maintenance step for a cluster."""
    if o.in_progress is not None:
        member = next((m for m in o.members if m.name == o.in_progress), None)
        if member is None:
            return FinishRecord(MemberView(o.in_progress, "", healthy=False))  # it is gone
        if not member.healthy:
            return Wait(f"{o.in_progress} is still being defragmented or has not recovered")
        return FinishRecord(member)
    space = plan_space(o)
    if space is not None:
        return space
    if not o.enabled:
        return Idle("defragmentation is disabled")
    if o.phase != "Running":
        return Wait(f"the cluster is {o.phase or 'not yet formed'}, not Running")
    if len(o.members) != o.size:
        return Wait(f"{len(o.members)} members, not {o.size}")
    unhealthy = sorted(m.name for m in o.members if not m.healthy)
    if unhealthy:
        return Wait(f"members not healthy: {', '.join(unhealthy)}")
    learners = sorted(m.name for m in o.members if m.learner)
    if learners:
        return Wait(f"learners still catching up: {', '.join(learners)}")
    leaders = [m for m in o.members if m.leader]
    if len(leaders) != 1:
        return Wait(f"{len(leaders)} members claim to lead, not one")
    candidates = wanting(o)
    if not candidates:
        return Idle("no member's database is fragmented beyond the threshold")
    if not o.window_open:
        return Idle(f"{len(candidates)} members to defragment, outside the schedule's window")
    chosen = candidates[0]
    free = chosen.db_size - chosen.db_size_in_use
    role = "leader" if chosen.leader else "follower"
    return Defragment(
        chosen,
        f"{role} {chosen.name}: {free} of {chosen.db_size} bytes free "
        f"({free_fraction(chosen.db_size, chosen.db_size_in_use):.0%} > {o.threshold:.0%})",
    )


def settings(spec: MaintenanceSpec | None) -> DefragmentationSpec:
    return spec.defragmentation if spec is not None else DefragmentationSpec()


# ---- what a step did, and the record of it ------------------------------------------------
#
# The controller acts on a step and returns what it did (an outcome below); ``record`` turns
# the recorded ``status.maintenance`` and that outcome into the next one, and ``notes`` into
# the Events said once.


@dataclass(frozen=True)
class Started:
    """The intent, recorded before a defragmentation starts: nothing else starts meanwhile,
    and an operator that stops in the middle leaves a record the next one finishes."""

    member: MemberView
    reason: str
    at: str


@dataclass(frozen=True)
class Defragmented:
    """A defragmentation ended (``error``: how it failed; ``seconds`` None: it was started by
    an operator that then stopped, and is finished from the member's answer)."""

    started: DefragmentationRecord
    after: MemberView
    error: str | None
    seconds: float | None
    at: str


@dataclass(frozen=True)
class Compacted:
    revision: int
    at: str


@dataclass(frozen=True)
class Disarmed:
    shortage: str | None
    """What the cluster needs when its live data would fill the quota again (None: it fits)."""


@dataclass(frozen=True)
class Say:
    """Nothing done; ``message`` is worth recording (a wait a user may wonder about, a spec
    error): written only when it changed."""

    message: str
    invalid: bool = False
    seconds: float | None = None


Outcome = Started | Defragmented | Compacted | Disarmed | FinishSpace | Say


def started(recorded: MaintenanceStatus, step: Started) -> MaintenanceStatus:
    s = recorded.model_copy(deep=True)
    member = step.member
    s.in_progress = DefragmentationRecord(
        member=member.name, started_at=step.at, db_size_before=member.db_size, leader=member.leader
    )
    s.message = f"defragmenting {step.reason}"
    return s


def record(
    recorded: MaintenanceStatus, outcome: Outcome | Step, failure: ReconcileError | None
) -> MaintenanceStatus:
    """``status.maintenance`` after ``outcome`` (a step left as planned changes nothing)."""
    s = recorded.model_copy(deep=True)
    if failure is not None:
        s.message = f"{failure.reason}: {failure.message}"
        return s
    match outcome:
        case Started():
            return started(recorded, outcome)
        case Defragmented(started=start, after=after, error=error, at=at):
            done = start.model_copy(update={"completed_at": at, "error": error})
            if after.db_size:
                done.db_size_after = after.db_size
                done.reclaimed = max(0, done.db_size_before - after.db_size)
            s.in_progress = None
            if error is None and s.no_space is not None and done.member not in s.no_space.defragmented:
                s.no_space.defragmented.append(done.member)
            s.defragmentations = [*(d for d in s.defragmentations if d.member != done.member), done]
            s.message = defragmented_message(outcome, done)
        case Compacted(revision=revision, at=at):
            s.no_space = NoSpaceRecovery(started_at=at, compacted_revision=revision)
            s.message = f"NOSPACE: compacted the history to revision {revision}"
        case Disarmed(shortage=shortage):
            message = disarmed_message(recorded)
            s.no_space, s.message = None, f"{message}; {shortage}" if shortage else message
        case FinishSpace():
            s.no_space, s.message = None, "the NOSPACE alarm is no longer raised"
        case Say(message=message):
            s.message = message
    return s


def notes(recorded: MaintenanceStatus, outcome: Outcome | Step) -> list[Note]:
    """The Events ``outcome`` says once."""
    match outcome:
        case Defragmented(error=None):
            return [Note("Defragmented", record(recorded, outcome, None).message or "")]
        case Defragmented():
            return [Note("DefragmentationFailed", record(recorded, outcome, None).message or "", WARNING)]
        case Compacted(revision=revision):
            message = (
                f"etcd's NOSPACE alarm is raised: compacted to revision {revision}; "
                "defragmenting each member, then disarming"
            )
            return [Note("NoSpaceRecovering", message, WARNING)]
        case Disarmed(shortage=shortage):
            said = [Note("SpaceRecovered", disarmed_message(recorded))]
            return [*said, Note("VolumeTooSmall", shortage, WARNING)] if shortage else said
        case FinishSpace():
            return [Note("SpaceRecovered", "the NOSPACE alarm is no longer raised")]
        case Say(message=message, invalid=True) if message != recorded.message:
            return [Note("MaintenanceInvalid", message, WARNING)]
    return []


def defragmented_message(outcome: Defragmented, done: DefragmentationRecord) -> str:
    if outcome.error is not None:
        return f"defragmenting {done.member} failed: {outcome.error}"
    took = f" in {outcome.seconds:.1f}s" if outcome.seconds is not None else ""
    role = "leader" if done.leader else "follower"
    return (
        f"defragmented {role} {done.member}{took}: "
        f"{done.db_size_before} -> {done.db_size_after} bytes ({done.reclaimed} reclaimed)"
    )


def disarmed_message(recorded: MaintenanceStatus) -> str:
    done = recorded.no_space or NoSpaceRecovery(started_at="")
    return (
        f"NOSPACE alarm disarmed after compacting to revision {done.compacted_revision} and "
        f"defragmenting {', '.join(done.defragmented) or 'no member'}: writes are accepted again"
    )
