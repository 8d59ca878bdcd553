"""The NodeJob controller: observe (caches and pod logs), plan (planner.plan), act one step, record.

The job's pods belong to a DaemonSet the job owns, so deleting the job removes them
(garbage collection through owner references). Which nodes are done lives in the
status, so a restarted operator never forgets a node it saw finish, and never needs
that pod's log again. Each pass writes the status once, computed by ``planner.status``: the
reconcile itself is the runtime's (``runtime.reconciler.FamilyReconciler``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from kustos.api.nodejob import NodeJob, NodeJobStatus
from kustos.nodejob import planner
from kustos.nodejob.planner import JOB_LABEL, NodeView, Observed, Plan, PodView
from kustos.runtime import faults, objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.controller import Controller, label_keys
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler, InvalidSpec
from kustos.runtime.record import Note
from kustos.runtime.resources import DAEMONSETS, NODES, PODS

log = logging.getLogger(__name__)

NODEJOBS = NodeJob.crd.ref
Obj = dict[str, Any]

POLL = 2.0  # logs change without any watch event: look again this often until complete
LOG_LINES = 500
# Only the Degraded condition's transitions are Events (InvalidSpec, a failed step, recovered);
# progress has Events of its own (JobStarted, NodeDone, JobCompleted).
ANNOUNCED = frozenset({"Degraded"})


def _node_view(node: dict[str, Any]) -> NodeView:
    return NodeView(objects.name(node), objects.labels(node), objects.taints(node))


class NodeJobReconciler(FamilyReconciler[NodeJob, Observed, Plan]):
    model = NodeJob
    announce = ANNOUNCED

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.jobs = self.cache
        self.daemon_sets = manager.informer(DAEMONSETS, InformerOptions(label_selector=JOB_LABEL))
        self.pods = manager.informer(PODS, InformerOptions(label_selector=JOB_LABEL))
        self.pods_by_job = self.pods.index_by_label(JOB_LABEL)
        self.nodes = manager.informer(NODES)

    def settled(self, obj: NodeJob) -> bool:
        status = obj.status or NodeJobStatus()
        return bool(status.completed and status.phase == "Completed")

    def plan(self, observed: Observed) -> Plan:
        return planner.plan(observed)

    def status(self, observed: Observed, step: Plan, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure).model_dump(by_alias=True)

    def rejected(self, raw: Obj, failure: InvalidSpec, now: datetime) -> Obj:
        previous = NodeJobStatus.model_validate(raw.get("status") or {})
        status = planner.invalid(previous, failure.message, objects.generation(raw), now)
        return status.model_dump(by_alias=True)

    def requeue_after(self, observed: Observed, step: Plan) -> float | None:
        if step.action == "Invalid" or step.completed:
            return None
        return 1.0 if step.action == "CreateDaemonSet" else POLL

    async def act(self, job: NodeJob, observed: Observed, step: Plan, notes: list[Note]) -> Plan:
        if step.action == "CreateDaemonSet":
            refused = await self._create_daemon_set(job)
            if refused is not None:
                return Plan("Invalid", message=f"the DaemonSet was refused: {refused}")
            notes.append(Note("JobStarted", planner.status(observed, step, observed.now).message or ""))
        for node in step.newly_done:
            notes.append(Note("NodeDone", f"{job.spec.completion_word!r} seen on node {node}"))
        if step.newly_completed:
            log.info("step: JobCompleted (%s)", step.message)
            notes.append(Note("JobCompleted", f"Job completed ({step.message}). Safe to delete."))
        return step

    # ---- observe -----------------------------------------------------------------------

    async def observe(self, job: NodeJob, now: datetime) -> Observed:
        status = job.status or NodeJobStatus()
        namespace, name = objects.namespace(job), objects.name(job)
        daemon_set = self.daemon_sets.get(f"{namespace}/{planner.daemon_set_name(name)}")
        nodes = tuple(_node_view(n) for n in self.nodes.list())
        wanted = set(planner.selected(job.spec, nodes))
        done = {n.name for n in status.nodes if n.state == "Done"}
        pods: list[PodView] = []
        # A copy: reading logs awaits, and the informer may change its store meanwhile.
        for pod in self.pods.by_index(self.pods_by_job, name):
            if objects.namespace(pod) != namespace:
                continue
            node = objects.pod_node(pod)
            running = objects.pod_running(pod)
            deleting = objects.deleting(pod)
            seen = False
            if running and not deleting and node in wanted and node not in done:
                seen = await self._word_in_log(str(namespace), objects.name(pod), job.spec.completion_word)
            pods.append(PodView(objects.name(pod), node, running, deleting, seen))
        return Observed(
            spec=job.spec,
            daemon_set_exists=daemon_set is not None,
            nodes=nodes,
            pods=tuple(pods),
            recorded=tuple(status.nodes),
            completed=status.completed,
            now=now,
            name=name,
            generation=objects.generation(job),
            previous=status,
        )

    async def _word_in_log(self, namespace: str, pod: str, word: str) -> bool:
        try:
            text = await self.api.logs(namespace, pod, planner.CONTAINER, tail_lines=LOG_LINES)
        except ApiStatusError as err:
            log.debug("log of %s/%s not readable yet: %s", namespace, pod, err)
            return False
        return planner.log_has_word(text, word)

    # ---- act ---------------------------------------------------------------------------

    async def _create_daemon_set(self, job: NodeJob) -> str | None:
        """Create the job's DaemonSet; the API server's refusal of it (None: created or there)."""
        manifest = planner.daemon_set(job)
        log.info("step: CreateDaemonSet %s", manifest["metadata"]["name"])
        try:
            await self.api.create(DAEMONSETS, manifest)
        except ApiStatusError as err:
            if err.code == 422 or err.code == 400:
                return err.message
            if not err.conflict:
                raise
        faults.exit_after("CreateDaemonSet")
        return None


def _jobs_for_node(reconciler: NodeJobReconciler) -> Any:
    """A node change (new node, new labels, taints) wakes every job not yet complete."""

    def keys(_node: dict[str, Any]) -> list[str]:
        return [
            objects.key(j) for j in reconciler.jobs.list() if not (j.get("status") or {}).get("completed")
        ]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = NodeJobReconciler(manager, deps)
    controller = Controller("nodejob", NODEJOBS, reconciler.reconcile, workers=2)
    controller.watch(PODS, label_keys(JOB_LABEL), InformerOptions(label_selector=JOB_LABEL))
    controller.owns(DAEMONSETS, InformerOptions(label_selector=JOB_LABEL))
    controller.watch(NODES, _jobs_for_node(reconciler))
    manager.add_controller(controller)
