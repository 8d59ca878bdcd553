"""A prometheus-client Collector that turns the cached objects into the domain metrics at scrape
time: reading the informers' caches costs no API or etcd call, and the figures are exactly what
the last reconcile recorded in each status, plus what the controllers observed and keep out of
status on purpose (``runtime.observations``: backend sizes, alarms, leader changes, maintenance
counts; only the leading replica has them). Every replica exports the rest (a standby's caches
are warm), so rules aggregate with ``max by``; docs/metrics.md lists every metric."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import ValidationError

from kustos.api import refs
from kustos.api.etcd import EtcdClusterStatus
from kustos.metrics.facts import (
    BLOCKED_REASONS,
    EtcdClusterFacts,
    MaintenanceFacts,
    NodeImageFacts,
    Obj,
    StorageClusterFacts,
    etcd_cluster_facts,
    last_backups,
    maintenance_facts,
    node_image_facts,
    storage_cluster_facts,
)
from kustos.runtime.clock import Clock, SystemClock
from kustos.runtime.manager import Manager
from kustos.runtime.observations import Observations
from kustos.runtime.refs import ResourceRef

log = logging.getLogger(__name__)

Source = Callable[[], Iterable[Obj]]

ETCD_PHASES: tuple[str, ...] = get_args(get_args(EtcdClusterStatus.model_fields["phase"].annotation)[0])
NODE_STATES = ("up_to_date", "outdated", "replacing", "pending", "invalid")

# The observed figures (``runtime.observations``), which only the leading replica exports and
# ``kubectl kustos status`` reads back from it (``metrics.scraped``): one spelling for both.
LEADER_CHANGES = "kustos_etcdcluster_leader_changes"
ALARM = "kustos_etcdcluster_alarm"
BACKEND_BYTES = "kustos_etcd_member_backend_bytes"
BACKEND_IN_USE_BYTES = "kustos_etcd_member_backend_in_use_bytes"
BACKEND_QUOTA_BYTES = "kustos_etcd_member_backend_quota_bytes"

_NN = ["namespace", "name"]
_MEMBER = ["namespace", "name", "member"]


def _none() -> Iterable[Obj]:
    return ()


@dataclass
class Sources:
    """Where the collector reads each kind: an informer's cache, or nothing (its controller is off)."""

    etcd_clusters: Source = _none
    etcd_backups: Source = _none
    node_images: Source = _none
    maintenance_policies: Source = _none
    storage_clusters: Source = _none
    observations: Observations = field(default_factory=Observations)
    """What the controllers of this process observed (empty where they do not run)."""


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _facts(kind: str, objs: Iterable[Obj], make: Callable[[Obj], Any]) -> list[Any]:
    """Facts of every object; one that does not parse (a stale CRD version) is left out, not fatal."""
    found = []
    for obj in objs:
        try:
            found.append(make(obj))
        except (ValidationError, ValueError) as err:
            log.debug("metrics: %s %s unreadable: %s", kind, obj.get("metadata", {}).get("name"), err)
    return found


