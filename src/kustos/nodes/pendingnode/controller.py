"""The PendingNode controller: deadlines of joining and leaving instances (see planner)."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import Any

from kustos.api.pendingnode import PendingNode
from kustos.nodes.cloud import CancelsCreates
from kustos.nodes.pendingnode import planner
from kustos.nodes.pendingnode.planner import CancelCreate, DeleteInstance, Forget, Observed
from kustos.runtime import faults, objects
from kustos.runtime.cloud import CloudProvider, InstanceState, NotFound
from kustos.runtime.controller import Controller, Result
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError
from kustos.runtime.events import WARNING
from kustos.runtime.manager import Manager
from kustos.runtime.record import Note, record
from kustos.runtime.resources import NODES
from kustos.runtime.steps import Wait
from kustos.runtime.times import parse_rfc3339, rfc3339

log = logging.getLogger(__name__)
PENDINGNODES = PendingNode.crd.ref


class PendingNodeReconciler:
    def __init__(self, manager: Manager, deps: Deps) -> None:
        self.manager = manager
        self.api = manager.api
        self.clock = deps.clock
        self.cloud: CloudProvider | None = deps.cloud
        self.pendings = manager.informer(PENDINGNODES)
        self.nodes = manager.informer(NODES)

    def _node(self, spec: dict[str, Any]) -> dict[str, Any] | None:
        provider_id = spec.get("providerID")
        if not provider_id:
            return None
        name = spec.get("nodeName")
        if name:
            node = self.nodes.get(name)
            if node is not None and (node.get("spec") or {}).get("providerID") == provider_id:
                return node
        return next(
            (n for n in self.nodes.list() if (n.get("spec") or {}).get("providerID") == provider_id), None
        )

    async def reconcile(self, key: str) -> Result | None:
        raw = self.pendings.get(key)
        if raw is None or objects.deleting(raw) or self.cloud is None:
            return None
        spec = raw.get("spec") or {}
        provider_id = spec.get("providerID") or ""
        previous = dict(raw.get("status") or {})
        generation = objects.generation(raw)
        node = self._node(spec)
        instance = None
        if provider_id:
            try:
                instance = (await self.cloud.instance(provider_id)).state
            except NotFound:
                instance = InstanceState.GONE
            except ReconcileError as err:
                # Never taken for gone (that is NotFound only): said, then retried.
                await self._refused(
                    raw, planner.status(previous, None, None, generation, self.clock.now(), err), err
                )
                raise
        now = self.clock.now()
        o = Observed(spec.get("goal", "Join"), provider_id, parse_rfc3339(spec.get("deadline")), now,
                     objects.node_ready(node) if node else False, node is not None, instance)  # fmt: skip
        step = planner.plan(o)
        notes: list[Note] = []
        match step:
            case CancelCreate():
                if isinstance(self.cloud, CancelsCreates):
                    try:
                        cancelled = await self.cloud.cancel_create(spec.get("groupId", ""))
                    except ReconcileError as err:
                        await self._refused(raw, planner.status(previous, o, step, generation, now, err), err)
                        raise
                    log.info("PendingNode %s: %s (creation taken back: %s)", key, step.reason, cancelled)
                await self.api.delete(PENDINGNODES, None, objects.name(raw))
                return None
            case Forget():
                log.info("PendingNode %s: %s", key, step.reason)
                await self.api.delete(PENDINGNODES, None, objects.name(raw))
                return None
            case DeleteInstance():
                notes.append(
                    Note("DeadlineExceeded", f"{spec.get('goal')} {provider_id}: {step.reason}", WARNING)
                )
                # The instance first, then its Node: a Node deleted while its instance still
                # runs is registered again by its kubelet, and a refused delete (the group at
                # its minimum, access denied, throttled) would leave the instance without the
                # Node that shows it. The refusal is recorded before it is retried.
                try:
                    with contextlib.suppress(NotFound):
                        await self.cloud.delete_instance(spec.get("groupId", ""), provider_id)
                except ReconcileError as err:
                    status = planner.status(previous, o, step, generation, now, err)
                    await self._refused(raw, status, err, notes)
                    raise
                if node is not None:
                    await self.api.delete(NODES, None, objects.name(node))
                faults.exit_after("DeleteInstance")
                status = planner.status(previous, o, step, generation, now)
                if spec.get("goal") == "Join":
                    # The slot is free at once: the NodeImage controller asks for a new node.
                    await record(self.api, PENDINGNODES, raw, status, self.manager.events, notes=notes)
                    await self.api.delete(PENDINGNODES, None, objects.name(raw))
                    return None
                later = rfc3339(now + timedelta(minutes=2))
                await self.api.patch(PENDINGNODES, None, objects.name(raw), {"spec": {"deadline": later}})
                await record(self.api, PENDINGNODES, raw, status, self.manager.events, notes=notes)
                return Result(requeue_after=5.0)
        status = planner.status(previous, o, step, generation, now)
        await record(self.api, PENDINGNODES, raw, status, self.manager.events, notes=notes)
        return Result(requeue_after=step.seconds if isinstance(step, Wait) else 5.0)

    async def _refused(
        self,
        raw: dict[str, Any],
        status: dict[str, Any],
        err: ReconcileError,
        notes: list[Note] | None = None,
    ) -> None:
        """Record a provider's refusal (Degraded, its reason, an Event) before it is retried."""
        spec = raw.get("spec") or {}
        told = [
            *(notes or []),
            Note(err.reason, f"{spec.get('goal')} {spec.get('providerID')}: {err.message}", WARNING),
        ]
        await record(self.api, PENDINGNODES, raw, status, self.manager.events, notes=told)


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
