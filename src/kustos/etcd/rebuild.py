"""Disaster recovery, the acting part (F-ETCD-8): start a rebuild, carry it out step by step.

The EtcdCluster controller hands a cluster over to ``Rebuilder`` when it has lost
quorum (and recovery is approved or automatic), when ``spec.restore`` asks for a new
cluster from a backup, and on every pass while ``status.recovery`` is running. The
decisions are ``kustos.etcd.recovery``'s; this module observes, acts and records.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from kustos.api.backup import EtcdBackup
from kustos.api.etcd import EtcdCluster, EtcdClusterStatus, MemberStatus, RecoveryStatus
from kustos.etcd import planner, recovery
from kustos.etcd.client import EtcdClient, EtcdError, EtcdTLS
from kustos.etcd.pods import CLUSTER_LABEL, EPOCH_LABEL, pod_epoch
from kustos.etcd.recovery import BackupCandidate, Source, Survivor
from kustos.etcd.restore import (
    SnapshotSource,
    backup_source,
    member_source,
    restore_failed,
    restore_seed_pod,
)
from kustos.runtime import faults
from kustos.runtime.conditions import set_condition
from kustos.runtime.resources import PODS
from kustos.runtime.times import parse_rfc3339, rfc3339

if TYPE_CHECKING:
    from kustos.etcd.controller import EtcdClusterReconciler, EtcdView

log = logging.getLogger(__name__)

Obj = dict[str, Any]
STATUS_TIMEOUT = 2.0


def requested_recovery(raw: Obj) -> str | None:
    return ((raw.get("metadata") or {}).get("annotations") or {}).get(recovery.RECOVER_ANNOTATION)


class Rebuilder:
    def __init__(self, reconciler: EtcdClusterReconciler, agent_image: str) -> None:
        self.r = reconciler
        self.api = reconciler.api
        self.agent_image = agent_image

    # ---- observe -----------------------------------------------------------------------

    def backups_of(self, cluster: EtcdCluster, any_cluster: bool = False) -> list[EtcdBackup]:
        """Succeeded EtcdBackups in the cluster's namespace: its own (scheduled or on demand),
        or with ``any_cluster`` every cluster's (a named one may be restored anywhere)."""
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        found = []
        for raw in self.r.backups.list():
            if raw["metadata"].get("namespace") != namespace:
                continue
            if not any_cluster and (raw.get("spec") or {}).get("clusterName") != name:
                continue
            if (raw.get("status") or {}).get("phase") != "Succeeded":
                continue
            try:
                found.append(EtcdBackup.model_validate(raw))
            except ValidationError:
                continue
        return found

    def candidates(self, backups: list[EtcdBackup]) -> list[BackupCandidate]:
        return [
            BackupCandidate(
                b.metadata["name"],
                parse_rfc3339(b.status.completion_time if b.status else None),
                (b.status.revision if b.status else None) or 0,
            )
            for b in backups
        ]

    @staticmethod
    def survivors(o: planner.Observed, etcd: EtcdView, client_urls: dict[str, str]) -> list[Survivor]:
        """Members of this epoch that answer, with or without a leader, and are not learners."""
        found = []
        for pod in o.pods:
            url = client_urls.get(pod.name)
            answer = etcd.answered.get(url) if url else None
            if url and answer is not None and not answer.is_learner and not pod.deleting:
                found.append(Survivor(pod.name, url, answer.revision, answer.raft_applied_index))
        return found

    # ---- start ---------------------------------------------------------------------------

    def choose(
        self, cluster: EtcdCluster, o: planner.Observed, etcd: EtcdView, client_urls: dict[str, str],
        request: str | None,
    ) -> Source | str:  # fmt: skip
        kind, name = recovery.parse_request(request) or (None, None)
        survivors = self.survivors(o, etcd, client_urls)
        backups = self.candidates(self.backups_of(cluster, any_cluster=kind == "backup"))
        return recovery.choose_source(survivors, backups, (kind, name))

    async def start(self, raw: Obj, cluster: EtcdCluster, source: Source, reason: str, epoch: int) -> None:
        """Record the rebuild in status (the one step of this pass) and consume the request."""
        status = dict(raw.get("status") or {})
        # With nulls: they clear what an earlier rebuild left (completedAt) in a merge patch.
        status["recovery"] = RecoveryStatus(
            epoch=epoch,
            source_kind=source.kind,
            source=source.name,
            revision=source.revision,
            reason=reason,
            started_at=rfc3339(datetime.now(UTC)),
            message=f"rebuilding from {source.describe()}",
        ).model_dump(by_alias=True)
        status["phase"] = "Recovering"
        updated = await self.api.replace_status(self.r.resource, raw, status)
        raw["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]
        await self.consume_request(raw)
        await self.r.event(
            cluster,
            "RecoveryStarted",
            f"rebuilding the cluster from {source.describe()} ({reason})",
            warning=True,
        )

    async def consume_request(self, raw: Obj) -> None:
        if requested_recovery(raw) is None:
            return
        patch = {"metadata": {"annotations": {recovery.RECOVER_ANNOTATION: None}}}
        meta = raw["metadata"]
        await self.api.patch(self.r.resource, meta["namespace"], meta["name"], patch)

    # ---- carry on --------------------------------------------------------------------------

    async def reconcile(self, raw: Obj, cluster: EtcdCluster, rebuild: RecoveryStatus) -> float:
        """One step of a running rebuild; returns when to look again."""
        if requested_recovery(raw) is not None:
            await self.consume_request(raw)
            await self.r.event(cluster, "RecoveryInProgress", "a rebuild is already under way", warning=True)
        namespace = cluster.metadata["namespace"]
        skeleton = self.r.skeleton(cluster)
        pods = self.r.pods_of(cluster)
        views = {
            p["metadata"]["name"]: (p, v) for p in pods if (v := self.r.pod_view(cluster, p)) is not None
        }
        new = [(p, v) for p, v in views.values() if pod_epoch(p) == rebuild.epoch]
        old = tuple(v for p, v in views.values() if pod_epoch(p) != rebuild.epoch)
        seed_raw, seed = max(new, key=lambda pv: pv[1].index) if new else (None, None)
        client_tls: EtcdTLS | None = None
        if cluster.spec.tls is not None:
            # The seed waits for its own certificate (issued once it has an IP), like any member.
            certs = await self.r.certs.reconcile(cluster, [p for p, _ in new], datetime.now(UTC))
            client_tls = certs.client
        answers: tuple[str, int] | None = None
        if seed is not None and not seed.deleting:
            url = planner.client_url(skeleton, seed)
            answers = await self._seed_answers(url, client_tls) if url else None
        source = Source(rebuild.source_kind, rebuild.source, rebuild.revision)
        status = cluster.status or EtcdClusterStatus()
        observed = recovery.RecoveryObserved(
            source=source, attempts=rebuild.attempts, next_index=status.next_member_index,
            seed=seed, seed_failed=seed_raw is not None and restore_failed(seed_raw, recovery.SEED_FAILURES),
            seed_answers=answers is not None, old_pods=old,
        )  # fmt: skip
        step = recovery.plan_recovery(observed)
        if not isinstance(step, planner.Wait):
            log.info("step: %s", step)
        requeue = 0.2
        match step:
            case planner.Wait(seconds=seconds):
                requeue = seconds
            case planner.DeletePod(name=pod, uid=uid, reason=reason, force=force):
                await self.api.delete(PODS, namespace, pod, uid=uid, grace_seconds=0 if force else None)
                await self.r.certs.forget(cluster, pod)
                await self.r.event(cluster, "MemberPodDeleted", f"deleted pod {pod}: {reason}")
            case recovery.CreateRestoreSeed(index=index):
                where = self._snapshot_source(cluster, source, old, skeleton)
                if isinstance(where, str):
                    step = recovery.RecoveryFailed(where)
                else:
                    # Intent first: the attempt and the pod's index are recorded before the pod
                    # exists, so a restarted operator neither reuses the name nor loses count.
                    rebuild.attempts += 1
                    rebuild.message = planner_message(step)
                    await self._write(raw, cluster, rebuild, next_index=index + 1)
                    await self._create_seed(cluster, index, rebuild, where)
                    faults.exit_after(type(step).__name__)
                    return requeue
            case recovery.FinishRecovery():
                assert answers is not None and seed is not None
                await self._finish(raw, cluster, rebuild, seed, answers, skeleton)
                return 0.2
        if isinstance(step, recovery.RecoveryFailed):
            rebuild.phase = "Failed"
            rebuild.completed_at = rfc3339(datetime.now(UTC))
            await self.r.event(cluster, "RecoveryFailed", step.message, warning=True)
        rebuild.message = planner_message(step)
        await self._write(raw, cluster, rebuild)
        faults.exit_after(type(step).__name__)
        return requeue

    async def _seed_answers(self, url: str, tls: EtcdTLS | None) -> tuple[str, int] | None:
        """(member name, cluster ID) once the seed leads a one-member cluster."""
        try:
            async with EtcdClient(url, tls, timeout=STATUS_TIMEOUT) as client:
                status = await client.status()
                members = await client.member_list()
        except (EtcdError, OSError, TimeoutError):
            return None
        if status.errors or not status.is_leader or len(members.members) != 1:
            return None
        return members.members[0].name, members.cluster_id

    def _snapshot_source(
        self,
        cluster: EtcdCluster,
        source: Source,
        old: tuple[planner.PodView, ...],
        skeleton: planner.Observed,
    ) -> SnapshotSource | str:
        if source.kind == "member":
            pod = next((p for p in old if p.name == source.name), None)
            url = planner.client_url(skeleton, pod) if pod is not None else None
            return member_source(source, url) if url else f"member {source.name} has no address"
        raw = self.r.backups.get(f"{cluster.metadata['namespace']}/{source.name}")
        if raw is None:
            return f"EtcdBackup {source.name} not found"
        fallback = cluster.spec.backup.storage if cluster.spec.backup else None
        return backup_source(EtcdBackup.model_validate(raw), fallback)

    async def _create_seed(
        self, cluster: EtcdCluster, index: int, rebuild: RecoveryStatus, where: SnapshotSource
    ) -> None:
        version = self.r.target_version(cluster)
        manifest = restore_seed_pod(cluster, index, version, rebuild.epoch, where, self.agent_image)
        await self.r.submit_pod(cluster, manifest)
        await self.r.event(
            cluster, "RecoverySeedCreated",
            f"created seed {manifest['metadata']['name']} restoring from {where.description}",
        )  # fmt: skip

    async def _finish(
        self, raw: Obj, cluster: EtcdCluster, rebuild: RecoveryStatus, seed: planner.PodView,
        answers: tuple[str, int], skeleton: planner.Observed,
    ) -> None:  # fmt: skip
        member_name, cluster_id = answers
        url = planner.client_url(skeleton, seed) or ""
        status = EtcdClusterStatus.model_validate(raw.get("status") or {})
        rebuild.phase = "Succeeded"
        rebuild.completed_at = rfc3339(datetime.now(UTC))
        rebuild.message = (
            f"rebuilt from {Source(rebuild.source_kind, rebuild.source, rebuild.revision).describe()}"
        )
        status.recovery = rebuild
        status.epoch = rebuild.epoch
        status.cluster_id = f"{cluster_id:x}"
        member = MemberStatus(
            name=member_name or seed.name, pod=seed.name, client_url=url, healthy=True, leader=True
        )
        status.members = [member]
        status.size = 1
        status.ready = f"1/{cluster.spec.size}"
        status.phase = "Scaling" if cluster.spec.size > 1 else "Running"
        payload = status.model_dump(by_alias=True, exclude_none=True)
        payload["conditions"] = _conditions(raw, rebuild, done=True)
        await self.api.replace_status(self.r.resource, raw, payload)
        message = f"{rebuild.message}; growing back to {cluster.spec.size} members"
        if cluster.spec.storage.type == "pvc":
            older = f"{CLUSTER_LABEL}={cluster.metadata['name']},{EPOCH_LABEL}!={rebuild.epoch}"
            message += (
                "; the volumes of the members before it are kept (they may hold newer writes): "
                f"kubectl delete pvc -l {older} once they are not needed"
            )
        await self.r.event(cluster, "Recovered", message)

    async def _write(
        self, raw: Obj, cluster: EtcdCluster, rebuild: RecoveryStatus, next_index: int | None = None
    ) -> None:
        """Record the rebuild's progress; a conflict fails the pass (it is retried), so nothing
        is acted on that was not recorded."""
        status = dict(raw.get("status") or {})
        # With nulls: a merge patch only clears a field (completedAt of an earlier rebuild) sent as null.
        status["recovery"] = rebuild.model_dump(by_alias=True)
        status["phase"] = "Failed" if rebuild.phase == "Failed" else "Recovering"
        if next_index is not None:
            status["nextMemberIndex"] = max(int(status.get("nextMemberIndex") or 0), next_index)
        status["conditions"] = _conditions(raw, rebuild, done=False)
        compact = {**status, "recovery": rebuild.model_dump(by_alias=True, exclude_none=True)}
        if compact != (raw.get("status") or {}):
            updated = await self.api.replace_status(self.r.resource, raw, status)
            raw["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]
            raw["status"] = updated.get("status") or {}


def planner_message(step: object) -> str:
    match step:
        case planner.Wait(reason=reason):
            return reason
        case recovery.RecoveryFailed(message=message):
            return message
        case planner.DeletePod(name=name, reason=reason):
            return f"deleting pod {name}: {reason}"
        case recovery.CreateRestoreSeed(index=index):
            return f"starting seed member {index}"
    return str(step)


def _conditions(raw: Obj, rebuild: RecoveryStatus, done: bool) -> list[Obj]:
    generation = raw["metadata"].get("generation")
    conditions = (raw.get("status") or {}).get("conditions")
    message = rebuild.message or ""
    failed = rebuild.phase == "Failed"
    conditions = set_condition(conditions, "Available", done, "Recovered" if done else "Recovering",
                               message, generation)  # fmt: skip
    conditions = set_condition(conditions, "Progressing", not failed, "Recovering", message, generation)
    reason = "RecoveryFailed" if failed else "Recovered" if done else "Recovering"
    return set_condition(conditions, "Degraded", not done, reason, message, generation)
