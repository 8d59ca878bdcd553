"""The backup planners: an EtcdBackup's one next step and its status, a schedule's step."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kustos.api.backup import BackupSchedule, BackupStorage, EtcdBackupStatus, PVCStorage
from kustos.etcd import backup_planner as p
from kustos.etcd.agent_report import SnapshotResult
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import Wait
from kustos.runtime.times import rfc3339

NOW = datetime(2026, 11, 26, 7, 0, tzinfo=UTC)
STORAGE = BackupStorage(pvc=PVCStorage())
SOURCE = p.Source(("main-1", "http://main-1:2379"), STORAGE)
RESULT = SnapshotResult("pvc://main-backups/x.db", "main-1", 42, 1000, "ab" * 32, "t0", "t1", 1.5, ["old.db"])


def observed(agent: p.Agent | None = None, source: p.Source = SOURCE, **status: Any) -> p.Observed:
    return p.Observed(EtcdBackupStatus(**status), 1, NOW, agent, source)


def condition(s: EtcdBackupStatus) -> tuple[str, str]:
    (c,) = [c for c in s.conditions if c.type == "Succeeded"]
    return c.status, c.reason


def test_a_new_backup_starts_its_first_attempt_from_the_source() -> None:
    o = observed()
    step = p.plan(o)
    assert step == p.Start(1, ("main-1", "http://main-1:2379"), STORAGE)
    s = p.status(o, step, NOW, None)
    assert (s.phase, s.attempts, s.member, s.start_time) == ("Running", 1, "main-1", rfc3339(NOW))
    assert [n.reason for n in p.notes(o, step, s)] == ["BackupStarted"]
    assert p.requeue_after(o, step) == p.WATCH_AGENT


def test_without_a_source_it_waits_and_says_why_once() -> None:
    o = observed(source=p.Source(problem="EtcdCluster main not found"))
    step = p.plan(o)
    assert step == p.Pending("EtcdCluster main not found")
    s = p.status(o, step, NOW, None)
    assert s.phase == "Pending" and condition(s) == ("False", "Waiting")
    assert [n.reason for n in p.notes(o, step, s)] == ["BackupWaiting"]
    again = replace(o, previous=s)
    assert p.status(again, p.plan(again), NOW, None) == s  # nothing new: no write
    assert p.notes(again, p.plan(again), s) == []


def test_a_succeeded_agent_is_recorded_with_its_result() -> None:
    o = observed(p.Agent("Succeeded", result=RESULT), phase="Running", attempts=1)
    step = p.plan(o)
    assert step == p.Succeed(RESULT)
    s = p.status(o, step, NOW, None)
    assert (s.phase, s.revision, s.location, s.duration) == ("Succeeded", 42, RESULT.location, "1.50s")
    assert "retention removed old.db" in (s.message or "")
    assert condition(s) == ("True", "Succeeded")


def test_a_failed_attempt_is_retried_after_its_delay_then_a_new_one_starts() -> None:
    o = observed(p.Agent("Failed", failure="EtcdError: refused"), phase="Running", attempts=2)
    step = p.plan(o)
    assert step == p.Fail("EtcdError: refused")
    s = p.status(o, step, NOW, None)
    assert s.next_attempt_time == rfc3339(NOW + timedelta(seconds=20)) and s.phase == "Running"
    assert condition(s) == ("False", "Retrying") and "EtcdError: refused" in (s.message or "")
    waiting = replace(o, previous=s, agent=p.Agent("Failed"))
    step = p.plan(waiting)
    assert isinstance(step, Wait) and step.seconds == 20
    due = replace(waiting, now=NOW + timedelta(seconds=21))
    assert p.plan(due) == p.Start(3, SOURCE.member, STORAGE)  # type: ignore[arg-type]


def test_it_gives_up_after_the_last_attempt() -> None:
    o = observed(p.Agent(None), phase="Running", attempts=p.MAX_ATTEMPTS)
    s = p.status(o, p.plan(o), NOW, None)
    assert s.phase == "Failed" and "disappeared" in (s.message or "")
    assert condition(s) == ("False", "Failed")
    assert [n.reason for n in p.notes(o, p.plan(o), s)] == ["BackupFailed"]


def test_an_agent_that_reported_nothing_fails_once_not_every_pass() -> None:
    o = observed(p.Agent("Succeeded"), phase="Running", attempts=1)
    s = p.status(o, p.plan(o), NOW, None)
    assert "without reporting a result" in (s.message or "")
    assert isinstance(p.plan(replace(o, previous=s)), Wait)  # waits for the retry, no second failure


def test_a_stuck_agent_is_said_not_failed() -> None:
    stuck = ("ImagePullBackOff", "backup agent pod x cannot pull its image")
    o = observed(p.Agent("Pending", stuck=stuck), phase="Running", attempts=1)
    step = p.plan(o)
    s = p.status(o, step, NOW, None)
    assert s.phase == "Running" and s.message == stuck[1] and condition(s) == ("False", "ImagePullBackOff")
    assert [n.reason for n in p.notes(o, step, s)] == ["ImagePullBackOff"]


def test_a_start_that_fails_records_why_and_counts_no_attempt() -> None:
    o = observed()
    s = p.status(o, p.plan(o), NOW, ReconcileError("pods is forbidden", "Forbidden"))
    assert s.attempts == 0 and s.message == "attempt 1 could not start: pods is forbidden"
    assert condition(s) == ("False", "Forbidden")


def scheduled(name: str, created: datetime, phase: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": rfc3339(created)}, "status": {"phase": phase}}


def test_a_schedule_takes_a_backup_when_due_and_only_once_formed() -> None:
    hourly = BackupSchedule(interval="1h", keep=2)
    o = p.ScheduleObserved(hourly, (), NOW - timedelta(minutes=30), True, NOW)
    step = p.plan_schedule(o)
    assert isinstance(step, Wait) and step.seconds == 1800
    due = replace(o, now=NOW + timedelta(minutes=31))
    assert p.plan_schedule(due) == p.TakeBackup(due.now)
    assert p.schedule_requeue_after(due, p.TakeBackup(due.now)) == 3600
    unformed = p.plan_schedule(replace(due, formed=False))
    assert isinstance(unformed, Wait) and "not formed" in unformed.reason


def test_a_schedule_prunes_before_it_takes_the_next() -> None:
    hourly = BackupSchedule(interval="1h", keep=1)
    backups = tuple(scheduled(f"b{i}", NOW - timedelta(hours=3 - i), "Succeeded") for i in range(3))
    step = p.plan_schedule(p.ScheduleObserved(hourly, backups, NOW - timedelta(days=1), True, NOW))
    assert isinstance(step, p.Prune) and [b["metadata"]["name"] for b in step.expired] == ["b0", "b1"]
    kept = p.ScheduleObserved(hourly, backups[2:], NOW - timedelta(days=1), True, NOW)
    assert p.plan_schedule(kept) == p.TakeBackup(NOW)  # the newest is an hour old


def test_a_schedule_that_never_fires_is_said_naming_the_field_and_waits_for_the_spec() -> None:
    # Admitted while the webhook was down: no crash, no hot retry, no backup.
    never = BackupSchedule.model_construct(interval=None, schedule="0 0 30 2 *", keep=5, storage=None)
    o = p.ScheduleObserved(never, (), NOW - timedelta(days=1), True, NOW)
    step = p.plan_schedule(o)
    assert isinstance(step, p.InvalidSchedule) and step.message.startswith("spec.backup.schedule: ")
    assert p.schedule_requeue_after(o, step) is None
