"""Disaster recovery's pure part: which source, when to start, and the rebuild's steps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster
from kustos.etcd import planner, recovery
from kustos.etcd.planner import PodView
from kustos.etcd.pods import EPOCH_LABEL, pod_epoch
from kustos.etcd.recovery import (
    BackupCandidate,
    CreateRestoreSeed,
    FinishRecovery,
    RecoveryFailed,
    RecoveryObserved,
    Source,
    Survivor,
    choose_source,
    parse_request,
    plan_recovery,
    should_start,
)
from kustos.etcd.restore import (
    FETCH_CONTAINER,
    RESTORE_CONTAINER,
    backup_source,
    member_source,
    restore_failed,
    restore_seed_pod,
)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


# ---- the source ---------------------------------------------------------------------------


def test_the_survivor_with_the_newest_data_wins_over_any_backup() -> None:
    survivors = [
        Survivor("e-0", "u0", 120, 130),
        Survivor("e-2", "u2", 140, 150),
        Survivor("e-1", "u1", 140, 149),
    ]
    backups = [BackupCandidate("b", NOW, 500)]
    assert choose_source(survivors, backups) == Source("member", "e-2", 140)


def test_without_a_survivor_the_newest_succeeded_backup() -> None:
    backups = [
        BackupCandidate("old", NOW - timedelta(hours=2), 10),
        BackupCandidate("new", NOW - timedelta(minutes=5), 90),
        BackupCandidate("undated", None, 99),
    ]
    assert choose_source([], backups) == Source("backup", "new", 90)


def test_nothing_to_rebuild_from_is_said_plainly() -> None:
    reason = choose_source([], [])
    assert isinstance(reason, str) and "no succeeded backup" in reason


def test_a_requested_source_is_used_or_refused_with_what_exists() -> None:
    survivors = [Survivor("e-0", "u0", 10), Survivor("e-1", "u1", 20)]
    backups = [BackupCandidate("nightly", NOW, 5)]
    assert choose_source(survivors, backups, ("backup", "nightly")) == Source("backup", "nightly", 5)
    assert choose_source(survivors, backups, ("member", "e-0")) == Source("member", "e-0", 10)
    missing = choose_source(survivors, backups, ("member", "e-7"))
    assert isinstance(missing, str) and "e-0, e-1" in missing
    assert isinstance(choose_source(survivors, backups, ("backup", "weekly")), str)


def test_requests_are_parsed_from_the_annotation() -> None:
    assert parse_request(None) is None
    assert parse_request("auto") == (None, None)
    assert parse_request("backup/nightly-1") == ("backup", "nightly-1")
    assert parse_request("member/e-2") == ("member", "e-2")
    assert parse_request("member/") == (None, None)


def test_automatic_recovery_waits_for_the_delay_and_a_request_does_not() -> None:
    delay = timedelta(seconds=60)
    assert should_start(True, delay, NOW - timedelta(seconds=59), NOW, requested=False) is None
    assert should_start(True, delay, NOW - timedelta(seconds=61), NOW, requested=False)
    assert should_start(False, delay, NOW - timedelta(hours=1), NOW, requested=False) is None
    assert should_start(True, delay, None, NOW, requested=False) is None
    assert should_start(False, delay, None, NOW, requested=True)


# ---- the rebuild --------------------------------------------------------------------------


def pod(name: str, index: int, **kw: Any) -> PodView:
    return PodView(name, index, uid=f"uid-{name}", ip=f"127.1.1.{index + 1}", **kw)


def state(source: Source, old: list[PodView], seed: PodView | None = None, **kw: Any) -> RecoveryObserved:
    values: dict[str, Any] = {"source": source, "attempts": 0, "next_index": 3, "seed": seed,
                              "seed_failed": False, "seed_answers": False,
                              "old_pods": tuple(old)}  # fmt: skip
    values.update(kw)
    return RecoveryObserved(**values)


SURVIVOR = Source("member", "e-2", 40)
BACKUP = Source("backup", "nightly", 30)


def test_the_old_members_are_fenced_before_a_seed_exists_but_never_the_source() -> None:
    old = [pod("e-0", 0), pod("e-1", 1), pod("e-2", 2, running=True)]
    step = plan_recovery(state(SURVIVOR, old))
    assert isinstance(step, planner.DeletePod) and step.name == "e-0"
    old = [pod("e-0", 0, deleting=True), pod("e-1", 1, deleting=True, node_lost=True), pod("e-2", 2)]
    step = plan_recovery(state(SURVIVOR, old))
    assert step == planner.DeletePod("e-1", "uid-e-1", "fenced off: the cluster is being rebuilt", force=True)
    assert isinstance(plan_recovery(state(SURVIVOR, [old[0], old[2]])), planner.Wait)
    assert plan_recovery(state(SURVIVOR, [old[2]])) == CreateRestoreSeed(3)


def test_from_a_backup_everything_old_goes_first() -> None:
    assert isinstance(plan_recovery(state(BACKUP, [pod("e-2", 2)])), planner.DeletePod)
    assert plan_recovery(state(BACKUP, [])) == CreateRestoreSeed(3)


def test_the_seed_is_waited_for_then_the_source_goes_then_it_is_done() -> None:
    seed = pod("e-3", 3)
    assert isinstance(plan_recovery(state(SURVIVOR, [pod("e-2", 2)], seed)), planner.Wait)
    step = plan_recovery(state(SURVIVOR, [pod("e-2", 2)], seed, seed_answers=True))
    assert isinstance(step, planner.DeletePod) and step.name == "e-2"
    assert plan_recovery(state(SURVIVOR, [], seed, seed_answers=True)) == FinishRecovery("e-3")


def test_a_seed_that_cannot_restore_is_replaced_a_few_times_then_the_rebuild_fails() -> None:
    seed = pod("e-3", 3)
    step = plan_recovery(state(BACKUP, [], seed, seed_failed=True, attempts=1))
    assert isinstance(step, planner.DeletePod) and step.name == "e-3"
    assert plan_recovery(state(BACKUP, [], None, attempts=1, next_index=4)) == CreateRestoreSeed(4)
    failed = plan_recovery(state(BACKUP, [], None, attempts=recovery.MAX_SEED_ATTEMPTS))
    assert isinstance(failed, RecoveryFailed)


def test_a_vanished_source_member_fails_the_rebuild_instead_of_guessing() -> None:
    assert isinstance(plan_recovery(state(SURVIVOR, [])), RecoveryFailed)


@given(
    old=st.lists(st.tuples(st.booleans(), st.booleans()), max_size=5),
    seed=st.sampled_from(["none", "starting", "failed", "answers", "deleting"]),
    from_member=st.booleans(),
    attempts=st.integers(0, 4),
)
def test_the_source_is_deleted_only_once_the_seed_answers(
    old: list[tuple[bool, bool]], seed: str, from_member: bool, attempts: int
) -> None:
    old_pods = [pod(f"e-{i}", i, deleting=d, node_lost=lost) for i, (d, lost) in enumerate(old)]
    source = Source("member", old_pods[-1].name) if from_member and old_pods else BACKUP
    seed_pod = None if seed == "none" else pod("e-9", 9, deleting=seed == "deleting")
    step = plan_recovery(state(source, old_pods, seed_pod, seed_failed=seed == "failed",
                               seed_answers=seed == "answers", attempts=attempts))  # fmt: skip
    if isinstance(step, planner.DeletePod) and source.kind == "member" and step.name == source.name:
        assert seed == "answers"
    if isinstance(step, CreateRestoreSeed):
        assert seed == "none" and attempts < recovery.MAX_SEED_ATTEMPTS
        assert all(p.name == source.name for p in old_pods)  # everything else was fenced first
    if isinstance(step, FinishRecovery):
        assert not old_pods and seed == "answers"


# ---- the restoring seed ---------------------------------------------------------------------


def cluster(**spec: Any) -> EtcdCluster:
    return EtcdCluster.model_validate({"metadata": {"name": "e", "namespace": "ns", "uid": "u-1"},
                                       "spec": {"size": 3, "addressing": "podIP", **spec}})  # fmt: skip


def backup(location: str, **status: Any) -> EtcdBackup:
    return EtcdBackup.model_validate({
        "metadata": {"name": "nightly", "namespace": "ns"}, "spec": {"clusterName": "e"},
        "status": {"phase": "Succeeded", "location": location, "sha256": "ab" * 32, "revision": 7, **status},
    })  # fmt: skip


def test_a_seed_restoring_from_a_member_fetches_then_restores_with_bumped_revisions() -> None:
    where = member_source(SURVIVOR, "http://127.1.1.3:2379")
    seed = restore_seed_pod(cluster(), 3, "3.6.16", 2, where, "ghcr.io/kustos/kustos:dev")
    fetch, restore = seed["spec"]["initContainers"]
    # Over gRPC with the etcd image's own etcdctl; restore then checks the SHA-256 trailer.
    assert fetch["name"] == FETCH_CONTAINER and fetch["image"] == "gcr.io/etcd-development/etcd:v3.6.16"
    # A stalled stream fails the fetch (etcdctl bounds a save only when told to); a retry follows.
    assert fetch["command"] == [
        "etcdctl", "--endpoints=http://127.1.1.3:2379", "--dial-timeout=10s", "--command-timeout=300s",
        "snapshot", "save", "/restore/snapshot.db",
    ]  # fmt: skip
    assert fetch["volumeMounts"] == [{"name": "restore", "mountPath": "/restore"}]
    assert restore["name"] == RESTORE_CONTAINER and restore["image"] == "gcr.io/etcd-development/etcd:v3.6.16"
    assert restore["command"] == ["etcdutl"]
    assert "--mark-compacted" in restore["args"]
    assert f"--bump-revision={recovery.BUMP_REVISION}" in restore["args"]
    assert "--initial-cluster-token=u-1-2" in restore["args"]
    etcd_args = seed["spec"]["containers"][0]["args"]
    assert "--initial-cluster-token=u-1-2" in etcd_args and "--initial-cluster-state=new" in etcd_args
    assert pod_epoch(seed) == 2 and seed["metadata"]["labels"][EPOCH_LABEL] == "2"


def test_a_seed_of_a_tls_cluster_saves_from_the_member_with_the_operators_certificate() -> None:
    where = member_source(SURVIVOR, "https://127.1.1.3:2379")
    seed = restore_seed_pod(cluster(tls={}), 0, "3.6.16", 1, where, "img")
    fetch = seed["spec"]["initContainers"][0]
    assert fetch["command"][:2] == ["etcdctl", "--endpoints=https://127.1.1.3:2379"]
    certs = "/etc/etcd/client-tls"
    assert fetch["command"][-6:] == ["--cacert", f"{certs}/ca.crt", "--cert", f"{certs}/tls.crt",
                                     "--key", f"{certs}/tls.key"]  # fmt: skip
    volumes = [v["name"] for v in seed["spec"]["volumes"]]
    assert volumes.count("etcd-client-tls") == 1


def test_a_backup_on_a_claim_is_read_from_the_claim_and_checked() -> None:
    where = backup_source(backup("pvc://e-backups/ns/e/nightly.db"), None)
    assert not isinstance(where, str)
    seed = restore_seed_pod(cluster(), 0, "3.5.35", 0, where, "img")
    fetch = seed["spec"]["initContainers"][0]
    assert fetch["command"][-4:] == ["--file", "/backups/ns/e/nightly.db", "--sha256", "ab" * 32]
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in seed["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["e-backups"]


def test_a_backup_in_s3_needs_its_storage_settings() -> None:
    s3 = {"endpoint": "http://127.0.0.2:9000", "bucket": "bkt", "credentialsSecret": "creds"}
    stored = backup("s3://bkt/kustos/ns/e/nightly.db", storage={"s3": s3})
    where = backup_source(stored, None)
    assert not isinstance(where, str) and where.key == "kustos/ns/e/nightly.db"
    fetch = restore_seed_pod(cluster(), 0, "3.6.16", 0, where, "img")["spec"]["initContainers"][0]
    assert {e["name"] for e in fetch["env"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert isinstance(backup_source(backup("s3://bkt/k.db"), None), str)
    assert isinstance(backup_source(backup("pvc://c/x.db", phase="Failed"), None), str)


def test_a_restore_counts_as_failed_after_repeated_init_failures() -> None:
    def with_init(restarts: int, code: int) -> dict[str, Any]:
        terminated = {"terminated": {"exitCode": code}}
        return {"status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "fetch-snapshot", "restartCount": restarts, "lastState": terminated}]}}  # fmt: skip

    assert not restore_failed(with_init(1, 1), 2)
    assert restore_failed(with_init(2, 1), 2)
    assert not restore_failed(with_init(5, 0), 2)
    assert restore_failed({"status": {"phase": "Failed"}}, 2)
