"""Maintenance, the pure part: compaction flags, sizes, the schedule window, which member goes next."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kustos.api.etcd import DefragmentationRecord, EtcdCluster, MaintenanceSpec, MaintenanceStatus
from kustos.etcd import defragmentation as m
from kustos.etcd.pods import member_pod
from kustos.runtime.errors import ReconcileError

MiB = 2**20


def cluster(maintenance: dict[str, Any] | None = None) -> EtcdCluster:
    spec: dict[str, Any] = {"size": 3}
    if maintenance is not None:
        spec["maintenance"] = maintenance
    return EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "main", "namespace": "prod", "uid": "c1"}, "spec": spec,
    })  # fmt: skip


def member(name: str, size: int = 100 * MiB, in_use: int = 10 * MiB, **kw: Any) -> m.MemberView:
    return m.MemberView(name, f"http://{name}:2379", healthy=kw.pop("healthy", True),
                        db_size=size, db_size_in_use=in_use, **kw)  # fmt: skip


def observed(*members: m.MemberView, **kw: Any) -> m.Observed:
    defaults: dict[str, Any] = {
        "phase": "Running",
        "size": len(members),
        "threshold": 0.5,
        "min_db_size": 64 * MiB,
    }
    return m.Observed(members=members, **{**defaults, **kw})


# ---- settings -------------------------------------------------------------------------


def test_defaults_defragment_with_etcds_compaction() -> None:
    spec = cluster().spec.maintenance
    assert spec.auto_compaction is None
    assert spec.defragmentation.enabled
    assert spec.defragmentation.threshold == 0.5
    assert m.parse_quantity(spec.defragmentation.min_db_size) == 64 * MiB
    assert m.compaction_args(spec) == []


def test_compaction_flags_reach_the_member_pod() -> None:
    c = cluster({"autoCompaction": {"mode": "revision", "retention": "10000"}})
    args = member_pod(c, 0, "new", [("main-0", "http://x:2380")], "3.6.16")["spec"]["containers"][0]["args"]
    assert "--auto-compaction-mode=revision" in args
    assert "--auto-compaction-retention=10000" in args
    periodic = cluster({"autoCompaction": {"retention": "1h"}})
    assert m.compaction_args(periodic.spec.maintenance) == [
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=1h",
    ]


def test_user_extra_args_come_after_compaction_flags_so_they_win() -> None:
    c = cluster({"autoCompaction": {"retention": "1h"}})
    c.spec.extra_args = ["--auto-compaction-retention=2h"]
    args = member_pod(c, 0, "new", [("main-0", "http://x:2380")], "3.6.16")["spec"]["containers"][0]["args"]
    assert args.index("--auto-compaction-retention=1h") < args.index("--auto-compaction-retention=2h")


@pytest.mark.parametrize(
    "maintenance",
    [
        {"autoCompaction": {"retention": "one hour"}},
        {"autoCompaction": {"mode": "daily", "retention": "1h"}},
        {"defragmentation": {"threshold": 1.5}},
        {"defragmentation": {"threshold": -0.1}},
        {"defragmentation": {"minDbSize": "lots"}},
        {"defragmentation": {"schedule": "every night"}},
        {"defragmentation": {"checkInterval": "5 minutes"}},
    ],
)
def test_bad_settings_are_refused_by_the_model(maintenance: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        MaintenanceSpec.model_validate(maintenance)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("64Mi", 64 * MiB), ("1Gi", 2**30), ("1000", 1000), ("1.5Ki", 1536), ("2M", 2_000_000), ("0", 0)],
)
def test_parse_quantity(text: str, expected: int) -> None:
    assert m.parse_quantity(text) == expected


def test_parse_quantity_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="not a size"):
        m.parse_quantity("64 MB")


def test_window_without_schedule_is_always_open() -> None:
    assert m.in_window(None, timedelta(hours=1), datetime(2026, 1, 1, tzinfo=UTC)) == (True, None)


def test_window_opens_at_each_tick_for_its_length() -> None:
    day = datetime(2026, 1, 1, tzinfo=UTC)
    schedule, window = "0 3 * * *", timedelta(hours=1)
    assert m.in_window(schedule, window, day + timedelta(hours=3)) == (True, None)
    assert m.in_window(schedule, window, day + timedelta(hours=3, minutes=59)) == (True, None)
    assert m.in_window(schedule, window, day + timedelta(hours=4, minutes=1)) == (
        False,
        day + timedelta(days=1, hours=3),
    )
    assert m.in_window(schedule, window, day + timedelta(hours=2)) == (False, day + timedelta(hours=3))


def test_invalid_cron_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="invalid cron schedule"):
        m.in_window("61 * * * *", timedelta(hours=1), datetime(2026, 1, 1, tzinfo=UTC))


# ---- the planner ----------------------------------------------------------------------


def test_fragmentation_is_the_free_fraction() -> None:
    assert m.free_fraction(100, 25) == 0.75
    assert m.free_fraction(0, 0) == 0.0
    assert m.needs_defragmentation(100 * MiB, 40 * MiB, 0.5, 64 * MiB)
    assert not m.needs_defragmentation(100 * MiB, 60 * MiB, 0.5, 64 * MiB)
    assert not m.needs_defragmentation(32 * MiB, 1 * MiB, 0.5, 64 * MiB)  # too small to bother


def test_a_follower_goes_before_the_leader() -> None:
    step = m.plan(
        observed(member("a", leader=True, in_use=1 * MiB), member("b"), member("c", in_use=90 * MiB))
    )
    assert isinstance(step, m.Defragment) and step.member.name == "b"
    assert "follower b" in step.reason


def test_the_follower_with_most_to_gain_goes_first() -> None:
    step = m.plan(
        observed(member("a", leader=True), member("b", in_use=30 * MiB), member("c", in_use=5 * MiB))
    )
    assert isinstance(step, m.Defragment) and step.member.name == "c"


def test_the_leader_goes_once_no_follower_needs_it() -> None:
    step = m.plan(
        observed(member("a", leader=True), member("b", in_use=99 * MiB), member("c", in_use=99 * MiB))
    )
    assert isinstance(step, m.Defragment) and step.member.name == "a" and step.member.leader


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"phase": "Upgrading"}, "Upgrading, not Running"),
        ({"phase": None}, "not yet formed"),
        ({"size": 5}, "3 members, not 5"),
    ],
)
def test_an_unsettled_cluster_waits(change: dict[str, Any], reason: str) -> None:
    step = m.plan(observed(member("a", leader=True), member("b"), member("c"), **change))
    assert isinstance(step, m.Wait) and reason in step.reason


def test_any_unhealthy_member_stops_defragmentation() -> None:
    step = m.plan(observed(member("a", leader=True), member("b"), member("c", healthy=False)))
    assert isinstance(step, m.Wait) and "c" in step.reason


def test_a_learner_stops_defragmentation() -> None:
    step = m.plan(observed(member("a", leader=True), member("b"), member("c", learner=True)))
    assert isinstance(step, m.Wait) and "learner" in step.reason


def test_no_leader_or_two_leaders_waits() -> None:
    assert isinstance(m.plan(observed(member("a"), member("b"), member("c"))), m.Wait)
    assert isinstance(
        m.plan(observed(member("a", leader=True), member("b", leader=True), member("c"))), m.Wait
    )


def test_disabled_or_outside_the_window_is_idle() -> None:
    members = (member("a", leader=True), member("b"), member("c"))
    assert isinstance(m.plan(observed(*members, enabled=False)), m.Idle)
    step = m.plan(observed(*members, window_open=False))
    assert isinstance(step, m.Idle) and "window" in step.reason


def test_nothing_fragmented_is_idle() -> None:
    step = m.plan(observed(member("a", leader=True, in_use=99 * MiB), member("b", size=10 * MiB, in_use=0)))
    assert step == m.Idle("no member's database is fragmented beyond the threshold")


def test_an_interrupted_defragmentation_is_finished_before_anything_else() -> None:
    members = (member("a", leader=True), member("b", healthy=False), member("c"))
    assert isinstance(m.plan(observed(*members, in_progress="b")), m.Wait)
    healthy = (members[0], replace(members[1], healthy=True), members[2])
    assert m.plan(observed(*healthy, in_progress="b")) == m.FinishRecord(healthy[1])
    gone = m.plan(observed(*members, in_progress="z"))
    assert isinstance(gone, m.FinishRecord) and gone.member.name == "z" and not gone.member.url


# ---- properties -----------------------------------------------------------------------


@st.composite
def clusters(draw: st.DrawFn) -> m.Observed:
    count = draw(st.integers(1, 7))
    leader = draw(st.integers(-1, count - 1))
    members = []
    for i in range(count):
        size = draw(st.integers(0, 200)) * MiB
        members.append(m.MemberView(
            f"m{i}", f"http://m{i}:2379", healthy=draw(st.booleans()) or draw(st.booleans()),
            learner=draw(st.integers(0, 9)) == 0, leader=i == leader,
            db_size=size, db_size_in_use=draw(st.integers(0, max(size, 0))),
        ))  # fmt: skip
    return m.Observed(
        phase=draw(st.sampled_from(["Running", "Running", "Scaling", "Upgrading", "Recovering", None])),
        size=draw(st.sampled_from([count, count, count + 1])),
        members=tuple(members),
        threshold=draw(st.floats(0, 1)),
        min_db_size=draw(st.integers(0, 100)) * MiB,
        enabled=draw(st.booleans()) or draw(st.booleans()),
        window_open=draw(st.booleans()) or draw(st.booleans()),
        in_progress=draw(st.sampled_from([None, None, None, "m0"])),
    )


@given(clusters())
def test_a_defragmentation_only_ever_starts_on_a_settled_healthy_cluster(o: m.Observed) -> None:
    step = m.plan(o)
    if isinstance(step, m.Defragment):
        assert o.enabled and o.window_open and o.phase == "Running" and o.in_progress is None
        assert len(o.members) == o.size
        assert all(x.healthy and not x.learner for x in o.members)
        assert sum(x.leader for x in o.members) == 1
        assert m.needs_defragmentation(
            step.member.db_size, step.member.db_size_in_use, o.threshold, o.min_db_size
        )
        if step.member.leader:
            needy = [x for x in o.members if not x.leader]
            assert not any(
                m.needs_defragmentation(x.db_size, x.db_size_in_use, o.threshold, o.min_db_size)
                for x in needy
            )


@given(clusters())
def test_a_settled_cluster_with_a_fragmented_member_gets_a_defragmentation(o: m.Observed) -> None:
    settled = replace(
        o, phase="Running", size=len(o.members), enabled=True, window_open=True, in_progress=None,
        members=tuple(replace(x, healthy=True, learner=False, leader=i == 0)
                      for i, x in enumerate(o.members)),
    )  # fmt: skip
    step = m.plan(settled)
    if m.wanting(settled):
        assert isinstance(step, m.Defragment)
    else:
        assert isinstance(step, m.Idle)


@given(clusters())
def test_rounds_visit_each_fragmented_member_once_one_at_a_time_leader_last(o: m.Observed) -> None:
    """Plan, defragment what it picks (its free space goes), plan again: until idle."""
    current = replace(
        o, phase="Running", size=len(o.members), enabled=True, window_open=True, in_progress=None,
        members=tuple(replace(x, healthy=True, learner=False, leader=i == len(o.members) - 1)
                      for i, x in enumerate(o.members)),
    )  # fmt: skip
    expected = {x.name for x in m.wanting(current)}
    order: list[m.MemberView] = []
    for _ in range(len(o.members) + 1):
        step = m.plan(current)
        if not isinstance(step, m.Defragment):
            break
        order.append(step.member)
        done = replace(step.member, db_size=step.member.db_size_in_use)
        current = replace(current, members=tuple(done if x.name == done.name else x for x in current.members))
    assert isinstance(m.plan(current), m.Idle)
    assert {x.name for x in order} == expected
    assert len(order) == len(expected)
    leaders = [i for i, x in enumerate(order) if x.leader]
    assert leaders in ([], [len(order) - 1])


# ---- the record a step leaves in status.maintenance -------------------------------------


def test_a_defragmentation_records_its_intent_then_its_outcome_once() -> None:
    follower = member("b", size=100 * MiB, in_use=10 * MiB)
    empty = MaintenanceStatus()
    intent = m.started(empty, m.Started(follower, "follower b", "t0"))
    assert intent.in_progress is not None and intent.in_progress.member == "b"
    assert intent.in_progress.db_size_before == 100 * MiB
    after = replace(follower, db_size=12 * MiB)
    outcome = m.Defragmented(intent.in_progress, after, None, 1.5, "t1")
    done = m.record(intent, outcome, None)
    assert done.in_progress is None and len(done.defragmentations) == 1
    (d,) = done.defragmentations
    assert (d.completed_at, d.db_size_after, d.reclaimed) == ("t1", 12 * MiB, 88 * MiB)
    assert (
        done.message
        == f"defragmented follower b in 1.5s: {100 * MiB} -> {12 * MiB} bytes ({88 * MiB} reclaimed)"
    )
    assert [n.reason for n in m.notes(intent, outcome)] == ["Defragmented"]
    # A second round replaces the member's record: one per member.
    again = m.record(done, replace(outcome, at="t2"), None)
    assert [r.completed_at for r in again.defragmentations] == ["t2"]


def test_a_failed_defragmentation_is_recorded_with_its_error_and_warned() -> None:
    started = DefragmentationRecord(member="a", started_at="t0", db_size_before=MiB, leader=True)
    outcome = m.Defragmented(started, member("a", healthy=False, size=0), "deadline exceeded", 600.0, "t1")
    done = m.record(MaintenanceStatus(in_progress=started), outcome, None)
    assert done.defragmentations[0].error == "deadline exceeded" and done.in_progress is None
    assert [(n.reason, n.type) for n in m.notes(done, outcome)] == [("DefragmentationFailed", "Warning")]


def test_nospace_recovery_is_recorded_step_by_step() -> None:
    compacted = m.record(MaintenanceStatus(), m.Compacted(500, "t0"), None)
    assert compacted.no_space is not None and compacted.no_space.compacted_revision == 500
    assert [n.reason for n in m.notes(MaintenanceStatus(), m.Compacted(500, "t0"))] == ["NoSpaceRecovering"]
    started = DefragmentationRecord(member="a", started_at="t1", db_size_before=8 * MiB)
    defragmented = m.record(compacted, m.Defragmented(started, member("a"), None, 1.0, "t2"), None)
    assert defragmented.no_space is not None and defragmented.no_space.defragmented == ["a"]
    disarmed = m.record(defragmented, m.Disarmed("give it 64Mi"), None)
    assert disarmed.no_space is None and disarmed.message is not None
    assert "revision 500" in disarmed.message and disarmed.message.endswith("; give it 64Mi")
    assert [n.reason for n in m.notes(defragmented, m.Disarmed("give it 64Mi"))] == [
        "SpaceRecovered", "VolumeTooSmall",
    ]  # fmt: skip


def test_a_wait_is_said_once_and_a_failure_keeps_the_record() -> None:
    invalid = m.Say("spec.maintenance.defragmentation.schedule: bad", invalid=True)
    said = m.record(MaintenanceStatus(), invalid, None)
    assert said.message == invalid.message
    assert [n.reason for n in m.notes(MaintenanceStatus(), invalid)] == ["MaintenanceInvalid"]
    assert m.notes(said, invalid) == []  # said already: no second Event
    started = DefragmentationRecord(member="a", started_at="t0")
    failed = m.record(
        MaintenanceStatus(in_progress=started), m.Disarm(), ReconcileError("refused", "EtcdError")
    )
    assert failed.in_progress == started and failed.message == "EtcdError: refused"


def test_a_new_clusters_absent_record_and_an_empty_one_are_the_same_and_a_real_change_is_not() -> None:
    """The defragmentation controller wrote ``{"defragmentations": []}`` over every new cluster's
    absent record: a status write that conflicted with the EtcdCluster controller's first."""
    from kustos.etcd.defragmentation_controller import same_record

    empty = {"maintenance": MaintenanceStatus().model_dump(by_alias=True, exclude_none=True)}
    assert same_record({}, empty) and same_record({"maintenance": {}}, empty)
    said = {"maintenance": {"defragmentations": [], "message": "outside the schedule's window"}}
    assert not same_record({}, said)
