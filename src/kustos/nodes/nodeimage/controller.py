"""The NodeImage controller: observe (caches, the cloud provider, gates) -> plan -> act one step
-> record once.

Every fact a restarted operator needs is in Kubernetes: the pairing on the heir
(``kustos.dev/donor``), the drain's start and end on the donor, the intent to create an
instance as a Join PendingNode written before the provider is asked. So a pass after a
crash plans the same next step and never asks for a second heir.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.api.nodeimage import NodeImage, NodeImageStatus
from kustos.api.pendingnode import PendingNode
from kustos.api.scalinggroup import ScalingGroup
from kustos.api.storage import StorageCluster
from kustos.etcd import kubeadm
from kustos.nodes import labels as marks
from kustos.nodes.nodeimage import planner
from kustos.nodes.nodeimage.planner import (
    ClaimInstance,
    CreateHeir,
    DeleteDonor,
    Drain,
    ForgetPending,
    Gate,
    GroupView,
    Invalid,
    NodeView,
    Observed,
    Pair,
    PendingView,
    RemoveEtcdMember,
    RetireObsolete,
    Step,
)
from kustos.runtime import drain as draining
from kustos.runtime import faults, objects
from kustos.runtime.api import ApiStatusError
from kustos.runtime.cloud import CloudProvider, Instance, InstanceState, NotFound, Role
from kustos.runtime.controller import Controller
from kustos.runtime.deps import Deps
from kustos.runtime.errors import ReconcileError, RetryAfter
from kustos.runtime.events import WARNING
from kustos.runtime.informer import InformerOptions
from kustos.runtime.manager import Manager
from kustos.runtime.reconciler import FamilyReconciler, InvalidSpec
from kustos.runtime.record import Note
from kustos.runtime.resources import NODES, PODS
from kustos.runtime.steps import Done, Wait
from kustos.runtime.times import parse_duration, rfc3339

log = logging.getLogger(__name__)

NODEIMAGES = NodeImage.crd.ref
Obj = dict[str, Any]
PENDINGNODES = PendingNode.crd.ref
SCALINGGROUPS = ScalingGroup.crd.ref
ETCDCLUSTERS = EtcdCluster.crd.ref
STORAGECLUSTERS = StorageCluster.crd.ref
ANNOUNCED = frozenset({"Degraded", "Available", "Paused"})
ETCD_POD_LABEL = "kustos.dev/cluster"
# Failures that are a wait for something outside kustos (a budget, etcd's quorum) are
# RetryAfter errors: recorded in Degraded and retried every BLOCKED_RETRY seconds, not with
# growing backoff, which would leave a freed PodDisruptionBudget unnoticed for minutes.
BLOCKED_RETRY = 5.0


def pending_name_for_leave(node: str) -> str:
    return f"{node}-leave"[:253]


def status_kept(raw: Obj, failure: ReconcileError, now: datetime) -> Obj:
    """The status of a pass that observed nothing (an invalid spec, a provider that refused):
    what was known stays (heirs and donors: AutoscalingStrategy reads them to keep the
    autoscaler off mid-rollout); Degraded and waitingFor say why nothing moves."""
    previous = NodeImageStatus.model_validate(raw.get("status") or {})
    return planner.unobserved(previous, failure, objects.generation(raw), now).model_dump(by_alias=True)


class NodeImageReconciler(FamilyReconciler[NodeImage, Observed, Step]):
    model = NodeImage
    announce = ANNOUNCED

    def __init__(self, manager: Manager, deps: Deps) -> None:
        super().__init__(manager, deps)
        self.cloud: CloudProvider | None = deps.cloud
        self.images = self.cache
        self.nodes = manager.informer(NODES)
        self.pendings = manager.informer(PENDINGNODES)
        self.groups = manager.informer(SCALINGGROUPS)
        self.etcds = manager.informer(ETCDCLUSTERS)
        self.storages = manager.informer(STORAGECLUSTERS)
        self.etcd_pods = manager.informer(PODS, InformerOptions(label_selector=ETCD_POD_LABEL))

    def plan(self, observed: Observed) -> Step:
        step = planner.plan(observed)
        if not isinstance(step, Wait | Done):
            log.info("step: %s", step)
        return step

    def status(self, observed: Observed, step: Step, now: datetime, failure: ReconcileError | None) -> Obj:
        return planner.status(observed, step, now, failure).model_dump(by_alias=True)

    def unobserved(self, raw: Obj, failure: ReconcileError, now: datetime) -> Obj:
        return status_kept(raw, failure, now)

    def rejected(self, raw: Obj, failure: InvalidSpec, now: datetime) -> Obj:
        return status_kept(raw, failure, now)

    def requeue_after(self, observed: Observed, step: Step) -> float | None:
        return planner.requeue_after(step)

    # ---- observe ---------------------------------------------------------------------------

    async def observe(self, image: NodeImage, now: datetime) -> Observed:
        name = objects.name(image)
        status = image.status or NodeImageStatus()
        if self.cloud is None:
            return Observed(name, image.spec, (), (), now=now, generation=objects.generation(image),
                            previous=status, provider=False)  # fmt: skip
        provider_groups = await self.cloud.groups()
        await self._discover(name, provider_groups)
        mine = {
            objects.name(g): g for g in self.groups.list() if ((g.get("spec") or {}).get("nodeImage") == name)
        }
        wanted_ids = {(g.get("spec") or {}).get("groupId") for g in mine.values()}
        groups: list[GroupView] = []
        instances: dict[str, Instance] = {}
        for group in provider_groups:
            if group.group_id not in wanted_ids:
                continue
            members = [i for i in await self.cloud.instances(group.group_id) if i.state != InstanceState.GONE]
            for i in members:
                instances[i.provider_id] = i
            groups.append(
                GroupView(
                    group.group_id, group.role, group.image, tuple(sorted(i.provider_id for i in members))
                )
            )
        nodes = []
        malformed: list[str] = []
        for node in self.nodes.list():
            provider_id = objects.provider_id(node)
            if not provider_id:
                continue  # not a provider's node: not this controller's business
            instance = instances.get(provider_id)
            annotations = objects.annotations(node)
            nodes.append(
                NodeView(
                    name=objects.name(node),
                    provider_id=provider_id,
                    group=instance.group_id if instance else None,
                    image=instance.image if instance else None,
                    ready=objects.node_ready(node),
                    unschedulable=objects.node_unschedulable(node),
                    donor=annotations.get(marks.DONOR),
                    labels=objects.labels(node),
                    taints=objects.taints(node),
                    drain_started=objects.annotation_time(node, marks.DRAIN_STARTED, malformed),
                    drained=marks.DRAINED in annotations,
                    etcd_member_removed=marks.ETCD_MEMBER_REMOVED in annotations,
                    internal_ip=objects.internal_ip(node),
                    deleting=objects.deleting(node),
                )
            )
        for problem in malformed:
            log.warning("%s", problem)
        pending = []
        for p in self.pendings.list():
            spec = p.get("spec") or {}
            if spec.get("nodeImage") not in ("", name) or spec.get("groupId") not in wanted_ids:
                continue
            pending.append(
                PendingView(
                    name=objects.name(p),
                    group=spec.get("groupId", ""),
                    goal=spec.get("goal", "Join"),
                    provider_id=spec.get("providerID", "") or "",
                    known=tuple(spec.get("knownInstances") or ()),
                    node_image=spec.get("nodeImage", ""),
                )
            )
        gates = await self._gates(image)
        return Observed(
            name=name, spec=image.spec, nodes=tuple(nodes), groups=tuple(groups), pending=tuple(pending),
            gates=tuple(gates), now=now, generation=objects.generation(image), previous=status,
            malformed=tuple(malformed),
        )  # fmt: skip

    async def _discover(self, name: str, provider_groups: Any) -> None:
        """Create a ScalingGroup for each provider group that has none (named after the group)."""
        known = {(g.get("spec") or {}).get("groupId") for g in self.groups.list()}
        for group in provider_groups:
            if group.group_id in known:
                continue
            sg_name = _k8s_name(group.group_id)
            manifest: dict[str, Any] = {
                "apiVersion": ScalingGroup.crd.api_version,
                "kind": "ScalingGroup",
                "metadata": {"name": sg_name, "labels": {"app.kubernetes.io/managed-by": "kustos"}},
                "spec": {
                    "groupId": group.group_id, "role": str(group.role), "nodeImage": name,
                    "min": group.min_size, "max": max(group.max_size, group.min_size),
                },
            }  # fmt: skip
            try:
                await self.api.create(SCALINGGROUPS, manifest)
                log.info(
                    "discovered provider group %s: ScalingGroup %s",
                    group.group_id,
                    manifest["metadata"]["name"],
                )
            except ApiStatusError as err:
                if not err.conflict:
                    raise

    async def _gates(self, image: NodeImage) -> list[Gate]:
        gates: list[Gate] = []
        spec = image.spec.health_gates
        if spec.etcd_clusters:
            pods = {objects.key(p): p for p in self.etcd_pods.list() if ETCD_POD_LABEL in objects.labels(p)}
            for raw in self.etcds.list():
                status = raw.get("status") or {}
                size = (raw.get("spec") or {}).get("size", 3)
                members = status.get("members") or []
                hosts, voting = set(), 0
                for m in members:
                    pod = pods.get(f"{objects.namespace(raw)}/{m.get('pod', '')}")
                    node = objects.pod_node(pod) if pod else None
                    if node:
                        hosts.add(node)
                    # A learner does not count towards quorum, and the status lags the pods: a
                    # member whose pod is being evicted or not Ready is not counted either.
                    on_live_pod = pod is not None and not objects.deleting(pod) and objects.pod_ready(pod)
                    if m.get("healthy") and not m.get("learner") and on_live_pod:
                        voting += 1
                ok = voting >= size
                gates.append(Gate(f"EtcdCluster {objects.key(raw)}", ok,
                                  f"{voting}/{size} voting members healthy", frozenset(hosts)))  # fmt: skip
        if spec.storage_clusters:
            for raw in self.storages.list():
                phase = (raw.get("status") or {}).get("phase")
                gates.append(Gate(f"StorageCluster {objects.key(raw)}", phase == "Running", f"phase {phase}"))
        for gate in spec.pods:
            gated = await self.api.list_objects(PODS, gate.namespace, gate.selector)
            ready = sum(1 for p in gated if objects.pod_ready(p))
            not_ready = [objects.key(p) for p in gated if not objects.pod_ready(p)]
            ok = not not_ready and ready >= gate.min_ready
            message = f"pods {gate.selector}: {ready} Ready" + (
                f", not Ready: {', '.join(not_ready[:5])}" if not_ready else ""
            )
            gates.append(Gate(f"pods {gate.selector}", ok, message))
        return gates

    # ---- act ----------------------------------------------------------------------------------

    async def act(self, image: NodeImage, o: Observed, step: Step, notes: list[Note]) -> Step:
        assert self.cloud is not None or isinstance(step, Wait | Done | Invalid)
        match step:
            case CreateHeir():
                if not await self._create_heir(image, o, step):
                    # The intent is there already (this pass read a cache behind its own create):
                    # its instance was asked for by the pass that wrote it.
                    return Wait(f"heir intent {step.pending_name} exists; its instance is awaited", 2)
                notes.append(
                    Note("HeirRequested", f"asked group {step.group} for a new node ({step.pending_name})")
                )
                faults.exit_after("CreateHeir")
            case ClaimInstance():
                patch = {"spec": {"providerID": step.provider_id, "nodeName": step.node_name}}
                await self.api.patch(PENDINGNODES, None, step.pending, patch)
                faults.exit_after("ClaimInstance")
            case Pair():
                await self._pair(step)
                if step.pending:
                    notes.append(Note("Paired", f"{step.heir} replaces {step.donor}"))
                faults.exit_after("Pair")
            case ForgetPending():
                await self.api.delete(PENDINGNODES, None, step.pending)
            case Drain():
                return await self._drain(image, step, notes)
            case RemoveEtcdMember():
                await self._remove_etcd_member(image, o, step, notes)
                faults.exit_after("RemoveEtcdMember")
            case DeleteDonor():
                await self._delete(image, step.donor, step.group, step.provider_id, step.role)
                if step.heir:
                    # The pairing is over; a heir whose donor is gone counts as up to date anyway.
                    forget = {"metadata": {"annotations": {marks.DONOR: None}}}
                    with contextlib.suppress(ApiStatusError):
                        await self.api.patch(NODES, None, step.heir, forget)
                heir = step.heir or "its heir"
                notes.append(Note("NodeReplaced", f"{step.donor} deleted; {heir} took over"))
                faults.exit_after("DeleteDonor")
            case RetireObsolete():
                await self._delete(image, step.node, step.group, step.provider_id, step.role)
                if step.pending:
                    await self.api.delete(PENDINGNODES, None, step.pending)
                notes.append(Note("NodeRetired", f"{step.node} was not needed as a heir"))
        return step

    async def _create_heir(self, image: NodeImage, o: Observed, step: CreateHeir) -> bool:
        """Write the intent, then ask the provider; False when the intent existed (no ask)."""
        assert self.cloud is not None
        deadline = o.now + parse_duration(image.spec.join_timeout)
        manifest = {
            "apiVersion": PendingNode.crd.api_version,
            "kind": "PendingNode",
            "metadata": {"name": step.pending_name, "labels": {marks.NODE_IMAGE: o.name}},
            "spec": {
                "groupId": step.group, "goal": "Join", "deadline": rfc3339(deadline), "role": str(step.role),
                "knownInstances": list(step.known), "nodeImage": o.name,
            },
        }  # fmt: skip
        try:
            await self.api.create(PENDINGNODES, manifest)  # the intent, before the provider is asked
        except ApiStatusError as err:
            if not err.conflict:
                raise
            return False  # asking again would grow the group by one more for the same intent
        try:
            await self.cloud.create_instance(step.group)
        except ReconcileError:
            # Refused (capacity, throttled): nothing was created, so the intent goes too.
            await self.api.delete(PENDINGNODES, None, step.pending_name)
            raise
        return True

    async def _pair(self, step: Pair) -> None:
        heir = self.nodes.get(step.heir)
        if heir is None:
            raise ReconcileError(f"heir {step.heir} vanished", "HeirGone")
        taints = [dict(t) for t in (heir.get("spec") or {}).get("taints") or []]
        have = {(t.get("key"), t.get("value", ""), t.get("effect")) for t in taints}
        for t in step.taints:
            if (t.key, t.value, t.effect) not in have:
                taints.append(
                    {"key": t.key, "value": t.value, "effect": t.effect}
                    if t.value
                    else {"key": t.key, "effect": t.effect}
                )
        patch = {
            "metadata": {"labels": dict(step.labels), "annotations": {marks.DONOR: step.donor}},
            "spec": {"taints": taints},
        }
        await self.api.patch(NODES, None, step.heir, patch)
        await self.api.patch(NODES, None, step.donor, {"metadata": {"annotations": {marks.HEIR: step.heir}}})
        if step.pending:
            await self.api.delete(PENDINGNODES, None, step.pending)

    async def _drain(self, image: NodeImage, step: Drain, notes: list[Note]) -> Step:
        now = self.clock.now()
        if not step.started:
            await self.api.patch(
                NODES, None, step.donor, {"metadata": {"annotations": {marks.DRAIN_STARTED: rfc3339(now)}}}
            )
            notes.append(Note("Draining", f"cordoning and draining {step.donor}"))
        options = draining.DrainOptions(timeout=planner.DRAIN_ATTEMPT_SECONDS, retry=0.5, poll=0.5)
        try:
            await draining.drain(self.api, step.donor, options)
        except draining.DrainTimeout as blocked:
            if step.force:
                forced = [b.pod for b in blocked.report.blocked]
                for pod in forced:
                    namespace, _, name = pod.partition("/")
                    await self.api.delete(PODS, namespace, name)
                if forced:
                    await self.api.patch(
                        NODES,
                        None,
                        step.donor,
                        {"metadata": {"annotations": {marks.FORCED: ",".join(forced)[:4000]}}},
                    )
                    notes.append(
                        Note(
                            "DrainForced",
                            f"drainTimeout passed: deleted {', '.join(forced)} from {step.donor}",
                            WARNING,
                        )
                    )
                return Wait(f"drain of {step.donor}: forced {len(forced)} pod(s) off", 1)
            node = self.nodes.get(step.donor)
            started = objects.annotation_time(node, marks.DRAIN_STARTED)
            timeout = parse_duration(image.spec.drain_timeout)
            if started is not None and now - started >= timeout:
                raise RetryAfter(
                    f"drain of {step.donor} blocked past drainTimeout {image.spec.drain_timeout} "
                    f"(onDrainTimeout: wait): {blocked.report.describe()}",
                    BLOCKED_RETRY,
                    "DrainBlocked",
                ) from blocked
            return Wait(f"draining {step.donor}: {blocked.report.describe()}", 2)
        await self.api.patch(
            NODES, None, step.donor, {"metadata": {"annotations": {marks.DRAINED: rfc3339(now)}}}
        )
        faults.exit_after("Drain")
        return step

    async def _remove_etcd_member(
        self, image: NodeImage, o: Observed, step: RemoveEtcdMember, notes: list[Note]
    ) -> None:
        spec = image.spec.etcd
        assert spec is not None
        view = planner.classify(o)
        ips = [n.internal_ip for n in o.nodes if view.role(n) == Role.CONTROL_PLANE and not n.deleting]
        refusal: str | None = "the donor has no InternalIP to find its etcd member by"
        if step.internal_ip:
            endpoints = [kubeadm.client_url(ip, spec.scheme, spec.client_port) for ip in ips if ip]
            certificates = Path(spec.certificates_dir), spec.certificates_secret, spec.scheme
            async with kubeadm.client_tls(self.api, *certificates) as tls:
                removal = await kubeadm.remove_member(
                    endpoints, tls, address=step.internal_ip, heir_address=step.heir_ip
                )
            refusal = removal.message if removal.refused else None
        if refusal is not None:
            message = f"etcd member of {step.donor} not removed: {refusal}"
            raise RetryAfter(message, BLOCKED_RETRY, "EtcdMemberKept")
        await self.api.patch(
            NODES,
            None,
            step.donor,
            {"metadata": {"annotations": {marks.ETCD_MEMBER_REMOVED: rfc3339(o.now)}}},
        )
        notes.append(
            Note("EtcdMemberRemoved", f"the stacked etcd member at {step.internal_ip} ({step.donor}) left")
        )

    async def _delete(self, image: NodeImage, node: str, group: str, provider_id: str, role: Role) -> None:
        assert self.cloud is not None
        deadline = self.clock.now() + timedelta(minutes=10)
        labels = {marks.NODE_IMAGE: objects.name(image)}
        leave = {
            "apiVersion": PendingNode.crd.api_version,
            "kind": "PendingNode",
            "metadata": {"name": pending_name_for_leave(node), "labels": labels},
            "spec": {
                "providerID": provider_id, "groupId": group, "nodeName": node, "goal": "Leave",
                "deadline": rfc3339(deadline), "role": str(role), "nodeImage": objects.name(image),
            },
        }  # fmt: skip
        try:
            await self.api.create(PENDINGNODES, leave)
        except ApiStatusError as err:
            if not err.conflict:
                raise
        # The instance first, then its Node (as the PendingNode controller does): a Node deleted
        # while its instance runs is registered again by its kubelet. A refused delete leaves
        # the Node showing the instance; the Leave PendingNode written above retries it.
        with contextlib.suppress(NotFound):  # already gone: the Leave PendingNode sees it, goes too
            await self.cloud.delete_instance(group, provider_id)
        await self.api.delete(NODES, None, node)


def _k8s_name(group_id: str) -> str:
    import hashlib
    import re

    base = re.sub(r"[^a-z0-9-]+", "-", group_id.lower()).strip("-")[:50] or "group"
    if base == group_id:
        return base
    return f"{base}-{hashlib.sha256(group_id.encode()).hexdigest()[:6]}"


def _all_images(reconciler: NodeImageReconciler) -> Any:
    def keys(_obj: dict[str, Any]) -> list[str]:
        return [objects.key(i) for i in reconciler.images.list()]

    return keys


def register(manager: Manager, deps: Deps) -> None:
    reconciler = NodeImageReconciler(manager, deps)
    controller = Controller("nodeimage", NODEIMAGES, reconciler.reconcile, workers=1)
    everything = _all_images(reconciler)
    controller.watch(NODES, everything)
    controller.watch(PENDINGNODES, everything)
    controller.watch(SCALINGGROUPS, everything)
    controller.watch(ETCDCLUSTERS, everything)
    controller.watch(STORAGECLUSTERS, everything)
    controller.watch(PODS, everything, InformerOptions(label_selector=ETCD_POD_LABEL))
    manager.add_controller(controller)