def etcd_metrics(clusters: Sequence[EtcdClusterFacts]) -> Iterator[Metric]:
    def per_cluster(name: str, doc: str, value: Callable[[EtcdClusterFacts], float | None]) -> Metric:
        family = _gauge(name, doc, _NN)
        for c in clusters:
            v = value(c)
            if v is not None:
                family.add_metric([c.namespace, c.name], v)
        return family

    yield per_cluster(
        "kustos_etcdcluster_desired_members", "Members asked for (spec.size)", lambda c: c.desired_size
    )
    yield per_cluster(
        "kustos_etcdcluster_members",
        "Members in the etcd membership, healthy or not",
        lambda c: len(c.members),
    )
    yield per_cluster("kustos_etcdcluster_voters", "Voting members (not learners)", lambda c: c.voters)
    yield per_cluster(
        "kustos_etcdcluster_healthy_voters", "Voting members that answered", lambda c: c.healthy_voters
    )
    yield per_cluster("kustos_etcdcluster_learners", "Learners, still catching up", lambda c: c.learners)
    yield per_cluster(
        "kustos_etcdcluster_quorum_margin",
        "Healthy voters beyond quorum: 0 means one more failure loses quorum; below 0 it is lost",
        lambda c: c.quorum_margin,
    )
    yield per_cluster(
        "kustos_etcdcluster_leader_member_index",
        "The member index (pod <cluster>-<index>) of the raft leader; absent without a leader",
        lambda c: c.leader.index if c.leader else None,
    )
    yield per_cluster(
        "kustos_etcdcluster_member_failure_timeout_seconds",
        "spec.memberFailureTimeout: how long a member may be unhealthy before it is replaced",
        lambda c: c.member_failure_timeout_seconds,
    )
    yield per_cluster(
        "kustos_etcdcluster_recovering", "1 while a disaster recovery runs", lambda c: int(c.recovering)
    )
    yield per_cluster(
        "kustos_etcdcluster_backup_interval_seconds",
        "The period of scheduled backups; absent without a schedule",
        lambda c: c.backup_interval_seconds,
    )
    yield per_cluster(
        "kustos_etcdcluster_last_backup_timestamp_seconds",
        "Completion time of the newest succeeded EtcdBackup (Unix seconds)",
        lambda c: c.last_backup_time.timestamp() if c.last_backup_time else None,
    )
    yield per_cluster(
        "kustos_etcdcluster_created_timestamp_seconds",
        "metadata.creationTimestamp (Unix seconds): a schedule's first backup is due from it",
        lambda c: c.created.timestamp() if c.created else None,
    )
    yield per_cluster(
        "kustos_etcdcluster_last_backup_size_bytes",
        "Size of the newest succeeded EtcdBackup",
        lambda c: c.last_backup_size if c.last_backup_time else None,
    )

    rebuilds = CounterMetricFamily(
        "kustos_etcdcluster_rebuilds", "Disaster recoveries (status.epoch)", labels=_NN
    )
    restores = CounterMetricFamily(
        "kustos_etcdcluster_restores",
        "1 once a cluster created from a backup (spec.restore) formed",
        labels=_NN,
    )
    changes = CounterMetricFamily(
        LEADER_CHANGES,
        "Leader changes (raft term increases) since this operator began observing the cluster",
        labels=_NN,
    )
    info = _gauge(
        "kustos_etcdcluster_info",
        "1, with the running and the desired etcd version",
        [*_NN, "version", "desired_version"],
    )
    phase = _gauge(
        "kustos_etcdcluster_phase", "1 for the cluster's current phase, 0 for the others", [*_NN, "phase"]
    )
    degraded = _gauge(
        "kustos_etcdcluster_degraded",
        "1 while the Degraded condition is True, by its reason",
        [*_NN, "reason"],
    )
    alarm = _gauge(
        ALARM,
        "1 for each alarm raised on a member (NOSPACE, CORRUPT)",
        [*_NN, "member", "alarm"],
    )
    healthy = _gauge(
        "kustos_etcd_member_healthy", "1 when the member answered its last status request", _MEMBER
    )
    learner = _gauge("kustos_etcd_member_learner", "1 while the member is a learner", _MEMBER)
    unhealthy = _gauge(
        "kustos_etcd_member_unhealthy_seconds", "How long the member has been unhealthy", _MEMBER
    )
    backend = _gauge(BACKEND_BYTES, "The member's database file size", _MEMBER)
    in_use = _gauge(
        BACKEND_IN_USE_BYTES,
        "The part of the database file holding data (the rest a defragmentation gives back)",
        _MEMBER,
    )
    quota = _gauge(BACKEND_QUOTA_BYTES, "The member's backend quota", _MEMBER)
    for c in clusters:
        nn = [c.namespace, c.name]
        rebuilds.add_metric(nn, c.rebuilds)
        restores.add_metric(nn, int(c.restored))
        if c.leader_changes is not None:
            changes.add_metric(nn, c.leader_changes)
        info.add_metric([*nn, c.version or "", c.desired_version], 1)
        for p in ETCD_PHASES:
            phase.add_metric([*nn, p], int(c.phase == p))
        if c.degraded:
            degraded.add_metric([*nn, c.degraded], 1)
        for member, raised in c.alarms:
            alarm.add_metric([*nn, member, raised], 1)
        for m in c.members:
            labels = [*nn, m.name]
            healthy.add_metric(labels, int(m.healthy))
            learner.add_metric(labels, int(m.learner))
            unhealthy.add_metric(labels, m.unhealthy_seconds)
            if m.backend_bytes is not None:
                backend.add_metric(labels, m.backend_bytes)
            if m.backend_in_use_bytes is not None:
                in_use.add_metric(labels, m.backend_in_use_bytes)
            if m.backend_quota_bytes is not None:
                quota.add_metric(labels, m.backend_quota_bytes)
    yield from (rebuilds, restores, changes, info, phase, degraded, alarm)
    yield from (healthy, learner, unhealthy, backend, in_use, quota)


