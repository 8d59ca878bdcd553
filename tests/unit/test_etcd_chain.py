"""Changes of spec.version across several minors: which versions in turn, and when each step starts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kustos.api.etcd import EtcdCluster
from kustos.etcd import planner
from kustos.etcd import status as report
from kustos.etcd.chain import Progress, progress, under_way
from kustos.etcd.observe import EtcdView
from kustos.etcd.planner import MemberView, PodView
from kustos.etcd.status import Seen
from kustos.etcd.versions import version_path
from kustos.runtime.conditions import get_condition
from kustos.runtime.steps import Done, Wait
from tests.unit.test_etcd_status import formed

NOW = datetime(2026, 11, 26, 4, 0, tzinfo=UTC)
PROVEN = ("3.5.35", "3.6.16", "3.7.3")


@pytest.mark.parametrize(
    ("current", "wanted", "path"),
    [
        ("3.5.35", "3.7.3", ("3.6.16", "3.7.3")),  # through the newest proven 3.6
        ("3.6.5", "3.7.3", ("3.6.16", "3.7.3")),  # 3.7 needs 3.6.11 or later first
        ("3.6.12", "3.7.3", ("3.7.3",)),  # an ordinary one-minor upgrade
        ("3.5.1", "3.8.0", ("3.6.16", "3.7.3", "3.8.0")),
        ("3.7.3", "3.5.35", ("3.6.16", "3.5.35")),  # two rollbacks through etcd's downgrade
        ("3.7.3", "3.6.2", ("3.6.2",)),  # one rollback: the patch the user names
        ("3.5.1", "3.5.35", ("3.5.35",)),
        ("3.7.3", "3.7.3", ()),
    ],
)
def test_a_path_across_minors_goes_through_the_newest_proven_patch_of_each(
    current: str, wanted: str, path: tuple[str, ...]
) -> None:
    assert version_path(current, wanted, PROVEN) == path


@pytest.mark.parametrize(
    ("current", "wanted", "proven", "why"),
    [
        ("3.5.35", "3.7.3", ("3.5.35", "3.7.3"), "goes through etcd 3.6, and kustos proves no 3.6 patch"),
        ("3.6.5", "3.7.3", ("3.6.9", "3.7.3"), "needs every member on 3.6.11 or later first"),
        ("3.7.3", "3.4.0", PROVEN, "etcd 3.5 has no downgrade protocol: it cannot roll back to 3.4"),
        ("3.9.0", "3.7.3", PROVEN, "etcd 3.9 has no downgrade protocol"),
        ("3.7.3", "4.0.0", PROVEN, "major version"),
    ],
)
def test_a_path_that_cannot_be_walked_is_refused_saying_why(
    current: str, wanted: str, proven: tuple[str, ...], why: str
) -> None:
    refusal = version_path(current, wanted, proven)
    assert isinstance(refusal, str) and why in refusal, refusal


def on(running: str, wanted: str, path: dict[str, Any] | None = None) -> EtcdCluster:
    status: dict[str, Any] = {"currentVersion": running, **({"versionPath": path} if path else {})}
    return EtcdCluster.model_validate({
        "metadata": {"name": "e", "namespace": "ns"}, "spec": {"size": 3, "version": wanted},
        "status": status,
    })  # fmt: skip


def recorded(p: Progress) -> dict[str, Any]:
    assert p.path is not None
    return p.path.model_dump(by_alias=True, exclude_none=True)


def test_an_upgrade_from_35_to_37_walks_36_and_waits_for_etcds_cluster_version() -> None:
    first = progress(on("3.5.35", "3.7.3"), "", False, NOW)
    assert (first.version, first.rollback, first.hold) == ("3.6.16", None, None)
    path = recorded(first)
    assert path == {"source": "3.5.35", "target": "3.7.3", "steps": ["3.6.16", "3.7.3"], "step": "3.6.16",
                    "startedAt": "2026-11-26T04:00:00Z"}  # fmt: skip
    # Mid-step (the members still disagree, so the recorded current version is the old one).
    assert progress(on("3.5.35", "3.7.3", path), "3.5.0", False, NOW).version == "3.6.16"
    # Every member runs 3.6.16, but etcd's leader has not raised the cluster version yet.
    assert under_way(on("3.6.16", "3.7.3", path)), "etcd's cluster version is asked until the end"
    assert not under_way(on("3.6.16", "3.7.3")), "an ordinary one-minor upgrade asks nothing more"
    held = progress(on("3.6.16", "3.7.3", path), "3.5.0", False, NOW)
    assert held.version == "3.6.16" and held.hold is not None
    assert "cluster version 3.5.0" in held.hold and "3.7.3 (step 2 of 2" in held.hold
    assert recorded(held)["step"] == "3.6.16"
    # etcd reports 3.6: the next step starts, and is recorded.
    on_to = progress(on("3.6.16", "3.7.3", path), "3.6.0", False, NOW)
    assert (on_to.version, on_to.hold, recorded(on_to)["step"]) == ("3.7.3", None, "3.7.3")
    # Done: nothing is recorded any more.
    assert progress(on("3.7.3", "3.7.3", recorded(on_to)), "3.7.0", False, NOW) == Progress("3.7.3", None)


def test_a_restarted_operator_resumes_the_recorded_step_not_a_new_path() -> None:
    # Recorded by an operator that proved another 3.6 patch: the step stays the recorded one.
    path = {"source": "3.5.35", "target": "3.7.3", "steps": ["3.6.15", "3.7.3"], "step": "3.6.15"}
    assert progress(on("3.5.35", "3.7.3", path), "", False, NOW).version == "3.6.15"
    # A path recorded for another spec.version is forgotten: the user changed it meanwhile.
    back = progress(on("3.5.35", "3.5.35", path), "", False, NOW)
    assert back == Progress("3.5.35", None)


def test_a_rollback_from_37_to_35_walks_back_one_minor_at_a_time_through_etcds_downgrade() -> None:
    first = progress(on("3.7.3", "3.5.35"), "", False, NOW)
    assert (first.version, first.rollback) == ("3.6.16", "3.6")
    path = recorded(first)
    # Every member runs 3.6.16, but etcd still reports its downgrade: the next waits.
    held = progress(on("3.6.16", "3.5.35", path), "3.6.0", True, NOW)
    assert held.hold is not None and "downgrade still enabled" in held.hold
    second = progress(on("3.6.16", "3.5.35", path), "3.6.0", False, NOW)
    assert (second.version, second.rollback, recorded(second)["step"]) == ("3.5.35", "3.5", "3.5.35")


def test_a_refused_change_keeps_the_members_where_they_are() -> None:
    assert progress(on("3.7.3", "3.9.1"), "3.7.0", False, NOW) == Progress("3.7.3", None)


def test_the_planner_waits_for_etcd_between_steps_instead_of_being_done() -> None:
    members = [MemberView(100 + i, f"e-{i}", f"http://127.1.1.{i}:2380", healthy=True, leader=i == 0)
               for i in range(3)]  # fmt: skip
    pods = [PodView(f"e-{i}", i, uid=f"u{i}", ip=f"127.1.1.{i}", running=True, ready=True, member_id=100 + i,
                    version="3.6.16") for i in range(3)]  # fmt: skip
    o = planner.Observed(
        cluster="e", namespace="ns", size=3, addressing="podIP", storage="emptyDir",
        failure_timeout=timedelta(seconds=60), now=NOW,
        pods=tuple(pods), members=tuple(members), next_index=3, ever_formed=True, version="3.6.16",
    )  # fmt: skip
    assert planner.plan(o) == Done()
    assert planner.plan(replace(o, hold="etcd must follow")) == Wait("etcd must follow", 2.0)


def chain_seen(running: str, wanted: str, path: dict[str, Any] | None, cluster_version: str) -> Seen:
    base = formed()
    previous = {**base.previous, "currentVersion": running, **({"versionPath": path} if path else {})}
    assert base.etcd is not None and base.observed is not None
    etcd = EtcdView(
        base.etcd.members, base.etcd.statuses, base.etcd.answered, cluster_version=cluster_version
    )
    cluster = on(running, wanted, path).model_copy(update={"metadata": base.cluster.metadata})  # type: ignore[union-attr]
    return Seen(previous, 2, cluster, base.observed, etcd, base.client_urls)


def test_status_records_the_path_and_events_say_when_it_starts_and_moves_on() -> None:
    seen = chain_seen("3.5.35", "3.7.3", None, "3.5.0")
    new = report.status(seen, Wait("rolling"), NOW)
    assert new["versionPath"]["step"] == "3.6.16"
    started = [n for n in report.notes(seen, Wait("rolling"), new) if n.reason == "VersionPathStarted"]
    assert (
        len(started) == 1
        and "from etcd 3.5.35 to 3.7.3 one minor at a time, through 3.6.16" in started[0].message
    )
    path = new["versionPath"]
    moved_seen = chain_seen("3.6.16", "3.7.3", path, "3.6.0")
    moved = report.status(moved_seen, Wait("rolling"), NOW)
    assert moved["versionPath"]["step"] == "3.7.3"
    news = report.notes(moved_seen, Wait("rolling"), moved)
    assert "VersionStepStarted" in [n.reason for n in news]
    assert any("rolling on to etcd 3.7.3 (step 2 of 2)" in n.message for n in news)


def test_a_failed_step_halts_with_a_condition_naming_the_step() -> None:
    path = {"source": "3.5.35", "target": "3.7.3", "steps": ["3.6.16", "3.7.3"], "step": "3.7.3"}
    seen = chain_seen("3.6.16", "3.7.3", path, "3.6.0")
    halt = planner.UpgradeHalted("member e-1 failed on etcd 3.7.3: upgrade halted")
    new = report.status(seen, halt, NOW)
    degraded = get_condition(new["conditions"], "Degraded") or {}
    assert degraded["reason"] == "UpgradeHalted"
    assert degraded["message"].startswith("step 2 of 2 (etcd 3.7.3) of 3.5.35 -> 3.7.3 failed: member e-1")
    assert "spec.version 3.6.16 keeps the cluster there" in degraded["message"]
    assert new["phase"] == "Upgrading"
