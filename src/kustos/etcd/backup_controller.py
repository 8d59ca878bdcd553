"""EtcdBackup and backup schedules: run one agent pod per attempt, record what it reports.

The EtcdBackup's status is the whole state machine (attempts, when the next attempt
may start, the result), and each attempt's pod is named after its number, so a
restarted operator picks up exactly where the last one stopped. Failures are retried
with backoff and never touch the cluster: the agent only reads a member's snapshot.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from kustos.api.backup import EtcdBackup, EtcdBackupStatus
from kustos.api.common import Condition
from kustos.api.etcd import EtcdCluster
from kustos.etcd import backup as plan
from kustos.etcd.pods import CLUSTER_LABEL
from kustos.etcd.resources import ETCDBACKUPS, ETCDCLUSTERS
from kustos.etcd.snapshot import parse_error, parse_result, scheduled_name
from kustos.etcd.stuck import classify, volume_stuck
from kustos.images import configured_agent_image
from kustos.runtime import objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.clock import Clock
from kustos.runtime.conditions import set_condition
from kustos.runtime.controller import Controller, Result, label_keys
from kustos.runtime.deps import Deps
from kustos.runtime.events import WARNING
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note, record
from kustos.runtime.resources import CLAIMS, PODS
from kustos.runtime.times import parse_rfc3339, rfc3339

log = logging.getLogger(__name__)

WAIT_FOR_CLUSTER = 10.0


class EtcdBackupReconciler:
    def __init__(self, manager: Manager, image: str, deps: Deps | None = None) -> None:
        self.manager = manager
        self.api = manager.api
        self.image = image
        self.clock: Clock = (deps or Deps()).clock
        self.backups = manager.informer(ETCDBACKUPS)
        self.clusters = manager.informer(ETCDCLUSTERS)
        self.pods = manager.informer(PODS, InformerOptions(label_selector=plan.BACKUP_LABEL))

    async def reconcile(self, key: str) -> Result | None:
        raw = self.backups.get(key)
        if raw is None or objects.deleting(raw):
            return None
        backup = EtcdBackup.model_validate(raw)
        status = backup.status or EtcdBackupStatus()
        if status.phase in ("Succeeded", "Failed"):
            return None
        namespace, name = backup.metadata["namespace"], backup.metadata["name"]
        if status.attempts > 0:
            pod_name = plan.agent_pod_name(name, status.attempts)
            pod = self.pods.get(f"{namespace}/{pod_name}") or await self.api.get(PODS, namespace, pod_name)
            phase = ((pod or {}).get("status") or {}).get("phase")
            if phase == "Succeeded":
                return await self._succeeded(raw, backup, status, pod_name)
            if pod is not None and phase != "Failed":
                now, what = self.clock.now(), "backup agent pod"
                stuck = classify(pod, None, now, what) or await volume_stuck(self.api, pod, now, what)
                if stuck is not None and status.message != stuck.message:
                    # Said, not failed: the pod may yet start (an image pulled, a node added).
                    status.message = stuck.message
                    self._condition(raw, status, succeeded=False, reason=stuck.reason)
                    await self._write(raw, status, Note(stuck.reason, stuck.message, WARNING))
                return Result(requeue_after=5.0)  # running: its pod's changes wake us
            if status.next_attempt_time is None:
                why = await self._failure_reason(namespace, pod) if pod else "the agent pod disappeared"
                return await self._failed(raw, backup, status, why)
            now = self.clock.now()
            wait = (parse_rfc3339(status.next_attempt_time) or now) - now
            if wait.total_seconds() > 0:
                return Result(requeue_after=wait.total_seconds())
        return await self._start_attempt(raw, backup, status)

    async def _start_attempt(
        self, raw: dict[str, Any], backup: EtcdBackup, status: EtcdBackupStatus
    ) -> Result:
        namespace = backup.metadata["namespace"]
        cluster_raw = self.clusters.get(f"{namespace}/{backup.spec.cluster_name}")
        if cluster_raw is None:
            await self._pending(raw, status, f"EtcdCluster {backup.spec.cluster_name} not found")
            return Result(requeue_after=WAIT_FOR_CLUSTER)
        try:
            cluster = EtcdCluster.model_validate(cluster_raw)
        except ValidationError as err:
            await self._pending(raw, status, f"EtcdCluster {backup.spec.cluster_name} is invalid: {err}")
            return Result(requeue_after=WAIT_FOR_CLUSTER)
        member = plan.source_member(cluster)
        if member is None:
            await self._pending(
                raw, status, f"no healthy member of {backup.spec.cluster_name} to stream from"
            )
            return Result(requeue_after=WAIT_FOR_CLUSTER)
        storage = plan.storage_for(backup, cluster)
        if storage.pvc is not None and storage.pvc.claim_name is None:
            await self.api.apply(CLAIMS, plan.default_claim(cluster, storage.pvc))
        attempt = status.attempts + 1
        try:
            pod = plan.agent_pod(backup, cluster, storage, member, attempt, self.image, self.clock.now())
            await self.api.create(PODS, plan.placed_like_members(pod, cluster))
        except ApiStatusError as err:
            if not err.conflict:
                raise
        status.phase = "Running"
        status.attempts = attempt
        status.next_attempt_time = None
        status.start_time = status.start_time or rfc3339(self.clock.now())
        status.member = member[0]
        status.storage = storage
        status.message = f"attempt {attempt}: streaming a snapshot from {member[0]}"
        await self._write(raw, status, Note("BackupStarted", status.message))
        return Result(requeue_after=5.0)

    async def _succeeded(
        self, raw: dict[str, Any], backup: EtcdBackup, status: EtcdBackupStatus, pod_name: str
    ) -> Result | None:
        log_text = await self.api.logs(backup.metadata["namespace"], pod_name, plan.AGENT_CONTAINER)
        result = parse_result(log_text)
        if result is None:
            return await self._failed(raw, backup, status, "the agent exited without reporting a result")
        status.phase = "Succeeded"
        status.location = result.location
        status.member = result.member
        status.revision = result.revision
        status.size = result.size
        status.sha256 = result.sha256
        status.start_time = status.start_time or result.start_time
        status.completion_time = result.completion_time
        status.duration = f"{result.duration_seconds:.2f}s"
        status.message = f"{result.size} bytes at revision {result.revision} in {result.location}"
        if result.pruned:
            status.message += f"; retention removed {', '.join(result.pruned)}"
        self._condition(raw, status, succeeded=True, reason="Succeeded")
        await self._write(raw, status, Note("BackupSucceeded", status.message))
        return None

    async def _failed(
        self, raw: dict[str, Any], backup: EtcdBackup, status: EtcdBackupStatus, why: str
    ) -> Result | None:
        message = f"attempt {status.attempts} failed: {why}"
        if status.attempts >= plan.MAX_ATTEMPTS:
            status.phase = "Failed"
            status.message = f"{message}; giving up after {status.attempts} attempts"
            self._condition(raw, status, succeeded=False, reason="Failed")
            await self._write(raw, status, Note("BackupFailed", status.message, WARNING))
            return None
        delay = plan.retry_delay(status.attempts)
        status.next_attempt_time = rfc3339(self.clock.now() + delay)
        status.message = f"{message}; retrying in {delay.total_seconds():.0f}s"
        self._condition(raw, status, succeeded=False, reason="Retrying")
        await self._write(raw, status, Note("BackupAttemptFailed", status.message, WARNING))
        return Result(requeue_after=delay.total_seconds())

    async def _failure_reason(self, namespace: str, pod: dict[str, Any]) -> str:
        container = plan.failed_container(pod)
        try:
            text = await self.api.logs(namespace, objects.name(pod), container)
        except ApiStatusError as err:
            return f"the agent failed and its log is unavailable: {err}"
        lines = text.strip().splitlines() or ["the agent failed without a message"]
        if container == plan.SAVE_CONTAINER:
            return f"etcdctl snapshot save failed: {lines[-1]}"
        return parse_error(text) or lines[-1]

    async def _pending(self, raw: dict[str, Any], status: EtcdBackupStatus, message: str) -> None:
        if status.message == message and status.phase == "Pending":
            return
        status.phase = status.phase or "Pending"
        status.message = message
        self._condition(raw, status, False, "Waiting")  # said where tools look, not only in Events
        await self._write(raw, status, Note("BackupWaiting", message, WARNING))

    def _condition(self, raw: dict[str, Any], status: EtcdBackupStatus, succeeded: bool, reason: str) -> None:
        """The Succeeded condition, saying the status message."""
        current = (raw.get("status") or {}).get("conditions")
        updated = set_condition(
            current,
            "Succeeded",
            succeeded,
            reason,
            status.message or "",
            objects.generation(raw),
            self.clock.now(),
        )
        status.conditions = [Condition.model_validate(c) for c in updated]

    async def _write(self, raw: dict[str, Any], status: EtcdBackupStatus, note: Note) -> None:
        """The attempt's record (replaced: a cleared nextAttemptTime goes), then its Event."""
        payload = status.model_dump(by_alias=True, exclude_none=True)
        updated = await record(
            self.api, ETCDBACKUPS, raw, payload, self.manager.events, notes=[note], announce=()
        )
        raw["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]


class BackupScheduleReconciler:
    """Creates an EtcdBackup when a cluster's schedule is due, and deletes expired ones."""

    def __init__(self, manager: Manager, deps: Deps | None = None) -> None:
        self.manager = manager
        self.api = manager.api
        self.clock: Clock = (deps or Deps()).clock
        self.clusters = manager.informer(ETCDCLUSTERS)
        self.backups = manager.informer(ETCDBACKUPS)
        self.by_cluster = self.backups.index_by_label(CLUSTER_LABEL)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.clusters.get(key)
        if raw is None or objects.deleting(raw):
            return None
        try:
            cluster = EtcdCluster.model_validate(raw)
        except ValidationError:
            return None  # the EtcdCluster controller reports an invalid spec
        schedule = cluster.spec.backup
        if schedule is None:
            return None
        namespace, name = cluster.metadata["namespace"], cluster.metadata["name"]
        scheduled = [
            b for b in self.backups.by_index(self.by_cluster, name)
            if objects.namespace(b) == namespace and objects.labels(b).get(plan.SCHEDULED_LABEL) == "true"
        ]  # fmt: skip
        for old in plan.expired(scheduled, schedule.keep):
            await self.api.delete(ETCDBACKUPS, namespace, objects.name(old), uid=objects.uid(old))
        created = [parse_rfc3339(b["metadata"].get("creationTimestamp")) for b in scheduled]
        now = self.clock.now()
        last = max([c for c in created if c is not None], default=None)
        last = last or parse_rfc3339(cluster.metadata.get("creationTimestamp")) or now
        due = plan.next_scheduled(schedule, last)
        if due > now:
            return Result(requeue_after=(due - now).total_seconds())
        if not (cluster.status and cluster.status.cluster_id):
            return Result(requeue_after=WAIT_FOR_CLUSTER)  # nothing to back up before it formed
        try:
            await self.api.create(ETCDBACKUPS, plan.scheduled_backup(cluster, scheduled_name(name, now)))
        except ApiStatusError as err:
            if not err.conflict:
                raise
        return Result(requeue_after=(plan.next_scheduled(schedule, now) - now).total_seconds())


def _backup_keys(backup: dict[str, Any]) -> list[str]:
    """A scheduled backup's change wakes its cluster's schedule (to prune)."""
    cluster = objects.labels(backup).get(CLUSTER_LABEL)
    return [f"{objects.namespace(backup)}/{cluster}"] if cluster else []


def register(manager: Manager, deps: Deps) -> None:
    image = configured_agent_image()
    backups = EtcdBackupReconciler(manager, image, deps)
    controller = Controller("etcdbackup", ETCDBACKUPS, backups.reconcile, workers=2)
    controller.watch(PODS, label_keys(plan.BACKUP_LABEL), InformerOptions(label_selector=plan.BACKUP_LABEL))
    manager.add_controller(controller)
    schedules = BackupScheduleReconciler(manager, deps)
    schedule_controller = Controller("etcdbackup-schedule", ETCDCLUSTERS, schedules.reconcile)
    schedule_controller.watch(ETCDBACKUPS, _backup_keys)
    manager.add_controller(schedule_controller)
