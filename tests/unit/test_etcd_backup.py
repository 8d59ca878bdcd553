"""Backups, the pure part: storage precedence, source member, agent pod, retries, schedule, retention."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kustos.api.backup import BackupStorage, EtcdBackup, PVCStorage, S3Storage
from kustos.api.etcd import EtcdCluster
from kustos.etcd import backup as plan
from kustos.etcd import backup_planner as planner
from kustos.etcd.agent_report import SnapshotResult, parse_error, parse_result
from kustos.etcd.snapshot import DirectoryDestination, to_prune

S3 = {
    "endpoint": "http://127.0.0.1:9000",
    "bucket": "snaps",
    "prefix": "etcd/",
    "credentialsSecret": "s3-creds",
}


def cluster(backup: dict[str, Any] | None = None, members: list[dict[str, Any]] | None = None) -> EtcdCluster:
    spec: dict[str, Any] = {"size": 3}
    if backup is not None:
        spec["backup"] = backup
    return EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "main", "namespace": "prod", "uid": "c1"},
        "spec": spec, "status": {"members": members or []},
    })  # fmt: skip


def backup(name: str = "nightly", labels: dict[str, str] | None = None, **spec: Any) -> EtcdBackup:
    return EtcdBackup.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup",
        "metadata": {"name": name, "namespace": "prod", "uid": "b1", "labels": labels or {}},
        "spec": {"clusterName": "main", **spec},
    })  # fmt: skip


def member(name: str, healthy: bool = True, leader: bool = False, learner: bool = False) -> dict[str, Any]:
    return {"name": name, "clientUrl": f"http://{name}:2379", "healthy": healthy, "leader": leader,
            "learner": learner}  # fmt: skip


def test_storage_precedence_backup_then_schedule_then_default_claim() -> None:
    on_cluster = cluster({"interval": "1h", "storage": {"s3": S3}})
    assert plan.storage_for(backup(storage={"pvc": {"claimName": "mine"}}), on_cluster).pvc == PVCStorage(
        claim_name="mine"
    )
    assert plan.storage_for(backup(), on_cluster).s3 is not None
    default = plan.storage_for(backup(), cluster())
    assert default.pvc is not None and plan.claim_name("main", default.pvc) == "main-backups"


def test_the_snapshot_streams_from_a_healthy_follower() -> None:
    members = [member("main-0", leader=True), member("main-1", healthy=False), member("main-2")]
    assert plan.source_member(cluster(members=members)) == ("main-2", "http://main-2:2379")
    assert plan.source_member(cluster(members=[member("main-0", leader=True)])) == (
        "main-0", "http://main-0:2379",
    )  # fmt: skip
    assert (
        plan.source_member(cluster(members=[member("main-0", healthy=False), member("x", learner=True)]))
        is None
    )


def test_retries_back_off_from_ten_seconds_to_five_minutes() -> None:
    delays = [planner.retry_delay(n).total_seconds() for n in range(1, 8)]
    assert delays == [10, 20, 40, 80, 160, 300, 300]


STARTED = datetime(2026, 11, 23, 12, 0, 1, 250000, tzinfo=UTC)


def test_agent_pod_for_a_claim_saves_with_etcdctl_onto_the_claim_then_verifies() -> None:
    pod = plan.agent_pod(
        backup(), cluster(), BackupStorage(pvc=PVCStorage()), ("main-1", "http://m1:2379"), 2, "img", STARTED
    )
    assert pod["metadata"]["name"] == "nightly-snapshot-2" and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["activeDeadlineSeconds"] == 6 * 3600, "a stalled save is failed, then retried"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "b1"
    [save] = pod["spec"]["initContainers"]
    spooled = "/backups/.incoming_prod_main_nightly.db"  # on the claim: storing is a rename
    assert save.pop("securityContext")["allowPrivilegeEscalation"] is False  # restricted: test_etcd_pods
    assert save == {
        "name": "etcdctl",
        "image": "gcr.io/etcd-development/etcd:v3.7.3",
        "command": [
            "etcdctl",
            "--endpoints=http://m1:2379",
            "--dial-timeout=10s",
            "snapshot",
            "save",
            spooled,
        ],
        "volumeMounts": [{"name": "backups", "mountPath": "/backups"}],
    }
    [container] = pod["spec"]["containers"]
    assert container["command"] == [
        "kustos", "etcd", "snapshot", "--file", spooled, "--name", "nightly", "--cluster", "main",
        "--member", "main-1", "--started", "2026-11-23T12:00:01.250+00:00",
        "--dir", "/backups/prod/main", "--location-prefix", "pvc://main-backups/prod/main",
    ]  # fmt: skip
    assert container["volumeMounts"] == [{"name": "backups", "mountPath": "/backups"}]
    assert pod["spec"]["volumes"] == [
        {"name": "backups", "persistentVolumeClaim": {"claimName": "main-backups"}}
    ]


def test_agent_pod_runs_where_members_may_run() -> None:
    """Its claim is pinned to its node: a restore's seed (a member) must be able to mount it."""
    dedicated = cluster()
    dedicated.spec.pod.node_selector = {"role": "etcd"}
    dedicated.spec.pod.tolerations = [{"key": "role", "operator": "Exists", "effect": "NoSchedule"}]
    pod = plan.placed_like_members(
        plan.agent_pod(
            backup(), dedicated, BackupStorage(pvc=PVCStorage()), ("m", "http://m:2379"), 1, "i", STARTED
        ),
        dedicated,
    )
    assert pod["spec"]["nodeSelector"] == {"role": "etcd"}
    assert pod["spec"]["tolerations"] == [{"key": "role", "operator": "Exists", "effect": "NoSchedule"}]
    anywhere = plan.placed_like_members(
        plan.agent_pod(
            backup(), cluster(), BackupStorage(pvc=PVCStorage()), ("m", "http://m:2379"), 1, "i", STARTED
        ),
        cluster(),
    )
    assert "nodeSelector" not in anywhere["spec"] and "tolerations" not in anywhere["spec"]