def node_image_metrics(images: Sequence[NodeImageFacts]) -> Iterator[Metric]:
    nodes = _gauge(
        "kustos_nodeimage_nodes", "Nodes of the NodeImage's groups, by rollout state", ["name", "state"]
    )
    total = _gauge(
        "kustos_nodeimage_nodes_total", "Nodes the rollout covers (up to date, outdated, replacing)", ["name"]
    )
    blocked = _gauge(
        "kustos_nodeimage_blocked",
        "1 for the reason the rollout cannot move by itself (bounded set), 0 for the others",
        ["name", "reason"],
    )
    for i in images:
        counts = dict(
            zip(NODE_STATES, (i.up_to_date, i.outdated, i.replacing, i.pending, i.invalid), strict=True)
        )
        for state, count in counts.items():
            nodes.add_metric([i.name, state], count)
        total.add_metric([i.name], i.total)
        for reason in BLOCKED_REASONS:
            blocked.add_metric([i.name, reason], int(i.blocked == reason))
    yield from (nodes, total, blocked)


def maintenance_metrics(policies: Sequence[MaintenanceFacts]) -> Iterator[Metric]:
    dead = _gauge("kustos_maintenance_dead_nodes", "Nodes past their toleration or fenced", ["name"])
    last = _gauge(
        "kustos_maintenance_last_action_timestamp_seconds",
        "When the newest action happened, with what it was and its outcome",
        ["name", "action", "outcome"],
    )
    refusal = _gauge(
        "kustos_maintenance_refusal_timestamp_seconds",
        "When the outstanding refusal happened (absent once a later action succeeds)",
        ["name", "action"],
    )
    actions = CounterMetricFamily(
        "kustos_maintenance_actions",
        "Actions recorded (Clear, Uncordon, ForceDeletePod, ReleaseClaim, Purge steps) by outcome"
        " (Done, Refused), since this operator started",
        labels=["name", "action", "outcome"],
    )
    purged = CounterMetricFamily(
        "kustos_maintenance_nodes_purged",
        "Nodes whose purge finished (Node deleted), since this operator started",
        labels=["name"],
    )
    for p in policies:
        dead.add_metric([p.name], p.dead_nodes)
        if p.last_action:
            action, outcome, moment = p.last_action
            last.add_metric([p.name, action, outcome], moment.timestamp())
        if p.refusal:
            refusal.add_metric([p.name, p.refusal[0]], p.refusal[1].timestamp())
        for (action, outcome), count in sorted(p.counts.items()):
            actions.add_metric([p.name, action, outcome], count)
        purged.add_metric([p.name], p.purged)
    yield from (dead, last, refusal, actions, purged)


