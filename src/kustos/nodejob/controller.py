"""The NodeJob controller: observe (caches and pod logs), plan (planner.plan), act one step, record.

The job's pods belong to a DaemonSet the job owns, so deleting the job removes them
(garbage collection through owner references). Which nodes are done lives in the
status, so a restarted operator never forgets a node it saw finish, and never needs
that pod's log again.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kustos.api.common import Condition
from kustos.api.nodejob import NodeJob, NodeJobStatus
from kustos.nodejob import planner
from kustos.nodejob.planner import JOB_LABEL, NodeView, Observed, Plan, PodView, Taint
from kustos.runtime import faults
from kustos.runtime.api import ApiStatusError
from kustos.runtime.conditions import set_condition
from kustos.runtime.controller import Controller, Result, label_keys
from kustos.runtime.events import NORMAL, WARNING
from kustos.runtime.informer import InformerOptions, ResourceRef
from kustos.runtime.manager import Manager
from kustos.runtime.resources import NODES, PODS
from kustos.runtime.times import rfc3339

log = logging.getLogger(__name__)

NODEJOBS = ResourceRef(NodeJob.crd.group, NodeJob.crd.version, "nodejobs", "NodeJob")
DAEMONSETS = ResourceRef("apps", "v1", "daemonsets", "DaemonSet")

POLL = 2.0  # logs change without any watch event: look again this often until complete
LOG_LINES = 500


def _running(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (s.get("state") or {}) for s in statuses)


def _node_view(node: dict[str, Any]) -> NodeView:
    taints = tuple(
        Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "NoSchedule"))
        for t in (node.get("spec") or {}).get("taints") or []
    )
    return NodeView(node["metadata"]["name"], dict(node["metadata"].get("labels") or {}), taints)


class NodeJobReconciler:
    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.api = manager.api
        self.jobs = manager.informer(NODEJOBS)
        self.daemon_sets = manager.informer(DAEMONSETS, InformerOptions(label_selector=JOB_LABEL))
        self.pods = manager.informer(PODS, InformerOptions(label_selector=JOB_LABEL))
        self.nodes = manager.informer(NODES)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.jobs.get(key)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            return None  # owner references take the DaemonSet and its pods along
        try:
            job = NodeJob.model_validate(raw)
        except ValidationError as err:
            await self._invalid(raw, NodeJobStatus(), f"invalid spec: {err}")
            return None
        status = job.status or NodeJobStatus()
        if status.completed and status.phase == "Completed":
            return None
        observed = await self.observe(job, status)
        step = planner.plan(observed)
        if step.action == "Invalid":
            await self._invalid(raw, status, step.message)
            return None
        if step.action == "CreateDaemonSet":
            return await self._create_daemon_set(raw, job, status)
        await self._record(raw, job, status, step)
        if step.completed:
            return None
        return Result(requeue_after=POLL)

    # ---- observe -----------------------------------------------------------------------

    async def observe(self, job: NodeJob, status: NodeJobStatus) -> Observed:
        namespace, name = job.metadata["namespace"], job.metadata["name"]
        daemon_set = self.daemon_sets.get(f"{namespace}/{planner.daemon_set_name(name)}")
        nodes = tuple(_node_view(n) for n in self.nodes.list())
        wanted = set(planner.selected(job.spec, nodes))
        done = {n.name for n in status.nodes if n.state == "Done"}
        pods: list[PodView] = []
        # A copy: reading logs awaits, and the informer may change its store meanwhile.
        for pod in list(self.pods.list()):
            meta = pod["metadata"]
            if meta.get("namespace") != namespace or (meta.get("labels") or {}).get(JOB_LABEL) != name:
                continue
            node = (pod.get("spec") or {}).get("nodeName")
            running = _running(pod)
            deleting = bool(meta.get("deletionTimestamp"))
            seen = False
            if running and not deleting and node in wanted and node not in done:
                seen = await self._word_in_log(namespace, meta["name"], job.spec.completion_word)
            pods.append(PodView(meta["name"], node, running, deleting, seen))
        return Observed(
            spec=job.spec,
            daemon_set_exists=daemon_set is not None,
            nodes=nodes,
            pods=tuple(pods),
            recorded=tuple(status.nodes),
            completed=status.completed,
            now=rfc3339(datetime.now(UTC)),
        )

    async def _word_in_log(self, namespace: str, pod: str, word: str) -> bool:
        try:
            text = await self.api.logs(namespace, pod, planner.CONTAINER, tail_lines=LOG_LINES)
        except ApiStatusError as err:
            log.debug("log of %s/%s not readable yet: %s", namespace, pod, err)
            return False
        return planner.log_has_word(text, word)

    # ---- act ---------------------------------------------------------------------------

    async def _create_daemon_set(
        self, raw: dict[str, Any], job: NodeJob, status: NodeJobStatus
    ) -> Result | None:
        manifest = planner.daemon_set(job)
        log.info("step: CreateDaemonSet %s", manifest["metadata"]["name"])
        try:
            await self.api.create(DAEMONSETS, manifest)
        except ApiStatusError as err:
            if err.code == 422 or err.code == 400:
                await self._invalid(raw, status, f"the DaemonSet was refused: {err.message}")
                return None
            if not err.conflict:
                raise
        faults.exit_after("CreateDaemonSet")
        status.phase = "Running"
        status.daemon_set = manifest["metadata"]["name"]
        status.start_time = status.start_time or rfc3339(datetime.now(UTC))
        status.message = f"running {job.spec.image} through DaemonSet {status.daemon_set}"
        status.conditions = _conditions(raw, "Completed", False, "Running", status.message)
        await self._write(raw, status)
        await self._event(raw, NORMAL, "JobStarted", status.message)
        return Result(requeue_after=1.0)

    async def _record(self, raw: dict[str, Any], job: NodeJob, status: NodeJobStatus, step: Plan) -> None:
        for node in step.newly_done:
            await self._event(raw, NORMAL, "NodeDone", f"{job.spec.completion_word!r} seen on node {node}")
        status.nodes = list(step.nodes)
        status.progress = step.progress
        status.message = step.message
        status.daemon_set = status.daemon_set or planner.daemon_set_name(job.metadata["name"])
        if step.completed:
            status.completed = True
            status.phase = "Completed"
            status.completion_time = status.completion_time or rfc3339(datetime.now(UTC))
            status.conditions = _conditions(raw, "Completed", True, "AllNodesDone", step.message)
        else:
            status.phase = "Running"
            status.conditions = _conditions(raw, "Completed", False, "Running", step.message)
        if _same(raw, status):
            return
        await self._write(raw, status)
        if step.newly_completed:
            log.info("step: JobCompleted (%s)", step.message)
            await self._event(raw, NORMAL, "JobCompleted", f"Job completed ({step.message}). Safe to delete.")

    async def _invalid(self, raw: dict[str, Any], status: NodeJobStatus, message: str) -> None:
        status.phase = "Failed"
        status.message = message[:1000]
        status.conditions = _conditions(raw, "Degraded", True, "InvalidSpec", status.message)
        if not _same(raw, status):
            await self._write(raw, status)
        await self._event(raw, WARNING, "InvalidSpec", message[:500])

    async def _write(self, raw: dict[str, Any], status: NodeJobStatus) -> None:
        updated = await self.api.replace_status(NODEJOBS, raw, status.model_dump(by_alias=True))
        raw["metadata"]["resourceVersion"] = updated["metadata"]["resourceVersion"]

    async def _event(self, raw: dict[str, Any], kind: str, reason: str, message: str) -> None:
        await self.manager.events.record(raw, kind, reason, message)


def _conditions(raw: dict[str, Any], type_: str, value: bool, reason: str, message: str) -> list[Condition]:
    current = (raw.get("status") or {}).get("conditions")
    updated = set_condition(current, type_, value, reason, message, raw["metadata"].get("generation"))
    return [Condition.model_validate(c) for c in updated]


def _same(raw: dict[str, Any], status: NodeJobStatus) -> bool:
    """Whether writing ``status`` would change nothing (most polling passes)."""
    current = {k: v for k, v in (raw.get("status") or {}).items() if k != "observedGeneration"}
    desired = status.model_dump(by_alias=True, exclude_none=True)
    return current == desired


def _jobs_for_node(reconciler: NodeJobReconciler) -> Any:
    """A node change (new node, new labels, taints) wakes every job not yet complete."""

    def keys(_node: dict[str, Any]) -> list[str]:
        return [
            f"{j['metadata']['namespace']}/{j['metadata']['name']}"
            for j in reconciler.jobs.list()
            if not (j.get("status") or {}).get("completed")
        ]

    return keys


def register(manager: Manager) -> None:
    reconciler = NodeJobReconciler(manager)
    controller = Controller("nodejob", NODEJOBS, reconciler.reconcile, workers=2)
    controller.watch(PODS, label_keys(JOB_LABEL), InformerOptions(label_selector=JOB_LABEL))
    controller.owns(DAEMONSETS, InformerOptions(label_selector=JOB_LABEL))
    controller.watch(NODES, _jobs_for_node(reconciler))
    manager.add_controller(controller)