def test_agent_pod_for_s3_takes_credentials_from_the_secret_and_keeps_for_the_schedule() -> None:
    scheduled = backup("main-20261122-120000", labels={plan.SCHEDULED_LABEL: "true"})
    storage = BackupStorage(s3=S3Storage.model_validate(S3))
    pod = plan.agent_pod(
        scheduled, cluster({"interval": "1h", "keep": 3}), storage, ("m", "http://m:2379"), 1, "i", STARTED
    )
    [save] = pod["spec"]["initContainers"]
    assert save["command"][-3:] == ["snapshot", "save", "/scratch/main-20261122-120000.db"]
    assert "env" not in save, "etcdctl never sees the bucket's credentials"
    container = pod["spec"]["containers"][0]
    command = container["command"]
    assert command[command.index("--file") + 1] == "/scratch/main-20261122-120000.db"
    assert command[command.index("--s3-prefix") + 1] == "etcd/prod/main"
    assert command[command.index("--keep") + 1] == "3" and "--s3-path-style" in command
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert refs["AWS_ACCESS_KEY_ID"] == {"name": "s3-creds", "key": "accessKeyId"}
    assert refs["AWS_SECRET_ACCESS_KEY"] == {"name": "s3-creds", "key": "secretAccessKey"}
    assert pod["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {}}]
    assert save["volumeMounts"] == container["volumeMounts"] == [{"name": "scratch", "mountPath": "/scratch"}]


def test_etcdctl_uses_the_cluster_version_and_repository() -> None:
    custom = EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "main", "namespace": "prod", "uid": "c1"},
        "spec": {"size": 3, "version": "3.5.35", "repository": "quay.io/coreos/etcd"},
    })  # fmt: skip
    pod = plan.agent_pod(
        backup(), custom, BackupStorage(pvc=PVCStorage()), ("m", "http://m:2379"), 1, "i", STARTED
    )
    assert pod["spec"]["initContainers"][0]["image"] == "quay.io/coreos/etcd:v3.5.35"


