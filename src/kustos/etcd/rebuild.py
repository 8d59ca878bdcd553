"""Disaster recovery, the observing and acting part (F-ETCD-8): carry a rebuild out step by step.

The EtcdCluster controller starts a rebuild (``cluster_planner.StartRebuild``: quorum lost
and recovery approved or automatic, or ``spec.restore``) and, on every pass while
``status.recovery`` is running, has ``Rebuilder.observe`` look, ``rebuild_step`` choose the
rebuild's next step (``status.Rebuild``) and ``Rebuilder.act`` carry it out; the
controller's one record reports it. The decisions are ``kustos.etcd.recovery``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster, EtcdClusterStatus, RecoveryStatus
from kustos.etcd import planner, recovery
from kustos.etcd.client import EtcdTLS
from kustos.etcd.observe import EtcdView, Observer, seed_answers, skeleton
from kustos.etcd.pods import pod_epoch, submit_pod
from kustos.etcd.recovery import BackupCandidate, Source, Survivor
from kustos.etcd.resources import ETCDCLUSTERS
from kustos.etcd.restore import (
    SnapshotSource,
    backup_source,
    member_source,
    restore_failed,
    restore_seed_pod,
)
from kustos.etcd.status import Rebuild
from kustos.etcd.versions import target_version
from kustos.runtime import objects
from kustos.runtime.api import Api
from kustos.runtime.expectations import Expectations
from kustos.runtime.informer import Informer
from kustos.runtime.resources import PODS
from kustos.runtime.steps import Wait
from kustos.runtime.times import parse_rfc3339

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Event = Callable[..., Awaitable[None]]


def requested_recovery(raw: Obj) -> str | None:
    return objects.annotations(raw).get(recovery.RECOVER_ANNOTATION)


@dataclass(frozen=True)
class RebuildSeen:
    """What a pass of a running rebuild saw: ``recovery.plan_recovery``'s input, and what its
    steps carry (the seed's answer, where the snapshot is read from)."""

    rebuild: RecoveryStatus
    recovery: recovery.RecoveryObserved
    seed_answers: tuple[str, int] | None  # (member name, cluster ID) once the seed leads
    seed_url: str
    where: SnapshotSource | None


def rebuild_step(seen: RebuildSeen) -> Rebuild:
    """The rebuild's next step (``recovery.plan_recovery``), with what carrying it out needs."""
    step = recovery.plan_recovery(seen.recovery)
    if isinstance(step, recovery.CreateRestoreSeed):
        assert seen.where is not None
        return Rebuild(step, seen.rebuild, where=seen.where)
    if isinstance(step, recovery.FinishRecovery):
        assert seen.seed_answers is not None and seen.recovery.seed is not None
        name, cluster_id = seen.seed_answers
        return Rebuild(step, seen.rebuild, seen.recovery.seed, name, cluster_id, seen.seed_url)
    return Rebuild(step, seen.rebuild)


class Rebuilder:
    def __init__(
        self,
        api: Api,
        observer: Observer,
        backups: Informer,
        event: Event,
        agent_image: str,
        expected: Expectations,
    ) -> None:
        self.api = api
        self.observer = observer
        self.backups = backups
        self.event = event
        self.agent_image = agent_image
        self.expected = expected  # the seed it creates, until the pods cache shows it

    # ---- observe -----------------------------------------------------------------------

    def backups_of(self, cluster: EtcdCluster) -> tuple[BackupCandidate, ...]:
        """Succeeded EtcdBackups in the cluster's namespace, every cluster's (a named one may be
        restored anywhere; ``cluster_planner`` picks)."""
        namespace = cluster.metadata["namespace"]
        found = []
        for raw in self.backups.list():
            if objects.namespace(raw) != namespace or (raw.get("status") or {}).get("phase") != "Succeeded":
                continue
            try:
                b = EtcdBackup.model_validate(raw)
            except ValidationError:
                continue
            found.append(BackupCandidate(
                b.metadata["name"], parse_rfc3339(b.status.completion_time if b.status else None),
                (b.status.revision if b.status else None) or 0, b.spec.cluster_name,
            ))  # fmt: skip
        return tuple(found)

    @staticmethod
    def survivors(o: planner.Observed, etcd: EtcdView, client_urls: dict[str, str]) -> tuple[Survivor, ...]:
        """Members of this epoch that answer, with or without a leader, and are not learners."""
        found = []
        for pod in o.pods:
            url = client_urls.get(pod.name)
            answer = etcd.answered.get(url) if url else None
            if url and answer is not None and not answer.is_learner and not pod.deleting:
                found.append(Survivor(pod.name, url, answer.revision, answer.raft_applied_index))
        return tuple(found)

    # ---- observe a running rebuild; its next step -----------------------------------------

    async def observe(self, cluster: EtcdCluster, rebuild: RecoveryStatus, now: datetime) -> RebuildSeen:
        """The new epoch's seed (does it answer?), the old epoch's pods, and where the source's
        snapshot can be read."""
        base = skeleton(cluster, now)
        pods = self.observer.pods_of(cluster)
        views = {
            objects.name(p): (p, v) for p in pods if (v := self.observer.pod_view(cluster, p)) is not None
        }
        new = [(p, v) for p, v in views.values() if pod_epoch(p) == rebuild.epoch]
        old = tuple(v for p, v in views.values() if pod_epoch(p) != rebuild.epoch)
        seed_raw, seed = max(new, key=lambda pv: pv[1].index) if new else (None, None)
        client_tls: EtcdTLS | None = None
        if cluster.spec.tls is not None:
            # The seed waits for its own certificate (issued once it has an IP), like any member.
            certs = await self.observer.certs.reconcile(cluster, [p for p, _ in new], now)
            client_tls = certs.client
        answers: tuple[str, int] | None = None
        url = planner.client_url(base, seed) if seed is not None and not seed.deleting else None
        if url:
            self.observer.remember(cluster, [url])
            answers = await seed_answers(url, client_tls)
        source = Source(rebuild.source_kind, rebuild.source, rebuild.revision)
        status = cluster.status or EtcdClusterStatus()
        where = self._snapshot_source(cluster, source, old, base) if seed is None else None
        observed = recovery.RecoveryObserved(
            source=source, attempts=rebuild.attempts, next_index=status.next_member_index,
            seed=seed, seed_failed=seed_raw is not None and restore_failed(seed_raw, recovery.SEED_FAILURES),
            seed_answers=answers is not None, old_pods=old,
            source_problem=where if isinstance(where, str) else None,
        )  # fmt: skip
        return RebuildSeen(
            rebuild, observed, answers, url or "", where if not isinstance(where, str) else None
        )

    def _snapshot_source(
        self,
        cluster: EtcdCluster,
        source: Source,
        old: tuple[planner.PodView, ...],
        base: planner.Observed,
    ) -> SnapshotSource | str:
        if source.kind == "member":
            pod = next((p for p in old if p.name == source.name), None)
            url = planner.client_url(base, pod) if pod is not None else None
            return member_source(source, url) if url else f"member {source.name} has no address"
        raw = self.backups.get(f"{cluster.metadata['namespace']}/{source.name}")
        if raw is None:
            return f"EtcdBackup {source.name} not found"
        fallback = cluster.spec.backup.storage if cluster.spec.backup else None
        return backup_source(EtcdBackup.model_validate(raw), fallback)

    # ---- act -----------------------------------------------------------------------------

    async def act(self, cluster: EtcdCluster, step: Rebuild) -> float:
        """Carry out the rebuild's step (its progress is the controller's record); when to look again."""
        match step.step:
            case Wait(seconds=seconds):
                return seconds
            case planner.DeletePod(name=pod, uid=uid, reason=reason, force=force):
                namespace = cluster.metadata["namespace"]
                await self.api.delete(PODS, namespace, pod, uid=uid, grace_seconds=0 if force else None)
                await self.observer.certs.forget(cluster, pod)
                await self.event(cluster, "MemberPodDeleted", f"deleted pod {pod}: {reason}")
            case recovery.CreateRestoreSeed(index=index):
                # The attempt and the pod's index were recorded (the step's intent) before this.
                assert step.where is not None
                await self._create_seed(cluster, index, step.rebuild.epoch, step.where)
        return 0.2

    async def consume_request(self, raw: Obj) -> None:
        if requested_recovery(raw) is None:
            return
        patch = {"metadata": {"annotations": {recovery.RECOVER_ANNOTATION: None}}}
        await self.api.patch(ETCDCLUSTERS, objects.namespace(raw), objects.name(raw), patch)

    async def _create_seed(self, cluster: EtcdCluster, index: int, epoch: int, where: SnapshotSource) -> None:
        manifest = restore_seed_pod(cluster, index, target_version(cluster), epoch, where, self.agent_image)
        await submit_pod(self.api, cluster, manifest, self.expected)
        await self.event(
            cluster, "RecoverySeedCreated",
            f"created seed {manifest['metadata']['name']} restoring from {where.description}",
        )  # fmt: skip
