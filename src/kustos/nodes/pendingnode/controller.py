"""The PendingNode controller: deadlines of joining and leaving instances (see planner)."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from typing import Any

from kustos.api.pendingnode import PendingNode
from kustos.nodes.cloud import CancelsCreates
from kustos.nodes.pendingnode import planner
from kustos.nodes.pendingnode.planner import CancelCreate, DeleteInstance, Forget, Observed, Step
from kustos.runtime import faults, objects
from kustos.runtime.cloud import CloudProvider, InstanceState, NotFound
from kustos.runtime.controller import Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import WARNING
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler
from kustos.runtime.record import Note
from kustos.runtime.resources import NODES
from kustos.runtime.steps import Wait
from kustos.runtime.times import parse_rfc3339, rfc3339

log = logging.getLogger(__name__)
PENDINGNODES = PendingNode.crd.ref
Obj = dict[str, Any]


class PendingNodeReconciler(FamilyReconciler[PendingNode, Observed, Step]):
    model = PendingNode

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.cloud: CloudProvider | None = deps.cloud
        self.pendings = self.cache
        self.nodes = manager.informer(NODES)

    def _node(self, provider_id: str, name: str) -> dict[str, Any] | None:
        if not provider_id:
            return None
        if name:
            node = self.nodes.get(name)
            if node is not None and (node.get("spec") or {}).get("providerID") == provider_id:
                return node
        return next(
            (n for n in self.nodes.list() if (n.get("spec") or {}).get("providerID") == provider_id), None
        )

    def settled(self, obj: PendingNode) -> bool:
        return self.cloud is None  # nothing to ask about an instance without a provider

    async def observe(self, obj: PendingNode, now: datetime) -> Observed:
        assert self.cloud is not None
        spec = obj.spec
        node = self._node(spec.provider_id, spec.node_name)
        instance = None
        if spec.provider_id:
            try:
                instance = (await self.cloud.instance(spec.provider_id)).state
            except NotFound:  # never any other failure: that is said (Degraded) and retried
                instance = InstanceState.GONE
        return Observed(
            spec.goal, spec.provider_id, parse_rfc3339(spec.deadline), now,
            objects.node_ready(node) if node else False, node is not None, instance,
            node=objects.name(node) if node else None, group_id=spec.group_id,
            previous=obj.status.model_dump(by_alias=True, exclude_none=True) if obj.status else {},
            generation=objects.generation(obj),
        )  # fmt: skip

    def plan(self, observed: Observed) -> Step:
        return planner.plan(observed)

    async def act(self, obj: PendingNode, observed: Observed, step: Step, notes: list[Note]) -> Step:
        assert self.cloud is not None
        name, goal = objects.name(obj), observed.goal
        match step:
            case CancelCreate():
                # A refused cancel raises: the base records it (Degraded) and retries.
                if isinstance(self.cloud, CancelsCreates):
                    cancelled = await self.cloud.cancel_create(observed.group_id)
                    log.info("PendingNode %s: %s (creation taken back: %s)", name, step.reason, cancelled)
                await self.api.delete(PENDINGNODES, None, name)
            case Forget():
                log.info("PendingNode %s: %s", name, step.reason)
                await self.api.delete(PENDINGNODES, None, name)
            case DeleteInstance():
                told = f"{goal} {observed.provider_id}: {step.reason}"
                # The instance first, then its Node: a Node deleted while its instance still
                # runs is registered again by its kubelet, and a refused delete (the group at
                # its minimum, access denied, throttled) would leave the instance without the
                # Node that shows it. The refusal is recorded before it is retried.
                try:
                    with contextlib.suppress(NotFound):
                        await self.cloud.delete_instance(observed.group_id, observed.provider_id)
                except ReconcileError:
                    notes.append(Note("DeadlineExceeded", told, WARNING))
                    raise
                if observed.node is not None:
                    await self.api.delete(NODES, None, observed.node)
                faults.exit_after("DeleteInstance")
                if goal == "Join":
                    # The slot is free at once: the NodeImage controller asks for a new node. The
                    # object goes, so its Event is said here rather than with a status record.
                    raw = self.cache.get(objects.key(obj))
                    if raw is not None:
                        await self.manager.events.record(raw, WARNING, "DeadlineExceeded", told)
                    await self.api.delete(PENDINGNODES, None, name)
                    return step
                notes.append(Note("DeadlineExceeded", told, WARNING))
                later = rfc3339(observed.now + timedelta(minutes=2))
                await self.api.patch(PENDINGNODES, None, name, {"spec": {"deadline": later}})
        return step

    def status(self, observed: Observed, step: Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure)

    def unobserved(self, raw: Obj, failure: ReconcileError, now: datetime) -> Obj:
        return planner.unobserved(raw.get("status") or {}, objects.generation(raw), now, failure)

    def requeue_after(self, observed: Observed, step: Step) -> float | None:
        if isinstance(step, Forget) or (isinstance(step, DeleteInstance) and observed.goal == "Join"):
            return None  # the object is gone
        return step.seconds if isinstance(step, Wait) else 5.0


def _by_node(reconciler: PendingNodeReconciler) -> Any:
    def keys(node: dict[str, Any]) -> list[str]:
        provider_id = (node.get("spec") or {}).get("providerID")
        return [
            objects.key(p) for p in reconciler.pendings.list()
            if provider_id and (p.get("spec") or {}).get("providerID") == provider_id
        ]  # fmt: skip

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = PendingNodeReconciler(manager, deps)
    controller = Controller("pendingnode", PENDINGNODES, reconciler.reconcile, workers=2)
    controller.watch(NODES, _by_node(reconciler))
    manager.add_controller(controller)
