"""How an EtcdCluster begins from a backup, from a cluster it adopts, or again after losing
quorum: the decisions of ``cluster_planner`` (and a rebuild's source failing, ``recovery``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd import planner, recovery
from kustos.etcd.cluster_planner import (
    AdoptionSeen,
    Blocked,
    ClusterObserved,
    EndpointAnswer,
    ExternalMember,
    StartAdoption,
    StartRebuild,
    needs_adoption_check,
    plan,
)
from kustos.etcd.planner import MemberView, Observed, PodView
from kustos.etcd.recovery import BackupCandidate, Source, Survivor
from kustos.runtime.times import rfc3339

NOW = datetime(2026, 11, 26, 7, 0, tzinfo=UTC)
ENDPOINTS = ["http://old-0:2379", "http://old-1:2379"]


def cluster(status: dict[str, Any] | None = None, **spec: Any) -> EtcdCluster:
    return EtcdCluster.model_validate({
        "metadata": {"name": "e", "namespace": "ns", "uid": "u-1", "generation": 2},
        "spec": {"size": 3, "version": "3.6.16", **spec}, "status": status or {},
    })  # fmt: skip


def empty() -> Observed:
    return Observed(
        cluster="e", namespace="ns", size=3, addressing="podIP", storage="emptyDir",
        failure_timeout=timedelta(seconds=30), now=NOW, pods=(), members=None, next_index=0,
    )  # fmt: skip


def lost() -> Observed:
    """A cluster that formed once and whose members no longer answer as a cluster."""
    pods = tuple(PodView(f"e-{i}", i, uid=f"u{i}", ip=f"127.1.1.{i + 1}", running=True) for i in range(3))
    return Observed(
        cluster="e", namespace="ns", size=3, addressing="podIP", storage="emptyDir",
        failure_timeout=timedelta(seconds=30), now=NOW, pods=pods, members=None, next_index=3,
        ever_formed=True,
    )  # fmt: skip


def quorum_lost_for(seconds: int, **status: Any) -> dict[str, Any]:
    since = rfc3339(NOW - timedelta(seconds=seconds))
    available = {"type": "Available", "status": "False", "reason": "QuorumLost", "lastTransitionTime": since}
    return {"phase": "QuorumLost", "epoch": 1, "conditions": [available], **status}


def backup(name: str, owner: str = "e", minutes_ago: int = 5, revision: int = 40) -> BackupCandidate:
    return BackupCandidate(name, NOW - timedelta(minutes=minutes_ago), revision, owner)


def answer(url: str, version: str = "3.6.16", cluster_id: int = 0xC1, **kw: Any) -> EndpointAnswer:
    return EndpointAnswer(url, cluster_id, version, kw.get("has_leader", True), kw.get("errors", ()))


MEMBERS = (
    ExternalMember(1, "old-0", ("http://old-0:2379",)),
    ExternalMember(2, "old-1", ("http://old-1:2379",)),
)


# ---- restore -------------------------------------------------------------------------------------


def test_a_new_cluster_with_spec_restore_starts_a_rebuild_from_that_backup_of_any_cluster() -> None:
    o = ClusterObserved(
        cluster(restore={"backup": "nightly"}),
        empty(),
        NOW,
        backups=(backup("nightly", owner="other", revision=9),),
    )
    assert plan(o) == StartRebuild(Source("backup", "nightly", 9), "spec.restore", 0)


def test_a_restore_whose_backup_has_not_succeeded_waits_and_names_it() -> None:
    step = plan(
        ClusterObserved(cluster(restore={"backup": "nightly"}), empty(), NOW, backups=(backup("other"),))
    )
    assert isinstance(step, Blocked) and step.reason == "RestoreWaiting"
    assert step.message.startswith("spec.restore: ") and "EtcdBackup nightly" in step.message


def test_a_formed_cluster_with_spec_restore_is_not_restored_again() -> None:
    members = (MemberView(100 + i, f"e-{i}", f"http://127.1.1.{i + 1}:2380", healthy=True) for i in range(3))
    formed = replace(lost(), members=tuple(members))
    step = plan(
        ClusterObserved(cluster(restore={"backup": "nightly"}), formed, NOW, backups=(backup("nightly"),))
    )
    assert not isinstance(step, StartRebuild | Blocked)


# ---- adoption ------------------------------------------------------------------------------------


def adopting(seen: AdoptionSeen | None, version: str = "3.6.16") -> ClusterObserved:
    return ClusterObserved(
        cluster(adopt={"endpoints": ENDPOINTS}, version=version), empty(), NOW, adoption=seen
    )


def test_an_adoption_starts_with_the_members_it_listed_on_their_oldest_version() -> None:
    seen = AdoptionSeen((answer(ENDPOINTS[0], "3.6.16"), answer(ENDPOINTS[1], "3.6.15")), MEMBERS, 0xC1)
    assert plan(adopting(seen)) == StartAdoption(0xC1, MEMBERS, "3.6.15")


def adoption_refused(seen: AdoptionSeen, version: str = "3.6.16") -> str:
    step = plan(adopting(seen, version))
    assert isinstance(step, Blocked) and step.reason == "AdoptionWaiting", step
    assert step.message == f"spec.adopt: {step.event}"
    return step.event


def test_an_endpoint_that_does_not_answer_holds_the_adoption() -> None:
    assert adoption_refused(AdoptionSeen(unreachable="http://old-0:2379 does not answer: refused")) == (
        "http://old-0:2379 does not answer: refused"
    )


def test_endpoints_of_two_clusters_are_not_adopted() -> None:
    seen = AdoptionSeen((answer(ENDPOINTS[0]), answer(ENDPOINTS[1], cluster_id=0xC2)), MEMBERS, 0xC1)
    assert adoption_refused(seen) == "the endpoints belong to different etcd clusters"


def test_a_cluster_without_a_leader_is_not_adopted_and_the_endpoint_is_named() -> None:
    seen = AdoptionSeen((answer(ENDPOINTS[0]), answer(ENDPOINTS[1], has_leader=False)), MEMBERS, 0xC1)
    assert (
        adoption_refused(seen) == "the cluster has no leader or reports errors: http://old-1:2379: no leader"
    )


def test_a_cluster_newer_than_spec_version_is_adopted_on_its_own_version_first() -> None:
    seen = AdoptionSeen((answer(ENDPOINTS[0], "3.6.16"),), MEMBERS, 0xC1)
    assert adoption_refused(seen, version="3.5.17") == (
        "its members run etcd 3.6.16: adopt it on etcd 3.6.16 first, then roll back to 3.5.17"
    )


def test_a_member_that_has_not_started_holds_the_adoption() -> None:
    seen = AdoptionSeen((answer(ENDPOINTS[0]),), (*MEMBERS, ExternalMember(3, "", ())), 0xC1)
    assert adoption_refused(seen) == "a member of it has not started (no name or client URL yet)"


def test_the_endpoints_are_asked_only_while_the_adoption_waits_to_start() -> None:
    adopt = cluster(adopt={"endpoints": ENDPOINTS})
    assert needs_adoption_check(adopt, empty())
    assert not needs_adoption_check(adopt, lost())  # formed: the planner replaces members instead
    assert not needs_adoption_check(cluster(), empty())
    assert not needs_adoption_check(cluster(adopt={"endpoints": ENDPOINTS}, restore={"backup": "b"}), empty())


# ---- recovery from a lost quorum ------------------------------------------------------------------

SURVIVORS = (Survivor("e-0", "http://127.1.1.1:2379", 50, 7), Survivor("e-1", "http://127.1.1.2:2379", 52, 3))


def test_a_rebuild_asked_for_starts_from_the_survivor_with_the_newest_data() -> None:
    o = ClusterObserved(cluster(quorum_lost_for(1)), lost(), NOW, "auto", SURVIVORS, (backup("nightly"),))
    assert plan(o) == StartRebuild(Source("member", "e-1", 52), "approved with kustos etcd recover", 2)


def test_without_a_request_the_lost_quorum_says_how_to_ask_for_a_rebuild() -> None:
    step = plan(ClusterObserved(cluster(quorum_lost_for(600)), lost(), NOW, None, SURVIVORS))
    assert isinstance(step, planner.QuorumLost) and step.refused is None
    assert step.message.endswith("`kustos etcd recover e -n ns` rebuilds it from member e-1 at revision 52")


def test_automatic_recovery_waits_for_its_delay_then_starts() -> None:
    spec = {"recovery": {"automatic": True, "delay": "60s"}}
    early = plan(ClusterObserved(cluster(quorum_lost_for(30), **spec), lost(), NOW, None, SURVIVORS))
    assert isinstance(early, planner.QuorumLost)
    assert early.message.endswith("rebuilding from member e-1 at revision 52 after 60s")
    due = plan(ClusterObserved(cluster(quorum_lost_for(61), **spec), lost(), NOW, None, SURVIVORS))
    assert due == StartRebuild(Source("member", "e-1", 52), "automatic: quorum lost for 61s", 2)


def test_after_a_failed_rebuild_automatic_recovery_stops_and_says_how_to_try_again() -> None:
    failed = {"epoch": 2, "phase": "Failed", "sourceKind": "member", "source": "e-1", "reason": "automatic"}
    spec = {"recovery": {"automatic": True, "delay": "1s"}}
    o = ClusterObserved(cluster(quorum_lost_for(600, recovery=failed), **spec), lost(), NOW, None, SURVIVORS)
    step = plan(o)
    assert isinstance(step, planner.QuorumLost)
    assert step.message.endswith("the last rebuild failed; `kustos etcd recover e -n ns` tries again")
    asked = plan(ClusterObserved(o.cluster, lost(), NOW, "auto", SURVIVORS))
    assert asked == StartRebuild(Source("member", "e-1", 52), "approved with kustos etcd recover", 3)


def test_a_rebuild_from_a_member_that_does_not_answer_is_refused_with_why() -> None:
    step = plan(ClusterObserved(cluster(quorum_lost_for(1)), lost(), NOW, "member/e-2", SURVIVORS))
    assert isinstance(step, planner.QuorumLost)
    assert step.refused == "member e-2 does not answer with its data (members that do: e-0, e-1)"


def test_without_a_survivor_the_newest_own_backup_is_the_source_not_another_clusters() -> None:
    backups = (backup("mine", minutes_ago=60, revision=10), backup("theirs", owner="other", minutes_ago=1))
    o = ClusterObserved(cluster(quorum_lost_for(1)), lost(), NOW, "auto", (), backups)
    assert plan(o) == StartRebuild(Source("backup", "mine", 10), "approved with kustos etcd recover", 2)
    named = ClusterObserved(o.cluster, lost(), NOW, "backup/theirs", (), backups)
    assert plan(named) == StartRebuild(Source("backup", "theirs", 40), "approved with kustos etcd recover", 2)


def test_with_nothing_to_rebuild_from_the_lost_quorum_says_so() -> None:
    step = plan(ClusterObserved(cluster(quorum_lost_for(1)), lost(), NOW, None))
    assert isinstance(step, planner.QuorumLost)
    assert step.message.endswith(
        "cannot rebuild: no member answers with its data and the cluster has no succeeded backup"
    )


# ---- a rebuild under way --------------------------------------------------------------------------


def test_a_rebuild_whose_source_cannot_be_read_fails_once_the_old_members_are_fenced() -> None:
    source = Source("backup", "nightly", 9)
    old = (PodView("e-0", 0, uid="u0"),)
    observed = recovery.RecoveryObserved(
        source, 0, 3, None, False, False, old, "EtcdBackup nightly not found"
    )
    assert recovery.plan_recovery(observed) == planner.DeletePod(
        "e-0", "u0", "fenced off: the cluster is being rebuilt", force=False
    )
    fenced = recovery.RecoveryObserved(source, 0, 3, None, False, False, (), "EtcdBackup nightly not found")
    assert recovery.plan_recovery(fenced) == recovery.RecoveryFailed("EtcdBackup nightly not found")
