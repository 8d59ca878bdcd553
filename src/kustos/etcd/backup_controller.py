"""EtcdBackup and backup schedules: run one agent pod per attempt, record what it reports.

Both are ``FamilyReconciler``s; their planners are ``backup_planner``'s. The EtcdBackup's
status is the whole state machine, and each attempt's pod is named after its number, so
a restarted operator picks up exactly where the last one stopped. Failures are retried
with backoff and never touch the cluster: the agent only reads a member's snapshot.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.backup import EtcdBackup, EtcdBackupStatus
from kustos.api.etcd import EtcdCluster
from kustos.etcd import backup as manifests
from kustos.etcd import backup_planner as planner
from kustos.etcd.agent_report import parse_error, parse_result
from kustos.etcd.backup_planner import Agent, BackupStep, Observed, ScheduleObserved, ScheduleStep, Source
from kustos.etcd.pods import CLUSTER_LABEL
from kustos.etcd.resources import ETCDBACKUPS, ETCDCLUSTERS
from kustos.etcd.snapshot import scheduled_name
from kustos.etcd.stuck import classify, volume_stuck
from kustos.images import configured_agent_image
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller, label_keys, status_matters
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import WARNING
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note
from kustos.runtime.resources import CLAIMS, PODS
from kustos.runtime.times import parse_rfc3339

log = logging.getLogger(__name__)

Obj = dict[str, Any]


class EtcdBackupReconciler(FamilyReconciler[EtcdBackup, Observed, BackupStep]):
    model = EtcdBackup
    failure_condition = planner.SUCCEEDED
    failure_status = False
    announce = ()  # the steps say what happened (BackupStarted, BackupSucceeded ...), once

    def __init__(self, manager: Manager, image: str, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.image = image
        self.clusters = manager.informer(ETCDCLUSTERS)
        self.pods = manager.informer(PODS, InformerOptions(label_selector=manifests.BACKUP_LABEL))

    def settled(self, obj: EtcdBackup) -> bool:
        return (obj.status or EtcdBackupStatus()).phase in ("Succeeded", "Failed")

    async def observe(self, obj: EtcdBackup, now: datetime) -> Observed:
        previous = obj.status or EtcdBackupStatus()
        agent = await self._agent(obj, previous, now) if previous.attempts > 0 else None
        return Observed(previous, objects.generation(obj), now, agent, self._source(obj))

    def plan(self, observed: Observed) -> BackupStep:
        return planner.plan(observed)

    async def act(
        self, obj: EtcdBackup, observed: Observed, step: BackupStep, notes: list[Note]
    ) -> BackupStep:
        if isinstance(step, planner.Start):
            assert observed.source.cluster is not None  # planned only with a cluster to stream from
            await self._start(obj, observed.source.cluster, step, observed.now)
        notes.extend(planner.notes(observed, step, planner.status(observed, step, observed.now, None)))
        return step

    def status(
        self, observed: Observed, step: BackupStep, now: datetime, failure: ReconcileError | None
    ) -> Obj:
        return planner.status(observed, step, now, failure).model_dump(by_alias=True, exclude_none=True)

    def requeue_after(self, observed: Observed, step: BackupStep) -> float | None:
        return planner.requeue_after(observed, step)

    # ---- observe -----------------------------------------------------------------------

    async def _agent(self, backup: EtcdBackup, previous: EtcdBackupStatus, now: datetime) -> Agent:
        """The current attempt's pod; its log read only when it finished and says something new."""
        namespace = str(objects.namespace(backup))
        pod_name = manifests.agent_pod_name(objects.name(backup), previous.attempts)
        pod = self.pods.get(f"{namespace}/{pod_name}") or await self.api.get(PODS, namespace, pod_name)
        if pod is None:
            return Agent(None)
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase == "Succeeded":
            log_text = await self.api.logs(namespace, pod_name, manifests.AGENT_CONTAINER)
            return Agent(phase, result=parse_result(log_text))
        if phase == "Failed":
            waiting = previous.next_attempt_time is not None  # said already: no log to read again
            return Agent(phase, failure=None if waiting else await self._failure(namespace, pod))
        what = "backup agent pod"
        stuck = classify(pod, None, now, what) or await volume_stuck(self.api, pod, now, what)
        return Agent(phase, stuck=(stuck.reason, stuck.message) if stuck else None)

    async def _failure(self, namespace: str, pod: Obj) -> str:
        container = manifests.failed_container(pod)
        try:
            text = await self.api.logs(namespace, objects.name(pod), container)
        except ApiStatusError as err:
            return f"the agent failed and its log is unavailable: {err}"
        lines = text.strip().splitlines() or ["the agent failed without a message"]
        if container == manifests.SAVE_CONTAINER:
            return f"etcdctl snapshot save failed: {lines[-1]}"
        return parse_error(text) or lines[-1]

    def _source(self, backup: EtcdBackup) -> Source:
        """The member and storage the next attempt would use (from the caches: no I/O)."""
        name = backup.spec.cluster_name
        cluster_raw = self.clusters.get(f"{objects.namespace(backup)}/{name}")
        if cluster_raw is None:
            return Source(problem=f"EtcdCluster {name} not found")
        try:
            cluster = EtcdCluster.model_validate(cluster_raw)
        except ValidationError as err:
            return Source(problem=f"EtcdCluster {name} is invalid: {err}")
        member = manifests.source_member(cluster)
        if member is None:
            return Source(problem=f"no healthy member of {name} to stream from")
        return Source(member, manifests.storage_for(backup, cluster), cluster)

    # ---- act ---------------------------------------------------------------------------

    async def _start(
        self, backup: EtcdBackup, cluster: EtcdCluster, step: planner.Start, now: datetime
    ) -> None:
        """Create the attempt's pod (and the cluster's default claim); one that exists is ours."""
        if step.storage.pvc is not None and step.storage.pvc.claim_name is None:
            await self.api.apply(CLAIMS, manifests.default_claim(cluster, step.storage.pvc))
        pod = manifests.agent_pod(backup, cluster, step.storage, step.member, step.attempt, self.image, now)
        try:
            await self.api.create(PODS, manifests.placed_like_members(pod, cluster))
        except ApiStatusError as err:
            if not err.conflict:
                raise