def test_the_failure_is_read_from_etcdctl_when_it_did_not_save() -> None:
    def pod(exit_code: int | None) -> dict[str, Any]:
        state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"waiting": {}}
        return {"status": {"phase": "Failed", "initContainerStatuses": [{"name": "etcdctl", "state": state}]}}

    assert plan.failed_container(pod(1)) == plan.SAVE_CONTAINER
    assert plan.failed_container(pod(0)) == plan.AGENT_CONTAINER
    assert plan.failed_container(pod(None)) == plan.AGENT_CONTAINER
    assert plan.failed_container({"status": {"phase": "Failed"}}) == plan.AGENT_CONTAINER


def test_the_schedule_by_interval_and_by_cron() -> None:
    last = datetime(2026, 11, 22, 12, 7, 30, tzinfo=UTC)
    hourly = cluster({"interval": "1h30m"}).spec.backup
    assert hourly is not None and planner.next_scheduled(hourly, last) == last + timedelta(minutes=90)
    cron = cluster({"schedule": "0 */6 * * *"}).spec.backup
    assert cron is not None and planner.next_scheduled(cron, last) == datetime(
        2026, 11, 22, 18, 0, tzinfo=UTC
    )


def test_expired_keeps_the_newest_successes_whatever_fails_and_never_a_running_one() -> None:
    def obj(name: str, created: str, phase: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "creationTimestamp": created}, "status": {"phase": phase}}

    backups = [
        obj("a", "2026-11-22T01:00:00Z", "Succeeded"),
        obj("b", "2026-11-22T02:00:00Z", "Failed"),
        obj("c", "2026-11-22T03:00:00Z", "Succeeded"),
        obj("d", "2026-11-22T04:00:00Z", "Running"),
    ]
    assert planner.expired(backups, 2) == []
    assert [b["metadata"]["name"] for b in planner.expired(backups, 1)] == ["a"]
    failing = [
        *backups,
        obj("e", "2026-11-22T05:00:00Z", "Failed"),
        obj("f", "2026-11-22T06:00:00Z", "Failed"),
    ]
    assert [b["metadata"]["name"] for b in planner.expired(failing, 2)] == ["b"]


def test_retention_prunes_only_this_clusters_scheduled_snapshots() -> None:
    names = [
        "main-20261122-010000.db",
        "main-20261122-020000.db",
        "main-20261122-030000.db",
        "main-before-upgrade.db",
        "other-20261122-000000.db",
        "main-extra-20261122-000000.db",
    ]
    assert to_prune(names, "main", 2) == ["main-20261122-010000.db"]
    assert to_prune(names, "main", 10) == []


def test_result_and_error_lines_round_trip() -> None:
    result = SnapshotResult("s3://b/k.db", "main-1", 42, 1000, "ab" * 32, "t0", "t1", 1.5, ["old.db"])
    log = "starting\n" + result.line() + "\n"
    assert parse_result(log) == result
    assert parse_result("no result") is None
    assert parse_error("x\nKUSTOS_ERROR EtcdError: refused\n") == "EtcdError: refused"


async def test_a_directory_destination_renames_complete_files_and_prunes(tmp_path: Path) -> None:
    root = tmp_path / "prod" / "main"
    destination = DirectoryDestination(root, "pvc://main-backups/prod/main")
    root.mkdir(parents=True)
    for stamp in ("010000", "020000"):
        spooled = root / f"main-20261122-{stamp}.db.part"
        spooled.write_bytes(b"snapshot")
        location = await destination.store(spooled, f"main-20261122-{stamp}.db")
        assert location == f"pvc://main-backups/prod/main/main-20261122-{stamp}.db"
    assert await destination.names() == ["main-20261122-010000.db", "main-20261122-020000.db"]
    await destination.delete(["main-20261122-010000.db"])
    assert sorted(p.name for p in root.iterdir()) == ["main-20261122-020000.db"]
