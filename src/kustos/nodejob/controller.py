"""The NodeJob controller: observe (caches and pod logs), plan (planner.plan), act one step, record.

The job's pods belong to a DaemonSet the job owns, so deleting the job removes them
(garbage collection through owner references). Which nodes are done lives in the
status, so a restarted operator never forgets a node it saw finish, and never needs
that pod's log again. Each pass writes the status once (``runtime.record``), computed
by ``planner.status``.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from kustos.api.nodejob import NodeJob, NodeJobStatus
from kustos.nodejob import planner
from kustos.nodejob.planner import JOB_LABEL, NodeView, Observed, Plan, PodView, Taint
from kustos.runtime import faults, objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.clock import Clock
from kustos.runtime.controller import Controller, Result, label_keys
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note, record
from kustos.runtime.resources import DAEMONSETS, NODES, PODS

log = logging.getLogger(__name__)

NODEJOBS = NodeJob.crd.ref

POLL = 2.0  # logs change without any watch event: look again this often until complete
LOG_LINES = 500
# Only the Degraded condition's transitions are Events (InvalidSpec, a failed step, recovered);
# progress has Events of its own (JobStarted, NodeDone, JobCompleted).
ANNOUNCED = frozenset({"Degraded"})


def _node_view(node: dict[str, Any]) -> NodeView:
    taints = tuple(
        Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "NoSchedule"))
        for t in (node.get("spec") or {}).get("taints") or []
    )
    return NodeView(objects.name(node), objects.labels(node), taints)


class NodeJobReconciler:
    def __init__(self, manager: Manager, clock: Clock) -> None:
        self.manager = manager
        self.api = manager.api
        self.clock = clock
        self.jobs = manager.informer(NODEJOBS)
        self.daemon_sets = manager.informer(DAEMONSETS, InformerOptions(label_selector=JOB_LABEL))
        self.pods = manager.informer(PODS, InformerOptions(label_selector=JOB_LABEL))
        self.pods_by_job = self.pods.index_by_label(JOB_LABEL)
        self.nodes = manager.informer(NODES)

    async def reconcile(self, key: str) -> Result | None:
        raw = self.jobs.get(key)
        if raw is None or objects.deleting(raw):
            return None  # owner references take the DaemonSet and its pods along
        try:
            job = NodeJob.model_validate(raw)
        except ValidationError as err:
            status = planner.invalid(
                NodeJobStatus(), f"invalid spec: {err}", objects.generation(raw), self.clock.now()
            )
            await record(self.api, NODEJOBS, raw, status.model_dump(by_alias=True), self.manager.events,
                         announce=ANNOUNCED)  # fmt: skip
            return None
        status = job.status or NodeJobStatus()
        if status.completed and status.phase == "Completed":
            return None
        observed = await self.observe(job, status)
        step = planner.plan(observed)
        failure: ReconcileError | None = None
        notes: list[Note] = []
        if step.action == "CreateDaemonSet":
            try:
                refused = await self._create_daemon_set(job)
            except ReconcileError as err:
                failure = err
            else:
                if refused is not None:
                    step = Plan("Invalid", message=f"the DaemonSet was refused: {refused}")
                else:
                    message = planner.status(observed, step).message or ""
                    notes.append(Note("JobStarted", message))
        for node in step.newly_done:
            notes.append(Note("NodeDone", f"{job.spec.completion_word!r} seen on node {node}"))
        if step.newly_completed:
            log.info("step: JobCompleted (%s)", step.message)
            notes.append(Note("JobCompleted", f"Job completed ({step.message}). Safe to delete."))
        await self._record(raw, observed, step, failure, notes)
        if failure is not None:
            raise failure
        if step.action == "Invalid" or step.completed:
            return None
        return Result(requeue_after=1.0 if step.action == "CreateDaemonSet" else POLL)

    # ---- observe -----------------------------------------------------------------------

    async def observe(self, job: NodeJob, status: NodeJobStatus) -> Observed:
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
            now=self.clock.now(),
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

    # ---- record ------------------------------------------------------------------------

    async def _record(
        self, raw: dict[str, Any], o: Observed, step: Plan, failure: ReconcileError | None = None,
        notes: list[Note] | None = None,
    ) -> None:  # fmt: skip
        status = planner.status(o, step, failure)
        await record(self.api, NODEJOBS, raw, status.model_dump(by_alias=True), self.manager.events,
                     notes=notes or (), announce=ANNOUNCED)  # fmt: skip


def _jobs_for_node(reconciler: NodeJobReconciler) -> Any:
    """A node change (new node, new labels, taints) wakes every job not yet complete."""

    def keys(_node: dict[str, Any]) -> list[str]:
        return [
            objects.key(j) for j in reconciler.jobs.list() if not (j.get("status") or {}).get("completed")
        ]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = NodeJobReconciler(manager, deps.clock)
    controller = Controller("nodejob", NODEJOBS, reconciler.reconcile, workers=2)
    controller.watch(PODS, label_keys(JOB_LABEL), InformerOptions(label_selector=JOB_LABEL))
    controller.owns(DAEMONSETS, InformerOptions(label_selector=JOB_LABEL))
    controller.watch(NODES, _jobs_for_node(reconciler))
    manager.add_controller(controller)
