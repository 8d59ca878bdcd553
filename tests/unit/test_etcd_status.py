"""The EtcdCluster's status, one pure function of what a pass saw and the step it took."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kustos.api.etcd import EtcdCluster, RecoveryStatus
from kustos.etcd import planner, recovery
from kustos.etcd import status as report
from kustos.etcd.client import EtcdError, Member, MemberList, Status, UnhealthyCluster
from kustos.etcd.cluster_planner import Blocked, ExternalMember, StartAdoption, StartRebuild
from kustos.etcd.observe import EtcdView
from kustos.etcd.planner import MemberView, Observed, PodView
from kustos.etcd.pods import PodRefused
from kustos.etcd.recovery import Source
from kustos.etcd.status import (
    Rebuild,
    Seen,
    invalid_spec_notes,
    needs_intent,
    notes,
    status,
)
from kustos.runtime.api import ApiStatusError
from kustos.runtime.conditions import get_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.reconciler import InvalidSpec, previous_with_failure
from kustos.runtime.steps import Done, Wait

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
STAMP = "2026-11-22T12:00:00Z"


def cluster(status: dict[str, Any] | None = None, **spec: Any) -> EtcdCluster:
    return EtcdCluster.model_validate({
        "metadata": {"name": "e", "namespace": "ns", "uid": "u-1", "generation": 2},
        "spec": {"size": 3, "version": "3.6.16", **spec}, "status": status or {},
    })  # fmt: skip


def answer(member_id: int, leader_id: int = 100) -> Status:
    return Status(
        cluster_id=0xC1, member_id=member_id, leader_id=leader_id, raft_term=2, raft_index=10,
        raft_applied_index=10, revision=5, db_size=0, db_size_in_use=0, version="3.6.16",
        is_learner=False, errors=(),
    )  # fmt: skip


def formed(n: int = 3, healthy: int = 3, previous: dict[str, Any] | None = None, **spec: Any) -> Seen:
    """A cluster of ``n`` members, the first ``healthy`` of them answering."""
    pods = tuple(
        PodView(f"e-{i}", i, ip=f"10.0.0.{i}", running=True, ready=True, member_id=100 + i) for i in range(n)
    )
    members = tuple(
        MemberView(
            100 + i, f"e-{i}", f"http://10.0.0.{i}:2380", healthy=i < healthy, leader=i == 0, version="3.6.16"
        )
        for i in range(n)
    )
    urls = {f"e-{i}": f"http://10.0.0.{i}:2379" for i in range(n)}
    said = {urls[f"e-{i}"]: answer(100 + i) for i in range(healthy)}
    listed = MemberList(
        0xC1, 100, [Member(m.id, m.name, (m.peer_url,), (urls[m.name],), False) for m in members]
    )
    previous = {"clusterId": "c1", "phase": "Running", "currentVersion": "3.6.16", **(previous or {})}
    o = Observed(
        cluster="e", namespace="ns", size=3, addressing="podIP", storage="emptyDir",
        failure_timeout=timedelta(seconds=60), now=NOW, pods=pods, members=members, ever_formed=True,
        version="3.6.16",
    )  # fmt: skip
    return Seen(previous, 2, cluster(previous, **spec), o, EtcdView(listed, said, said), urls)


def condition(result: dict[str, Any], type_: str) -> dict[str, Any]:
    found = get_condition(result.get("conditions"), type_)
    assert found is not None, f"no {type_} condition in {result.get('conditions')}"
    return found


def test_a_settled_cluster_is_running_available_and_not_progressing() -> None:
    result = status(formed(), Done(), NOW)
    assert result["phase"] == "Running" and result["ready"] == "3/3" and result["size"] == 3
    assert [m["name"] for m in result["members"]] == ["e-0", "e-1", "e-2"]
    assert condition(result, "Available")["status"] == "True"
    assert condition(result, "Progressing")["status"] == "False"
    assert condition(result, "Degraded")["reason"] == "AllHealthy"
    assert condition(result, "VersionAccepted")["status"] == "True"


def test_a_step_is_progress_named_after_its_kind() -> None:
    result = status(formed(), Wait("a member is joining", 1.0), NOW)
    progressing = condition(result, "Progressing")
    assert (progressing["status"], progressing["reason"], progressing["message"]) == (
        "True", "Wait", "a member is joining",
    )  # fmt: skip


def test_members_brought_back_on_their_volumes_are_named_in_the_progress() -> None:
    step = planner.RecreatePod("e-1", 101, also=(("e-2", 102),))
    progressing = condition(status(formed(healthy=1), step, NOW), "Progressing")
    assert (progressing["reason"], progressing["message"]) == (
        "RecreatePod", "bringing e-1 and e-2 back on their volumes",
    )  # fmt: skip


def test_an_unhealthy_member_degrades_and_the_cluster_recovers() -> None:
    result = status(formed(healthy=2), planner.RemoveMember(102, "e-2", "dead"), NOW)
    assert result["phase"] == "Recovering" and result["ready"] == "2/3"
    assert condition(result, "Degraded")["reason"] == "MemberUnhealthy"


@pytest.mark.parametrize(
    "step", [planner.CreateSeed(4), planner.CreatePod(4), planner.AddMember("e-4", "http://x:2380", index=4)]
)
def test_a_step_that_uses_a_member_index_reserves_the_next_one(step: planner.Step) -> None:
    assert needs_intent(step)
    assert status(formed(previous={"nextMemberIndex": 3}), step, NOW)["nextMemberIndex"] == 5


@pytest.mark.parametrize("step", [planner.CreateSeed(3), planner.CreatePod(4)])
def test_a_refused_pod_gives_its_index_back_for_the_retry(
    step: planner.CreateSeed | planner.CreatePod,
) -> None:
    # The intent recorded 4 or 5 before the create; the API server refused the pod, so the
    # name was never used: the final record keeps the index, and the condition names why.
    refusal = ApiStatusError(
        403, "Forbidden", 'pods "e-4" is forbidden: violates PodSecurity "restricted:latest"'
    )
    result = status(formed(previous={"nextMemberIndex": 3}), step, NOW, PodRefused("e-4", refusal))
    assert result["nextMemberIndex"] == step.index
    progressing = condition(result, "Progressing")
    assert progressing["reason"] == "PodRefused" and "violates PodSecurity" in progressing["message"]


def test_a_refused_pod_never_gives_back_an_index_reserved_before() -> None:
    refusal = PodRefused("e-4", ApiStatusError(403, "Forbidden", "exceeded quota"))
    step = planner.CreatePod(4)  # a DNS member etcd knows already: its index was reserved by the add
    assert status(formed(previous={"nextMemberIndex": 9}), step, NOW, refusal)["nextMemberIndex"] == 9


@pytest.mark.parametrize(
    ("failure", "next_index"),
    [(UnhealthyCluster("etcdserver: unhealthy cluster", 14), 4), (EtcdError("timed out"), 5)],
    ids=["refused", "timed-out"],
)
def test_an_add_etcd_refused_gives_its_index_back_and_one_that_may_have_happened_does_not(
    failure: EtcdError, next_index: int
) -> None:
    # etcd answers "unhealthy cluster" before proposing the add: e-4 was never a member, and
    # the retry is e-4 again. A timeout may have added it: e-4 stays spent.
    step = planner.AddMember("e-4", "http://e-4.e-peer.ns.svc:2380", learner=True, index=4)
    result = status(formed(previous={"nextMemberIndex": 4}), step, NOW, failure)
    assert result["nextMemberIndex"] == next_index


def test_a_refused_rebuild_seed_is_no_attempt_and_keeps_its_index() -> None:
    seen = Seen({"phase": "Recovering", "nextMemberIndex": 3}, 1, cluster())
    step = Rebuild(recovery.CreateRestoreSeed(5), running_rebuild(attempts=1))
    result = status(seen, step, NOW, PodRefused("e-5", ApiStatusError(403, "Forbidden", "no")))
    assert result["nextMemberIndex"] == 5 and result["recovery"]["attempts"] == 1


def test_an_index_already_reserved_stays() -> None:
    assert status(formed(previous={"nextMemberIndex": 9}), planner.CreatePod(4), NOW)["nextMemberIndex"] == 9


def test_steps_that_use_nothing_recorded_first_are_recorded_after() -> None:
    for step in (
        Done(),
        Wait("x"),
        planner.AddMember("e-4", "http://x:2380"),
        planner.RemoveMember(1, "e", "r"),
    ):
        assert not needs_intent(step)


def test_quorum_loss_is_reported_only_once_it_has_lasted() -> None:
    first = status(formed(healthy=1), planner.QuorumLost("1 of 3"), NOW)
    assert first["phase"] == "Running"  # not yet: a slow member must not look like a lost cluster
    assert condition(first, "Available")["reason"] == "QuorumLost"
    assert condition(first, "Degraded")["reason"] == "MemberUnhealthy"
    later = replace(formed(healthy=1), previous={**formed().previous, "conditions": first["conditions"]})
    confirmed = status(later, planner.QuorumLost("1 of 3"), NOW + report.QUORUM_LOSS_GRACE)
    assert confirmed["phase"] == "QuorumLost"
    assert condition(confirmed, "Degraded")["reason"] == "QuorumLost"
    news = notes(later, planner.QuorumLost("1 of 3"), confirmed)
    assert [n.reason for n in news] == ["QuorumLost"]
    again = replace(later, previous={**later.previous, "conditions": confirmed["conditions"]})
    assert notes(again, planner.QuorumLost("1 of 3"), confirmed) == []  # a transition, not every pass


def test_a_failure_is_the_progressing_condition() -> None:
    result = status(
        formed(), planner.RemoveMember(102, "e-2", "dead"), NOW, ReconcileError("etcd refused", "EtcdError")
    )
    progressing = condition(result, "Progressing")
    assert (progressing["status"], progressing["reason"], progressing["message"]) == (
        "True", "EtcdError", "etcd refused",
    )  # fmt: skip


def test_a_pass_that_could_not_observe_keeps_the_status_and_says_why() -> None:
    seen = Seen({"phase": "Running", "ready": "3/3"}, 2, cluster())
    result = status(seen, report.Unobserved(), NOW, ReconcileError("409 Conflict", "Conflict"))
    assert result["phase"] == "Running" and result["ready"] == "3/3"
    assert condition(result, "Progressing")["reason"] == "Conflict"
    assert status(seen, report.Unobserved(), NOW) == seen.previous


def test_an_invalid_spec_keeps_the_status_and_is_said_once_naming_the_field() -> None:
    raw = {"metadata": {"generation": 4}, "status": {"phase": "Running", "ready": "3/3"}}
    refused = InvalidSpec("invalid spec: spec.size: Input should be greater than 0")
    result = previous_with_failure(raw, refused, NOW, "Degraded")
    assert result["phase"] == "Running" and result["ready"] == "3/3"
    degraded = condition(result, "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["observedGeneration"]) == (
        "True",
        "InvalidSpec",
        4,
    )
    assert [(n.reason, n.message) for n in invalid_spec_notes(raw["status"], result)] == [
        ("InvalidSpec", "invalid spec: spec.size: Input should be greater than 0")
    ]
    assert invalid_spec_notes(result, result) == []


def test_a_restore_or_adoption_that_cannot_start_says_why() -> None:
    seen = Seen({}, 1, cluster())
    step = Blocked(
        "RestoreWaiting", "spec.restore: EtcdBackup b not found", "EtcdBackup b not found; waiting for it"
    )
    result = status(seen, step, NOW)
    assert condition(result, "Degraded")["reason"] == "RestoreWaiting"
    assert [(n.reason, n.message) for n in notes(seen, step, result)] == [
        ("RestoreWaiting", "EtcdBackup b not found; waiting for it"),
    ]


def test_a_rebuild_is_recorded_before_its_first_step() -> None:
    last = {"epoch": 0, "sourceKind": "member", "source": "x", "completedAt": STAMP, "phase": "Failed"}
    seen = Seen({"phase": "QuorumLost", "epoch": 0, "recovery": last}, 1, cluster())
    step = StartRebuild(Source("backup", "b1", 77), "approved", 1)
    assert needs_intent(step)
    result = status(seen, step, NOW)
    assert result["phase"] == "Recovering"
    assert result["recovery"] == {
        "epoch": 1, "phase": "Running", "sourceKind": "backup", "source": "b1", "revision": 77,
        "reason": "approved", "startedAt": STAMP, "attempts": 0,
        "message": "rebuilding from " + Source("backup", "b1", 77).describe(),
    }  # fmt: skip
    assert "completedAt" not in result["recovery"]  # a replace clears what the last rebuild left
    assert [n.reason for n in notes(seen, step, result)] == ["RecoveryStarted"]


def running_rebuild(**fields: Any) -> RecoveryStatus:
    return RecoveryStatus.model_validate(
        {"epoch": 1, "sourceKind": "backup", "source": "b1", "revision": 77, **fields}
    )


def test_a_rebuild_seed_records_its_attempt_and_index_before_it_exists() -> None:
    seen = Seen({"phase": "Recovering", "nextMemberIndex": 3}, 1, cluster())
    step = Rebuild(recovery.CreateRestoreSeed(5), running_rebuild())
    assert needs_intent(step)
    result = status(seen, step, NOW)
    assert result["nextMemberIndex"] == 6
    assert result["recovery"]["attempts"] == 1 and result["recovery"]["message"] == "starting seed member 5"
    assert condition(result, "Degraded")["reason"] == "Recovering"


def test_a_rebuild_that_fails_says_so() -> None:
    seen = Seen({"phase": "Recovering"}, 1, cluster())
    step = Rebuild(recovery.RecoveryFailed("3 seeds could not restore"), running_rebuild(attempts=3))
    result = status(seen, step, NOW)
    assert result["phase"] == "Failed" and result["recovery"]["phase"] == "Failed"
    assert result["recovery"]["completedAt"] == STAMP
    assert condition(result, "Progressing")["status"] == "False"
    assert condition(result, "Degraded")["reason"] == "RecoveryFailed"
    assert [n.reason for n in notes(seen, step, result)] == ["RecoveryFailed"]


def test_a_rebuild_step_in_between_records_its_message() -> None:
    seen = Seen({"phase": "Recovering"}, 1, cluster())
    result = status(seen, Rebuild(Wait("seed e-5 is restoring", 1.0), running_rebuild()), NOW)
    assert result["recovery"]["message"] == "seed e-5 is restoring" and result["phase"] == "Recovering"
    deleting = status(seen, Rebuild(planner.DeletePod("e-0", "u", "fenced off"), running_rebuild()), NOW)
    assert deleting["recovery"]["message"] == "deleting pod e-0: fenced off"


def test_a_finished_rebuild_is_a_one_member_cluster_of_the_new_epoch() -> None:
    seen = Seen({"phase": "Recovering", "members": [{"name": "e-0"}, {"name": "e-1"}]}, 1, cluster())
    seed = PodView("e-5", 5, ip="10.0.0.5")
    step = Rebuild(
        recovery.FinishRecovery("e-5"), running_rebuild(), seed, "e-5", 0xABC, "http://10.0.0.5:2379"
    )
    result = status(seen, step, NOW)
    assert result["epoch"] == 1 and result["clusterId"] == "abc" and result["phase"] == "Scaling"
    assert [m["name"] for m in result["members"]] == ["e-5"] and result["ready"] == "1/3"
    assert result["recovery"]["phase"] == "Succeeded"
    assert condition(result, "Available")["reason"] == "Recovered"
    assert [n.reason for n in notes(seen, step, result)] == ["Recovered"]


def test_an_adoption_records_the_original_members() -> None:
    seen = Seen({}, 1, cluster())
    step = StartAdoption(0xC1, (ExternalMember(1, "a", ("http://a:2379",)),), "3.6.16")
    result = status(seen, step, NOW)
    assert (
        result["phase"] == "Scaling" and result["clusterId"] == "c1" and result["currentVersion"] == "3.6.16"
    )
    assert result["adoption"]["externalMembers"] == ["1"] and result["adoption"]["endpoints"] == [
        "http://a:2379"
    ]
    assert [n.reason for n in notes(seen, step, result)] == ["AdoptionStarted"]


def test_the_maintenance_record_is_kept_as_read() -> None:
    kept = {"inProgress": {"member": "e-1", "startedAt": STAMP}, "defragmentations": []}
    result = status(formed(previous={"maintenance": kept}), Done(), NOW)
    assert result["maintenance"] == kept


def test_an_upgrade_finished_is_news_once() -> None:
    seen = formed(previous={"currentVersion": "3.5.21"})
    result = status(seen, Done(), NOW)
    assert result["currentVersion"] == "3.6.16"
    assert [n.reason for n in notes(seen, Done(), result)] == ["Upgraded"]


def test_a_halted_upgrade_is_news_on_its_transition_only() -> None:
    seen = formed()
    halted = planner.UpgradeHalted("member e-2 failed on etcd 3.6.16")
    result = status(seen, halted, NOW)
    assert condition(result, "Degraded")["reason"] == "UpgradeHalted" and result["phase"] == "Upgrading"
    assert [n.reason for n in notes(seen, halted, result)] == ["UpgradeHalted"]
    assert notes(replace(seen, previous=result), halted, result) == []


def test_an_even_size_is_news_when_the_spec_changes() -> None:
    seen = formed(size=4)
    result = status(seen, Done(), NOW)
    assert "EvenSize" in [n.reason for n in notes(seen, Done(), result)]
    assert "EvenSize" not in [
        n.reason for n in notes(replace(seen, previous={**result, "observedGeneration": 2}), Done(), result)
    ]


def dns_seen(running_for: timedelta, unresolved: tuple[str, ...]) -> Seen:
    """A DNS-addressed cluster whose member e-0 has run ``running_for`` and whose names in
    ``unresolved`` the operator's resolver does not know."""
    seen = formed(healthy=0)
    started = NOW - running_for
    pods = tuple(replace(p, running_since=started) for p in seen.observed.pods)  # type: ignore[union-attr]
    urls = {f"e-{i}": f"http://e-{i}.e.ns.svc.cluster.local:2379" for i in range(3)}
    etcd = EtcdView(None, {}, {}, unresolved=unresolved)
    return replace(seen, observed=replace(seen.observed, pods=pods), client_urls=urls, etcd=etcd)