@cache
def storage_phases() -> tuple[str, ...]:
    """A StorageCluster's phases, read from its model once the first one is exported (its
    models are built when its family loads, not by every operator: issue 28)."""
    from kustos.api.storage import StorageClusterStatus

    phases: tuple[str, ...] = get_args(get_args(StorageClusterStatus.model_fields["phase"].annotation)[0])
    return phases


def storage_metrics(clusters: Sequence[StorageClusterFacts]) -> Iterator[Metric]:
    nodes = _gauge("kustos_storagecluster_nodes", "Nodes the StorageCluster runs on", _NN)
    ready = _gauge("kustos_storagecluster_ready_nodes", "Nodes whose storage pod is ready", _NN)
    phase = _gauge(
        "kustos_storagecluster_phase", "1 for the current phase, 0 for the others", [*_NN, "phase"]
    )
    for s in clusters:
        nn = [s.namespace, s.name]
        nodes.add_metric(nn, s.nodes)
        ready.add_metric(nn, s.ready_nodes)
        for p in storage_phases():
            phase.add_metric([*nn, p], int(s.phase == p))
    yield from (nodes, ready, phase)


class DomainCollector(Collector):
    """Reads ``sources`` on each scrape; a kind whose controller is not running exports nothing."""

    def __init__(self, sources: Sources, clock: Clock | None = None) -> None:
        self.sources = sources
        self.clock = clock or SystemClock()

    def collect(self) -> Iterable[Metric]:
        now = self.clock.now()
        backups = last_backups(self.sources.etcd_backups())
        seen = self.sources.observations

        def etcd(o: Obj) -> EtcdClusterFacts:
            return etcd_cluster_facts(
                o, backups, now, seen.etcd(o["metadata"].get("namespace", ""), o["metadata"]["name"])
            )

        def maintenance(o: Obj) -> MaintenanceFacts:
            return maintenance_facts(o, seen.maintenance(o["metadata"]["name"]))

        yield from etcd_metrics(_facts("EtcdCluster", self.sources.etcd_clusters(), etcd))
        yield from node_image_metrics(_facts("NodeImage", self.sources.node_images(), node_image_facts))
        yield from maintenance_metrics(
            _facts("MaintenancePolicy", self.sources.maintenance_policies(), maintenance)
        )
        yield from storage_metrics(
            _facts("StorageCluster", self.sources.storage_clusters(), storage_cluster_facts)
        )

    def describe(self) -> Iterable[Metric]:
        """The families without samples, so registering needs no scrape (auto_describe)."""
        return list(self._empty())

    def _empty(self) -> Iterator[Metric]:
        yield from etcd_metrics(())
        yield from node_image_metrics(())
        yield from maintenance_metrics(())
        yield from storage_metrics(())


def register(manager: Manager, controllers: Iterable[str], clock: Clock | None = None) -> DomainCollector:
    """Export the domain metrics of the kinds whose controllers run, from their shared informers
    (the same caches, so no extra watch), on the manager's /metrics."""
    chosen = set(controllers)
    sources = Sources(observations=manager.observations)

    def from_informer(ref: ResourceRef) -> Source:
        return manager.informer(ref).list

    if "etcdcluster" in chosen:
        sources.etcd_clusters = from_informer(refs.ETCD_CLUSTERS)
        sources.etcd_backups = from_informer(refs.ETCD_BACKUPS)  # watched by the etcdcluster controller
    if "nodeimage" in chosen:
        sources.node_images = from_informer(refs.NODE_IMAGES)
    if "maintenance" in chosen:
        sources.maintenance_policies = from_informer(refs.MAINTENANCE_POLICIES)
    if "storagecluster" in chosen:
        sources.storage_clusters = from_informer(refs.STORAGE_CLUSTERS)
    collector = DomainCollector(sources, clock)
    manager.metrics.registry.register(collector)
    return collector