class BackupScheduleReconciler(FamilyReconciler[EtcdCluster, ScheduleObserved, ScheduleStep]):
    """Creates an EtcdBackup when a cluster's schedule is due, and deletes expired ones.

    It owns no status: the scheduled EtcdBackups are its record, an invalid spec is the
    EtcdCluster controller's to report, and a failed step is a Warning Event on the cluster.
    """

    model = EtcdCluster

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.backups = manager.informer(ETCDBACKUPS)
        self.by_cluster = self.backups.index_by_label(CLUSTER_LABEL)

    def settled(self, obj: EtcdCluster) -> bool:
        return obj.spec.backup is None

    async def observe(self, obj: EtcdCluster, now: datetime) -> ScheduleObserved:
        schedule = obj.spec.backup
        assert schedule is not None  # settled otherwise
        namespace, name = objects.namespace(obj), objects.name(obj)
        scheduled = tuple(
            b for b in self.backups.by_index(self.by_cluster, name)
            if objects.namespace(b) == namespace
            and objects.labels(b).get(manifests.SCHEDULED_LABEL) == "true"
        )  # fmt: skip
        created = parse_rfc3339(obj.metadata.get("creationTimestamp")) or now
        formed = bool(obj.status and obj.status.cluster_id)
        return ScheduleObserved(schedule, scheduled, created, formed, now)

    def plan(self, observed: ScheduleObserved) -> ScheduleStep:
        return planner.plan_schedule(observed)

    async def act(
        self, obj: EtcdCluster, observed: ScheduleObserved, step: ScheduleStep, notes: list[Note]
    ) -> ScheduleStep:
        try:
            match step:
                case planner.Prune(expired=expired):
                    for old in expired:
                        namespace, name = objects.namespace(old), objects.name(old)
                        await self.api.delete(ETCDBACKUPS, namespace, name, uid=objects.uid(old))
                case planner.InvalidSchedule(message=message):
                    notes.append(Note("BackupScheduleInvalid", message, WARNING))
                case planner.TakeBackup(due=due):
                    backup = manifests.scheduled_backup(obj, scheduled_name(objects.name(obj), due))
                    try:
                        await self.api.create(ETCDBACKUPS, backup)
                    except ApiStatusError as err:
                        if not err.conflict:
                            raise
        except ReconcileError as err:
            notes.append(Note("BackupScheduleFailed", f"scheduled backups: {err.message}", WARNING))
            raise
        return step

    def status(
        self, observed: ScheduleObserved, step: ScheduleStep, now: datetime,
        failure: ReconcileError | None,
    ) -> Obj:  # fmt: skip
        return {}  # no status of its own

    def requeue_after(self, observed: ScheduleObserved, step: ScheduleStep) -> float | None:
        return planner.schedule_requeue_after(observed, step)

    async def write_status(self, raw: Obj, status: Obj, notes: list[Note]) -> None:
        """Only the notes: the EtcdCluster's status is its own controller's."""
        for note in notes:
            await self.manager.events.record(raw, note.type, note.reason, note.message)


def _backup_keys(backup: Obj) -> list[str]:
    """A scheduled backup's change wakes its cluster's schedule (to prune)."""
    cluster = objects.labels(backup).get(CLUSTER_LABEL)
    return [f"{objects.namespace(backup)}/{cluster}"] if cluster else []


def _cluster_id(cluster: Obj) -> Any:
    return (cluster.get("status") or {}).get("clusterId")


# A schedule decides on the spec and on whether the cluster has formed, not on the steps the
# EtcdCluster controller records in the status (each woke a pass).
schedule_change_matters = status_matters(_cluster_id)


def register(manager: Manager, deps: Deps) -> None:
    backups = EtcdBackupReconciler(manager, configured_agent_image(), deps)
    controller = Controller("etcdbackup", ETCDBACKUPS, backups.reconcile, workers=2)
    label = manifests.BACKUP_LABEL
    controller.watch(PODS, label_keys(label), InformerOptions(label_selector=label))
    manager.add_controller(controller)
    schedules = BackupScheduleReconciler(manager, deps)
    schedule_controller = Controller(
        "etcdbackup-schedule", ETCDCLUSTERS, schedules.reconcile, primary_matters=schedule_change_matters
    )
    schedule_controller.watch(ETCDBACKUPS, _backup_keys)
    manager.add_controller(schedule_controller)
