"""The node maintenance planner: which node is dead, whether it is fenced, the one next step.

Pure: no I/O, no clock (``now`` is an input). The controller turns its caches (and the
cloud provider's answer) into an ``Observed``; ``plan`` says the one thing to do next
for the whole cluster (untaint a node that came back, taint a fenced one out of service,
force-delete a pod, release a pinned claim, purge one step, or wait); ``status`` says
what the MaintenancePolicy's status is after that step.

EKCO decides a node is dead when its ``node.kubernetes.io/unreachable`` taint is older
than the toleration, and then force-deletes its pods that have been Terminating for 30 s:
safe only if the node is really down. Here a node's pods are started elsewhere only once
the node is *fenced*: the provider says its instance is stopped or gone, a fencing agent
wrote ``kustos.dev/fenced`` after the node became unreachable, or (only when the policy
allows it) the toleration passed. EKCO's own clear is kept as ``legacyClear``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from kustos.api.common import Condition
from kustos.api.maintenance import (
    POLICY_NAME,
    MaintenanceAction,
    MaintenancePolicySpec,
    MaintenancePolicyStatus,
    PurgeDeletion,
)
from kustos.maintenance import (
    certrotation,
    internallb,
    minio,
    minio_spread,
    purge_planner,
    rook_scaling,
    scaling,
)
from kustos.maintenance.certrotation import CertRotationView, FinishRenewal, RemoveRenewalPod, StartRenewal
from kustos.maintenance.internallb import ApplyLoadBalancer, LoadBalancerView, RemoveLoadBalancer
from kustos.maintenance.minio import KotsadmView, MinioView
from kustos.maintenance.rook_scaling import PatchRook, RookView
from kustos.maintenance.scaling import Candidate, ScaleWorkload, WorkloadView
from kustos.runtime.cloud import InstanceState
from kustos.runtime.conditions import set_model_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import Done, Note, Wait
from kustos.runtime.times import parse_duration, rfc3339

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
OUT_OF_SERVICE_VALUE = "nodeshutdown"
OUT_OF_SERVICE_OWNER = "kustos.dev/out-of-service"
"""Annotation on a Node kustos tainted out of service (value: when): only such a taint is
removed by kustos when the node returns; one an administrator set is theirs."""
RELEASE_CLAIMS_ANNOTATION = "kustos.dev/release-pinned-claims"
"""On a StatefulSet ("true"): the workload replicates its own data, so a claim pinned to a
fenced node may be deleted for its pod to start elsewhere with a fresh volume."""
LEGACY_TERMINATING = timedelta(seconds=30)
"""EKCO force-deletes pods Terminating for this long on a dead node (legacy clear)."""
POLL = 5.0
"""While a node is unreachable, look again this often (fencing evidence may arrive)."""
RESYNC = 60.0

FenceSource = Literal["provider", "annotation", "toleration"]


@dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    uid: str = ""
    control_plane: bool = False
    unreachable_since: datetime | None = None
    """When the node lifecycle controller tainted it unreachable (the taint's timeAdded)."""
    out_of_service: bool = False
    """Tainted node.kubernetes.io/out-of-service (by anyone)."""
    out_of_service_ours: bool = False
    """And kustos put that taint there (so kustos removes it)."""
    fenced_at: datetime | None = None
    """The kustos.dev/fenced annotation's time, if any."""
    fenced_annotation_problem: str | None = None
    """Why the annotation could not be read (not an RFC 3339 time)."""
    instance: InstanceState | None = None
    """What the cloud provider says of its instance (None: no provider, or not asked)."""
    purge_done: tuple[str, ...] = ()
    """Purge steps recorded on the Node so far."""
    hostname: str = ""
    """Its kubernetes.io/hostname label (what a local volume's nodeAffinity names; it may
    differ from the Node's name)."""


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    uid: str
    node: str | None
    deleting_since: datetime | None = None
    """When its deletion was asked (the deletionTimestamp minus its grace period is not
    known here: EKCO counts from the deletionTimestamp, and so does legacy clear)."""


@dataclass(frozen=True)
class ClaimView:
    """A claim of a pod not yet scheduled, whose volume is pinned to one node."""

    namespace: str
    name: str
    uid: str
    pinned_to: str
    """The node the volume's nodeAffinity names."""
    pod: str
    """The pod that waits for it."""
    opted_in: bool
    """The pod's workload asked for this (a StatefulSet with the release annotation)."""
    deleting: bool = False


@dataclass(frozen=True)
class Observed:
    spec: MaintenancePolicySpec
    nodes: tuple[NodeView, ...]
    pods: tuple[PodView, ...] = ()
    """Pods on unreachable nodes."""
    claims: tuple[ClaimView, ...] = ()
    now: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    name: str = POLICY_NAME
    generation: int | None = None
    previous: MaintenancePolicyStatus = field(default_factory=MaintenancePolicyStatus)
    load_balancer: LoadBalancerView = field(default_factory=LoadBalancerView)
    """The API servers and the internal load balancer's writer DaemonSet."""
    workloads: tuple[WorkloadView, ...] = ()
    """spec.autoResourceScaling's workloads as they are, in the spec's order."""
    candidates: tuple[Candidate, ...] = ()
    """Every node, as auto-resource scaling counts them."""
    rook: RookView | None = None
    """Rook's objects, when some of Rook is maintained (rook_scaling)."""
    minio: MinioView | None = None
    """MinIO's Deployment, StatefulSet and Service (None: not observed)."""
    kotsadm: KotsadmView | None = None
    """kotsadm's database StatefulSet (None: not observed)."""
    certificates: CertRotationView = field(default_factory=CertRotationView)
    """kubeadm's control-plane nodes and the renewal pods (rotateCerts)."""


# ---- steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TaintOutOfService:
    node: str
    evidence: str


@dataclass(frozen=True)
class RemoveOutOfService:
    node: str
    why: str


@dataclass(frozen=True)
class ForceDeletePod:
    namespace: str
    name: str
    uid: str
    node: str
    why: str


@dataclass(frozen=True)
class ReleaseClaim:
    namespace: str
    name: str
    uid: str
    node: str
    pod: str


@dataclass(frozen=True)
class Purge:
    """Purge the node, one step at a time (``purge.Purger.next`` picks which from live facts)."""

    node: str


@dataclass(frozen=True)
class DecideDeletion:
    """The purge's next step deletes the Node: the status records that first (``PurgeDeletion``),
    so that once the Node is gone a pass still knows the purge is to be recorded done."""

    node: str
    uid: str


@dataclass(frozen=True)
class Purged:
    """What one purge step did (the act's account of a ``Purge``): ``refused`` when a safety
    check (etcd quorum, Ceph's ok-to-stop) kept it from acting. Planned as it is when a Node
    whose deletion was decided is gone: the purge is recorded done, whoever's pass deleted it."""

    node: str
    message: str
    refused: bool = False
    finished: bool = False
    """The Node is gone: the purge is complete."""


@dataclass(frozen=True)
class Refuse:
    """A guard said no; recorded as the policy's lastRefusal."""

    node: str
    action: str
    message: str


@dataclass(frozen=True)
class Ignored:
    """This policy is not the one acted on (only the one named default is)."""

    message: str


Step = (
    Purged
    | DecideDeletion
    | TaintOutOfService
    | RemoveOutOfService
    | ForceDeletePod
    | ReleaseClaim
    | Purge
    | ApplyLoadBalancer
    | RemoveLoadBalancer
    | ScaleWorkload
    | PatchRook
    | minio.MinioStep
    | StartRenewal
    | FinishRenewal
    | RemoveRenewalPod
    | Refuse
    | Ignored
    | Wait
    | Done
)


# ---- the decision ----------------------------------------------------------------------


def toleration(spec: MaintenancePolicySpec) -> timedelta:
    return parse_duration(spec.node_unreachable_toleration)


def past_toleration(spec: MaintenancePolicySpec, node: NodeView, now: datetime) -> bool:
    """EKCO's dead: unreachable for longer than nodeUnreachableToleration."""
    return (
        not node.ready
        and node.unreachable_since is not None
        and now - node.unreachable_since >= toleration(spec)
    )


def fenced_by(spec: MaintenancePolicySpec, node: NodeView, now: datetime) -> FenceSource | None:
    """What proves this unreachable node can run nothing any more (None: nothing does).

    The annotation counts only when written after the node became unreachable: one left
    from an earlier outage proves nothing about this one.
    """
    if node.ready or node.unreachable_since is None:
        return None
    if spec.fencing.provider and node.instance is not None and node.instance.fenced:
        return "provider"
    if spec.fencing.annotation and node.fenced_at is not None and node.fenced_at >= node.unreachable_since:
        return "annotation"
    if spec.fencing.after_toleration and past_toleration(spec, node, now):
        return "toleration"
    return None


def _evidence(source: FenceSource, node: NodeView) -> str:
    match source:
        case "provider":
            return f"the provider reports its instance {node.instance}"
        case "annotation":
            return f"a fencing agent confirmed it down at {rfc3339(node.fenced_at or datetime.now(UTC))}"
        case "toleration":
            return "it has been unreachable past nodeUnreachableToleration (fencing.afterToleration)"


def ready_counts(nodes: Sequence[NodeView], excluding: str) -> tuple[int, int]:
    """Ready control-plane and worker nodes, the named one not counted."""
    others = [n for n in nodes if n.name != excluding and n.ready]
    control = sum(1 for n in others if n.control_plane)
    return control, len(others) - control


def purge_refusal(spec: MaintenancePolicySpec, nodes: Sequence[NodeView], node: NodeView) -> str | None:
    """Why purging ``node`` would leave too few ready nodes of its own role (None: it would not).

    EKCO applied the worker minimum to control-plane nodes too; here each role has its own
    check, and the dead node never counts as ready.
    """
    control, workers = ready_counts(nodes, node.name)
    if node.control_plane and control < spec.min_ready_master_node_count:
        return (
            f"purging control-plane node {node.name} would leave {control} ready control-plane node(s); "
            f"minReadyMasterNodeCount is {spec.min_ready_master_node_count}"
        )
    if not node.control_plane and workers < spec.min_ready_worker_node_count:
        return (
            f"purging worker node {node.name} would leave {workers} ready worker node(s); "
            f"minReadyWorkerNodeCount is {spec.min_ready_worker_node_count}"
        )
    return None


def not_fenced(node: NodeView) -> str:
    """Why a node past its toleration is not purged: nothing proves it down."""
    return (
        f"not fenced: node {node.name} is past nodeUnreachableToleration but nothing proves it down "
        "(the provider, a kustos.dev/fenced annotation written after it became unreachable, or "
        "fencing.afterToleration); purging it could leave its pods running twice"
    )


def unfinished_purges(nodes: Sequence[NodeView]) -> list[NodeView]:
    """Ready nodes with a purge begun (kustos.dev/purge): they came back mid-purge."""
    return sorted((n for n in nodes if n.ready and n.purge_done), key=lambda n: n.name)


def _purge(o: Observed, node: NodeView) -> Step:
    """The node's next purge step; its deletion recorded as decided before it is asked."""
    last = purge_planner.deletes_next(
        node.control_plane, node.purge_done, purge_planner.maintains_rook(o.spec)
    )
    decided = any((d.node, d.uid) == (node.name, node.uid) for d in o.previous.purge_deletions)
    return DecideDeletion(node.name, node.uid) if last and not decided else Purge(node.name)


def dead_nodes(o: Observed) -> list[NodeView]:
    """Unreachable nodes that are fenced or past their toleration, oldest outage first."""
    dead = [
        n for n in o.nodes if fenced_by(o.spec, n, o.now) is not None or past_toleration(o.spec, n, o.now)
    ]
    return sorted(dead, key=lambda n: (n.unreachable_since or o.now, n.name))


def plan(o: Observed) -> Step:
    if o.name != POLICY_NAME:
        return Ignored(f"only the MaintenancePolicy named {POLICY_NAME!r} is acted on")
    present = {(n.name, n.uid) for n in o.nodes}
    for deletion in o.previous.purge_deletions:
        # 0. A purge whose Node is gone is recorded done, even when the pass that deleted it
        # stopped before recording it.
        if (deletion.node, deletion.uid) not in present:
            return Purged(
                deletion.node, f"Node {deletion.node} is gone: its purge is complete", finished=True
            )
    spec = o.spec
    clear = not spec.should_disable_clear_nodes
    # 1. A node we tainted out of service that is back: its pods may run there again.
    for node in o.nodes:
        if node.out_of_service_ours and node.ready:
            return RemoveOutOfService(node.name, "the node is Ready again")
    by_node: dict[str, list[PodView]] = {}
    for pod in sorted(o.pods, key=lambda p: (p.namespace, p.name)):
        if pod.node:
            by_node.setdefault(pod.node, []).append(pod)
    names = {n.name for n in o.nodes} | {n.hostname for n in o.nodes if n.hostname}
    fenced_names: set[str] = set()
    fenced_hosts: set[str] = set()
    refusals: list[Refuse] = []
    for node in sorted(o.nodes, key=lambda n: (n.unreachable_since or o.now, n.name)):
        source = fenced_by(spec, node, o.now)
        if source is not None:
            fenced_names.add(node.name)
            fenced_hosts.update({node.name, node.hostname} - {""})
        # 2. Purge first (EKCO's order): a purged node needs no clearing. Only a fenced node:
        # deleting a Node that is merely partitioned lets its pods run twice.
        if spec.should_enable_purge_nodes and past_toleration(spec, node, o.now):
            refusal = purge_refusal(spec, o.nodes, node) if source is not None else not_fenced(node)
            if refusal is None:
                return _purge(o, node)
            refusals.append(Refuse(node.name, "Purge", refusal))
        if not clear:
            continue
        if source is not None:
            # 3. Fenced: out of service, so its pods are deleted and volumes detached at once.
            if not node.out_of_service:
                return TaintOutOfService(node.name, _evidence(source, node))
            for pod in by_node.get(node.name, []):
                if pod.deleting_since is not None:
                    why = f"node {node.name} is fenced: {_evidence(source, node)}"
                    return ForceDeletePod(pod.namespace, pod.name, pod.uid, node.name, why)
        elif spec.legacy_clear and past_toleration(spec, node, o.now):
            # 4. EKCO's clear, without fencing: the operator asked for it, with its risk.
            for pod in by_node.get(node.name, []):
                if pod.deleting_since is not None and o.now - pod.deleting_since >= LEGACY_TERMINATING:
                    why = f"node {node.name} is past its toleration (legacyClear, not fenced)"
                    return ForceDeletePod(pod.namespace, pod.name, pod.uid, node.name, why)
    # 5. Claims pinned to a fenced (or vanished) node, of workloads that opted in.
    if clear:
        for claim in sorted(o.claims, key=lambda c: (c.namespace, c.name)):
            if not claim.opted_in or claim.deleting:
                continue
            if claim.pinned_to in fenced_hosts or claim.pinned_to not in names:
                return ReleaseClaim(claim.namespace, claim.name, claim.uid, claim.pinned_to, claim.pod)
    # 6. The internal load balancer follows the control-plane nodes.
    balancer = internallb.plan(spec, o.load_balancer)
    if balancer is not None:
        return balancer
    # 7. Workloads grow as their nodes join.
    if len(o.workloads) == len(spec.auto_resource_scaling):
        scale = scaling.plan(spec.auto_resource_scaling, o.workloads, o.candidates)
        if scale is not None:
            return scale
    # 8. Rook follows the nodes; a pool change held by Ceph's health waits below.
    rook = rook_scaling.plan(spec, o.rook)
    if isinstance(rook, PatchRook):
        return rook
    # 9. MinIO moves to its StatefulSet, kotsadm's database grows (F-MAINT-12).
    minio_waits = None
    if o.minio is not None:
        decision = minio.plan_minio(spec, o.minio, o.previous.minio)
        if decision.step is not None:
            return decision.step
        minio_waits = decision.waiting
    if o.kotsadm is not None:
        kotsadm = minio.plan_kotsadm(spec, o.kotsadm)
        if kotsadm is not None:
            return kotsadm
    # 10. kubeadm's certificates, one control-plane node at a time.
    renewal = certrotation.plan(spec, o.certificates, o.now)
    if renewal is not None:
        return renewal
    if refusals:
        return refusals[0]
    if minio_waits is not None and minio_waits.poll:
        return Wait(f"MinIO: {minio_waits.message}", POLL)
    unreachable = sorted(n.name for n in o.nodes if not n.ready and n.unreachable_since is not None)
    if unreachable:
        waiting = sorted(set(unreachable) - fenced_names)
        if waiting:
            return Wait(f"unreachable, not fenced: {', '.join(waiting)}", POLL)
        return Wait(f"fenced and cleared, waiting for their return or purge: {', '.join(unreachable)}", POLL)
    return rook or Done()


# ---- the status ---------------------------------------------------------------------------


def describe(step: Step) -> tuple[str, str, str] | None:
    """The step as (node, action, message) for the status, or None for a wait."""
    match step:
        case TaintOutOfService(node, evidence):
            return node, "Clear", f"tainted {OUT_OF_SERVICE_TAINT} (NoExecute): {evidence}"
        case RemoveOutOfService(node, why):
            return node, "Uncordon", f"removed the {OUT_OF_SERVICE_TAINT} taint: {why}"
        case ForceDeletePod(namespace, name, _, node, why):
            return node, "ForceDeletePod", f"force-deleted pod {namespace}/{name}: {why}"
        case ReleaseClaim(namespace, name, _, node, pod):
            return (
                node,
                "ReleaseClaim",
                (
                    f"deleted claim {namespace}/{name}, pinned to fenced node {node}, "
                    f"so pod {pod} can start elsewhere"
                ),
            )
        case ApplyLoadBalancer(settings):
            return (
                "",
                "InternalLoadBalancer",
                (
                    "writing HAProxy's configuration to every node, one at a time: "
                    + (", ".join(map(str, settings.servers)))
                ),
            )
        case RemoveLoadBalancer(namespace, why):
            return (
                "",
                "InternalLoadBalancerOff",
                (
                    f"deleted DaemonSet {namespace}/{internallb.WRITER_NAME} ({why}); HAProxy's files stay "
                    "on the nodes (kubelets may use localhost:6444): remove them by hand if nothing does"
                ),
            )
        case ScaleWorkload(entry, current, to, nodes):
            return (
                "",
                "Scale",
                (
                    f"scaled {scaling.describe(entry)} from {current} to {to} replicas: {nodes} node(s) "
                    f"count for it, {entry.replicas} desired"
                ),
            )
        case PatchRook(_, _, _, _, action, message):
            return "", action, message
        case StartRenewal() | FinishRenewal() | RemoveRenewalPod():
            return certrotation.describe(step)
        case Refuse(node, action, message):
            return node, action, message
        case DecideDeletion(node):
            return node, "Purge", f"deleting Node {node}: every other step of its purge is done"
        case minio_spread.MoveReplica(node=node):
            return node, *minio.describe(step)
        case minio.CreateStatefulSet() | minio.SetServiceSelector() | minio.CopyObjects() | minio.Copied() | \
                minio.RemoveOldMinio() | minio.ScaleKotsadm():  # fmt: skip
            return "", *minio.describe(step)
    return None


def status(
    o: Observed, step: Step, when: datetime, failure: ReconcileError | None = None
) -> MaintenancePolicyStatus:
    """The status after ``step`` (a ``Purge`` acted on is the ``Purged`` that says what it did)."""
    result = o.previous.model_copy(deep=True)
    now = rfc3339(when)
    result.dead_nodes = sorted(n.name for n in dead_nodes(o))
    result.internal_load_balancer = internallb.status(o.spec, o.load_balancer)
    if len(o.workloads) == len(o.spec.auto_resource_scaling):
        result.auto_resource_scaling = scaling.status(o.spec.auto_resource_scaling, o.workloads, o.candidates)
    result.rook = rook_scaling.status(o.spec, o.rook)
    if o.minio is not None:
        decision = minio.plan_minio(o.spec, o.minio, o.previous.minio)
        result.minio = minio.minio_status(
            decision, None if failure else step, o.previous.minio, failure.message if failure else None
        )
    if o.kotsadm is not None:
        scaled = step if isinstance(step, minio.ScaleKotsadm) and failure is None else None
        result.kotsadm = minio.kotsadm_status(o.spec, o.kotsadm, scaled)
    result.certificate_rotation = certrotation.status(o.spec, o.certificates, o.now)
    result.purge_deletions = purge_deletions(o, step, now)

    def conditions(type_: str, value: bool, reason: str, message: str) -> list[Condition]:
        return set_model_condition(
            Condition, result.conditions, type_, value, reason, message, o.generation, when
        )

    if isinstance(step, Ignored):
        result.conditions = conditions("Ready", False, "NotDefault", step.message)
        return result
    result.conditions = conditions("Ready", True, "Applied", "the policy is applied")
    problems = [
        f"node {n.name}: {n.fenced_annotation_problem}" for n in o.nodes if n.fenced_annotation_problem
    ]
    if problems:
        # A fencing agent's word that cannot be read fences nothing: say so where it is seen.
        result.conditions = conditions(
            "FencingAnnotationsValid", False, "InvalidAnnotation", "; ".join(problems)
        )
    elif any(c.type == "FencingAnnotationsValid" for c in result.conditions):
        result.conditions = conditions("FencingAnnotationsValid", True, "AsExpected", "")
    returned = unfinished_purges(o.nodes)
    if returned:
        # A node that came back mid-purge may have lost its etcd member, API endpoint or OSDs:
        # the purge does not go on (it is Ready), so a person must look.
        result.conditions = conditions(
            "PurgeInterrupted",
            True,
            "NodeReturned",
            "; ".join(
                f"node {n.name} is Ready with its purge unfinished (done: {', '.join(n.purge_done)}): "
                f"check it, then finish with `kustos purge-node {n.name}` or remove "
                f"{purge_planner.PURGE_ANNOTATION}"
                for n in returned
            )[:1000],
        )
    elif any(c.type == "PurgeInterrupted" for c in result.conditions):
        result.conditions = conditions("PurgeInterrupted", False, "AsExpected", "")
    described = describe(step)
    if isinstance(step, Purge):
        described = (step.node, "Purge", "purge step")
    elif isinstance(step, Purged):
        described = (step.node, "Purge", step.message)
    if described is None:
        if failure is None:
            result.conditions = conditions("Degraded", False, "AsExpected", "")
        return result
    node, action, message = described
    if failure is not None:
        result.last_action = MaintenanceAction(time=now, node=node, action=action, outcome="Failed",
                                               message=failure.message[:1000])  # fmt: skip
        result.conditions = conditions("Degraded", True, failure.reason, failure.message[:1000])
        return result
    refused = (
        isinstance(step, Refuse)
        or (isinstance(step, Purged) and step.refused)
        or (isinstance(step, FinishRenewal) and step.outcome == "Failed")
    )
    outcome: Literal["Done", "Refused"] = "Refused" if refused else "Done"
    action_record = MaintenanceAction(
        time=now, node=node, action=action, outcome=outcome, message=message[:1000]
    )
    previous = o.previous.last_action
    same = previous is not None and (previous.node, previous.action, previous.outcome, previous.message) == (
        node, action, outcome, action_record.message,
    )  # fmt: skip
    if not same:
        result.last_action = action_record
    if outcome == "Refused":
        if not (o.previous.last_refusal and o.previous.last_refusal.message == action_record.message):
            result.last_refusal = action_record
    elif result.last_refusal is not None and result.last_refusal.node == node:
        result.last_refusal = None
    result.conditions = conditions("Degraded", False, "AsExpected", "")
    return result


def purge_deletions(o: Observed, step: Step, now: str) -> list[PurgeDeletion]:
    """The deletions decided and not yet recorded done, after ``step``. One whose Node is Ready
    again is dropped: that node is no longer dead, and is decided again if it dies again."""
    present = {(n.name, n.uid): n for n in o.nodes}
    kept = [
        d for d in o.previous.purge_deletions
        if (d.node, d.uid) not in present or not present[d.node, d.uid].ready
    ]  # fmt: skip
    if isinstance(step, DecideDeletion):
        return [*kept, PurgeDeletion(node=step.node, uid=step.uid, time=now)]
    if isinstance(step, Purged) and step.finished:
        return [d for d in kept if d.node != step.node]
    return kept


def action_notes(old: MaintenancePolicyStatus, new: MaintenancePolicyStatus) -> list[Note]:
    """An Event for an action the status records anew (a failure shows on Degraded instead)."""
    last = new.last_action
    if last is None or last == old.last_action or last.outcome == "Failed":
        return []
    refused = last.outcome == "Refused"
    return [Note(last.action + ("Refused" if refused else ""), f"{last.node}: {last.message}",
                 "Warning" if refused else "Normal")]  # fmt: skip


def requeue_after(step: Step) -> float:
    """Seconds until the next pass after ``step`` was taken."""
    match step:
        case Wait(_, seconds):
            return seconds
        case Done() | Ignored():
            return RESYNC
        case Refuse():
            return POLL * 2
        case Purged(refused=True):
            return POLL * 2
    return 0.2


__all__ = [
    "ApplyLoadBalancer",
    "ClaimView",
    "DecideDeletion",
    "FinishRenewal",
    "ForceDeletePod",
    "Ignored",
    "NodeView",
    "Observed",
    "PatchRook",
    "PodView",
    "Purge",
    "Purged",
    "Refuse",
    "ReleaseClaim",
    "RemoveLoadBalancer",
    "RemoveOutOfService",
    "RemoveRenewalPod",
    "ScaleWorkload",
    "StartRenewal",
    "Step",
    "TaintOutOfService",
    "dead_nodes",
    "fenced_by",
    "not_fenced",
    "past_toleration",
    "plan",
    "purge_deletions",
    "purge_refusal",
    "ready_counts",
    "status",
    "unfinished_purges",
]
