"""The domain metrics say what each status says: quorum margin, the leader, backups, rollouts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kustos.api.backup import BackupSchedule, EtcdBackup, EtcdBackupSpec, EtcdBackupStatus
from kustos.api.common import Condition
from kustos.api.etcd import EtcdCluster, EtcdClusterSpec, EtcdClusterStatus, MemberStatus
from kustos.api.maintenance import (
    MaintenanceAction,
    MaintenancePolicy,
    MaintenancePolicySpec,
    MaintenancePolicyStatus,
)
from kustos.api.nodeimage import NodeImage, NodeImageSpec, NodeImageStatus
from kustos.api.storage import NodeHealth, StorageCluster, StorageClusterSpec, StorageClusterStatus
from kustos.kubectl_plugin import cluster_rows, member_rows
from kustos.metrics.collector import DomainCollector, Sources, register
from kustos.metrics.facts import etcd_cluster_facts, last_backups, schedule_period
from kustos.runtime.clock import FixedClock
from kustos.runtime.manager import Manager
from kustos.runtime.metrics import Metrics
from kustos.runtime.observations import EtcdObservation, MemberBackend, Observations
from kustos.runtime.times import rfc3339

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _obj(model: Any, name: str, namespace: str | None = "db") -> dict[str, Any]:
    obj: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    obj["metadata"] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return obj


def _member(
    index: int,
    *,
    healthy: bool = True,
    leader: bool = False,
    learner: bool = False,
    down_for: float | None = None,
) -> MemberStatus:
    since = rfc3339(NOW - timedelta(seconds=down_for)) if down_for is not None else None
    return MemberStatus(
        name=f"a-{index}", healthy=healthy, leader=leader, learner=learner, unhealthy_since=since
    )


def _cluster(*members: MemberStatus, **spec: Any) -> dict[str, Any]:
    status = EtcdClusterStatus(phase="Running", members=list(members), current_version="3.6.16", epoch=2)
    spec.setdefault("version", "3.6.16")
    return _obj(EtcdCluster(spec=EtcdClusterSpec(**spec), status=status), "a")


def _backup(name: str, done: datetime, size: int, phase: str = "Succeeded") -> dict[str, Any]:
    status = EtcdBackupStatus(phase=phase, completion_time=rfc3339(done), size=size)  # type: ignore[arg-type]
    return _obj(EtcdBackup(spec=EtcdBackupSpec(cluster_name="a"), status=status), name)


def _scrape(sources: Sources) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(DomainCollector(sources, FixedClock(NOW)))
    generate_latest(registry)  # the exposition renders
    return registry


def _value(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def test_one_member_down_leaves_no_margin_and_names_the_leader() -> None:
    cluster = _cluster(_member(0), _member(1, leader=True), _member(2, healthy=False, down_for=90))
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster]))
    nn = {"namespace": "db", "name": "a"}
    assert _value(registry, "kustos_etcdcluster_desired_members", **nn) == 3
    assert _value(registry, "kustos_etcdcluster_healthy_voters", **nn) == 2
    assert _value(registry, "kustos_etcdcluster_quorum_margin", **nn) == 0
    assert _value(registry, "kustos_etcdcluster_leader_member_index", **nn) == 1
    assert _value(registry, "kustos_etcd_member_unhealthy_seconds", **nn, member="a-2") == 90
    assert _value(registry, "kustos_etcd_member_unhealthy_seconds", **nn, member="a-0") == 0
    assert _value(registry, "kustos_etcdcluster_member_failure_timeout_seconds", **nn) == 60
    assert _value(registry, "kustos_etcdcluster_phase", **nn, phase="Running") == 1
    assert _value(registry, "kustos_etcdcluster_phase", **nn, phase="QuorumLost") == 0
    assert _value(registry, "kustos_etcdcluster_info", **nn, version="3.6.16", desired_version="3.6.16") == 1
    assert _value(registry, "kustos_etcdcluster_rebuilds_total", **nn) == 2


def test_two_members_down_lose_quorum_and_learners_do_not_vote() -> None:
    cluster = _cluster(
        _member(0, leader=False),
        _member(1, healthy=False),
        _member(2, healthy=False),
        _member(3, learner=True),
    )
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster]))
    nn = {"namespace": "db", "name": "a"}
    assert _value(registry, "kustos_etcdcluster_voters", **nn) == 3
    assert _value(registry, "kustos_etcdcluster_learners", **nn) == 1
    assert _value(registry, "kustos_etcdcluster_quorum_margin", **nn) == -1
    assert _value(registry, "kustos_etcdcluster_leader_member_index", **nn) is None  # no leader: no sample


def test_newest_succeeded_backup_and_the_schedule_period() -> None:
    cluster = _cluster(_member(0, leader=True), size=1, backup=BackupSchedule(schedule="0 */6 * * *"))
    backups = [
        _backup("old", NOW - timedelta(hours=7), 100),
        _backup("new", NOW - timedelta(hours=1), 200),
        _backup("failed", NOW, 0, phase="Failed"),
        {**_backup("elsewhere", NOW, 999), "metadata": {"name": "elsewhere", "namespace": "other"}},
    ]
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster], etcd_backups=lambda: backups))
    nn = {"namespace": "db", "name": "a"}
    last = (NOW - timedelta(hours=1)).timestamp()
    assert _value(registry, "kustos_etcdcluster_last_backup_timestamp_seconds", **nn) == last
    assert _value(registry, "kustos_etcdcluster_last_backup_size_bytes", **nn) == 200
    assert _value(registry, "kustos_etcdcluster_backup_interval_seconds", **nn) == 6 * 3600


def test_a_cluster_without_backups_exports_no_backup_age() -> None:
    registry = _scrape(Sources(etcd_clusters=lambda: [_cluster(_member(0, leader=True))]))
    nn = {"namespace": "db", "name": "a"}
    assert _value(registry, "kustos_etcdcluster_last_backup_timestamp_seconds", **nn) is None
    assert _value(registry, "kustos_etcdcluster_backup_interval_seconds", **nn) is None


@pytest.mark.parametrize(
    ("schedule", "seconds"),
    [(BackupSchedule(interval="30m"), 1800), (BackupSchedule(schedule="15 3 * * *"), 86400)],
)
def test_schedule_period(schedule: BackupSchedule, seconds: float) -> None:
    assert schedule_period(schedule, NOW) == seconds


def test_backend_size_quota_alarms_and_leader_changes_from_the_controllers_observation() -> None:
    cluster = _cluster(_member(0, leader=True), _member(1), _member(2))
    seen = Observations()
    backends = tuple(MemberBackend(f"a-{i}", 900, 300, 1000) for i in range(3))
    seen.publish_etcd("db", "a", EtcdObservation(backends, 7, 5, 4, (("a-1", "NOSPACE"),)))
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster], observations=seen))
    nn = {"namespace": "db", "name": "a"}
    assert _value(registry, "kustos_etcd_member_backend_bytes", **nn, member="a-1") == 900
    assert _value(registry, "kustos_etcd_member_backend_in_use_bytes", **nn, member="a-1") == 300
    assert _value(registry, "kustos_etcd_member_backend_quota_bytes", **nn, member="a-1") == 1000
    assert _value(registry, "kustos_etcdcluster_alarm", **nn, member="a-1", alarm="NOSPACE") == 1
    assert _value(registry, "kustos_etcdcluster_leader_changes_total", **nn) == 4
    rows = dict(cluster_rows(etcd_cluster_facts(cluster, {}, NOW, seen.etcd("db", "a")), NOW))
    assert (rows["leader changes"], rows["alarms"]) == ("4", "NOSPACE on a-1")

    seen.forget_etcd("db", "a")  # a process that never observed it (or the cluster is gone)
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster], observations=seen))
    assert _value(registry, "kustos_etcd_member_backend_bytes", **nn, member="a-1") is None
    assert _value(registry, "kustos_etcdcluster_leader_changes_total", **nn) is None


def test_a_cluster_restored_from_a_backup_counts_one_restore_once_formed() -> None:
    cluster = _cluster(_member(0, leader=True), size=1, restore={"backup": "nightly"})
    nn = {"namespace": "db", "name": "a"}
    cluster["status"]["recovery"] = {
        "epoch": 0,
        "phase": "Running",
        "sourceKind": "backup",
        "source": "nightly",
    }
    assert (
        _value(_scrape(Sources(etcd_clusters=lambda: [cluster])), "kustos_etcdcluster_restores_total", **nn)
        == 0
    )
    cluster["status"]["recovery"]["phase"] = "Succeeded"
    cluster["status"]["clusterId"] = "1a2b"
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster]))
    assert _value(registry, "kustos_etcdcluster_restores_total", **nn) == 1
    assert _value(registry, "kustos_etcdcluster_rebuilds_total", **nn) == 2  # status.epoch, its own count
    rows = dict(cluster_rows(etcd_cluster_facts(cluster, {}, NOW), NOW))
    assert rows["rebuilds"] == "2; restored from a backup"


def test_maintenance_counts_what_its_controller_recorded() -> None:
    policy = _obj(MaintenancePolicy(spec=MaintenancePolicySpec()), "default", None)
    seen = Observations()
    seen.count_maintenance("default", "Clear", "Done")
    seen.count_maintenance("default", "Clear", "Done")
    seen.count_maintenance("default", "Purge", "Refused")
    seen.count_purged("default")
    registry = _scrape(Sources(maintenance_policies=lambda: [policy], observations=seen))
    actions = "kustos_maintenance_actions_total"
    assert _value(registry, actions, name="default", action="Clear", outcome="Done") == 2
    assert _value(registry, actions, name="default", action="Purge", outcome="Refused") == 1
    assert _value(registry, "kustos_maintenance_nodes_purged_total", name="default") == 1


def test_the_space_available_condition_raises_the_nospace_alarm() -> None:
    cluster = _cluster(_member(0, leader=True), _member(1), _member(2))
    cluster["status"]["conditions"] = [
        {"type": "SpaceAvailable", "status": "False", "reason": "NoSpace", "message": "NOSPACE",
         "lastTransitionTime": rfc3339(NOW)}
    ]  # fmt: skip
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster]))
    nn = {"namespace": "db", "name": "a"}
    assert _value(registry, "kustos_etcdcluster_alarm", **nn, member="", alarm="NOSPACE") == 1
    cluster["status"]["conditions"][0]["status"] = "True"
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster]))
    assert _value(registry, "kustos_etcdcluster_alarm", **nn, member="", alarm="NOSPACE") is None


def test_node_image_rollout_blocked_reason_is_bounded() -> None:
    condition = Condition(
        type="Degraded",
        status="True",
        reason="ProviderCapacity",
        message="no capacity",
        last_transition_time=rfc3339(NOW),
    )
    status = NodeImageStatus(
        up_to_date=["n1"], outdated=["n2", "n3"], donors=["n4"], pending=["p1"], conditions=[condition]
    )
    image = _obj(NodeImage(spec=NodeImageSpec(image="ami-2"), status=status), "workers", None)
    registry = _scrape(Sources(node_images=lambda: [image]))
    assert _value(registry, "kustos_nodeimage_nodes_total", name="workers") == 4
    assert _value(registry, "kustos_nodeimage_nodes", name="workers", state="outdated") == 2
    assert _value(registry, "kustos_nodeimage_nodes", name="workers", state="pending") == 1
    assert _value(registry, "kustos_nodeimage_blocked", name="workers", reason="Provider") == 1
    assert _value(registry, "kustos_nodeimage_blocked", name="workers", reason="DrainBlocked") == 0


def test_maintenance_refusal_and_storage_nodes() -> None:
    refused = MaintenanceAction(
        time=rfc3339(NOW), node="n1", action="Purge", outcome="Refused", message="quorum"
    )
    policy = _obj(
        MaintenancePolicy(
            spec=MaintenancePolicySpec(),
            status=MaintenancePolicyStatus(dead_nodes=["n1"], last_action=refused, last_refusal=refused),
        ),
        "default",
        None,
    )
    health = {"n1": NodeHealth(ready=True), "n2": NodeHealth(ready=False)}
    storage = _obj(
        StorageCluster(
            spec=StorageClusterSpec(),
            status=StorageClusterStatus(phase="Degraded", node_health_status=health),
        ),
        "s",
    )
    registry = _scrape(Sources(maintenance_policies=lambda: [policy], storage_clusters=lambda: [storage]))
    assert _value(registry, "kustos_maintenance_dead_nodes", name="default") == 1
    assert (
        _value(registry, "kustos_maintenance_refusal_timestamp_seconds", name="default", action="Purge")
        == NOW.timestamp()
    )
    assert _value(registry, "kustos_storagecluster_nodes", namespace="db", name="s") == 2
    assert _value(registry, "kustos_storagecluster_ready_nodes", namespace="db", name="s") == 1


def test_an_unreadable_object_is_left_out_not_fatal() -> None:
    broken = {"metadata": {"name": "x", "namespace": "db"}, "spec": {"size": "many"}}
    good = _cluster(_member(0, leader=True))
    registry = _scrape(Sources(etcd_clusters=lambda: [broken, good]))
    assert _value(registry, "kustos_etcdcluster_members", namespace="db", name="a") == 1
    assert _value(registry, "kustos_etcdcluster_members", namespace="db", name="x") is None


def test_facts_of_a_cluster_not_yet_observed() -> None:
    facts = etcd_cluster_facts(_obj(EtcdCluster(spec=EtcdClusterSpec()), "a"), {}, NOW)
    assert (facts.members, facts.phase, facts.leader) == ((), None, None)


def test_the_plugin_says_what_the_metrics_say() -> None:
    cluster = _cluster(
        _member(0), _member(1, leader=True), _member(2, healthy=False, down_for=120),
        backup=BackupSchedule(interval="30m"),
    )  # fmt: skip
    backups = last_backups([_backup("b", NOW - timedelta(hours=2), 3 * 1024 * 1024)])
    facts = etcd_cluster_facts(cluster, backups, NOW)
    rows = dict(cluster_rows(facts, NOW))
    assert rows["quorum margin"].startswith("0: AT RISK")
    assert rows["leader"] == "a-1 (index 1)"
    assert rows["healthy voters"] == "2/3"
    assert rows["last backup"] == "2h ago, 3.0 MiB (OVERDUE)"
    assert rows["backup schedule"] == "every 30m"
    members = {row[0]: row for row in member_rows(facts)}
    assert members["a-2"][2] == "NO, for 2m (past its failure timeout)"
    assert members["a-1"][3] == "leader"


class _FakeInformer:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items

    def list(self) -> list[dict[str, Any]]:
        return self.items


class _FakeManager:
    """What ``register`` uses of a Manager: its shared informers and its metrics registry."""

    def __init__(self, caches: dict[str, list[dict[str, Any]]]) -> None:
        self.caches = caches
        self.asked: list[str] = []
        self.metrics = Metrics(CollectorRegistry())
        self.observations = Observations()

    def informer(self, ref: Any) -> _FakeInformer:
        self.asked.append(ref.kind)
        return _FakeInformer(self.caches.get(ref.kind, []))


def test_register_reads_only_the_caches_of_the_controllers_that_run() -> None:
    image = _obj(
        NodeImage(spec=NodeImageSpec(image="ami-2"), status=NodeImageStatus(outdated=["n1"])), "w", None
    )
    manager = _FakeManager({"NodeImage": [image], "EtcdCluster": [_cluster(_member(0, leader=True))]})

    register(cast(Manager, manager), ["nodeimage", "nodejob"], FixedClock(NOW))

    assert manager.asked == ["NodeImage"]  # no EtcdCluster watch: its controller does not run
    registry = manager.metrics.registry
    assert _value(registry, "kustos_nodeimage_nodes", name="w", state="outdated") == 1
    assert _value(registry, "kustos_etcdcluster_members", namespace="db", name="a") is None


def test_a_schedule_that_never_produced_a_backup_is_overdue_from_the_clusters_creation() -> None:
    cluster = _cluster(_member(0, leader=True), size=1, backup=BackupSchedule(interval="1h"))
    cluster["metadata"]["creationTimestamp"] = rfc3339(NOW - timedelta(hours=3))
    registry = _scrape(Sources(etcd_clusters=lambda: [cluster]))
    created = (NOW - timedelta(hours=3)).timestamp()
    assert (
        _value(registry, "kustos_etcdcluster_created_timestamp_seconds", namespace="db", name="a") == created
    )
    rows = dict(cluster_rows(etcd_cluster_facts(cluster, {}, NOW), NOW))
    assert rows["last backup"] == "none (OVERDUE)"