def test_a_member_name_that_does_not_resolve_is_named_in_a_condition_and_an_event() -> None:
    seen = dns_seen(timedelta(seconds=30), ("e-0.e.ns.svc.cluster.local",))
    step = planner.Wait("seed member e-0 is starting")
    result = status(seen, step, NOW)
    resolvable = condition(result, "MembersResolvable")
    assert resolvable["status"] == "False" and resolvable["reason"] == "NameNotResolved"
    assert (
        "e-0.e.ns.svc.cluster.local" in resolvable["message"] and "spec.addressing" in resolvable["message"]
    )
    events = notes(seen, step, result)
    assert [n.reason for n in events] == ["MemberNameUnresolved"]
    assert "e-0.e.ns.svc.cluster.local" in events[0].message
    assert notes(replace(seen, previous=result), step, result) == []  # once, not every pass


def test_a_new_pods_name_has_time_to_appear_in_dns() -> None:
    seen = dns_seen(timedelta(seconds=3), ("e-0.e.ns.svc.cluster.local",))
    result = status(seen, planner.Wait("seed member e-0 is starting"), NOW)
    assert condition(result, "MembersResolvable")["status"] == "True"


def test_names_that_resolve_say_so() -> None:
    result = status(dns_seen(timedelta(seconds=30), ()), Done(), NOW)
    assert condition(result, "MembersResolvable")["reason"] == "Resolved"
