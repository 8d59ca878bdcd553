"""The NodeImage planner: which node to replace next and how far each replacement is. Pure.

The controller observes the NodeImage, every Node (with its instance's group and image
from the cloud provider), the PendingNodes, the provider's groups and instances, and the
health gates; ``plan`` names the one step to take, ``status`` the status after it.

A replacement, in the order the steps come:

1. ``CreateHeir``: a Join PendingNode records the intent (with the group's instances known
   so far), then the provider grows the group by one. Heirs in flight per role never
   exceed maxSurge; workers wait while a control-plane node is outdated.
2. ``ClaimInstance``: the first instance of the group that no node, no PendingNode and no
   earlier snapshot knows is this Join's instance (a restarted operator finds it the same way,
   so it never asks for a second one).
3. ``Pair``: once the new node is Ready on the desired image, it becomes the heir of an
   outdated node (the donor) of its group: the heir's ``kustos.dev/donor`` annotation is the
   pairing, written in one patch with the donor's user labels and taints.
4. ``Drain``: cordon and evict (PodDisruptionBudgets honoured) once the health gates hold
   and maxUnavailable allows; past drainTimeout ``wait`` names the blocking pods,
   ``force`` deletes them.
5. ``RemoveEtcdMember``: a control-plane donor's stacked etcd member, only if quorum stays.
6. ``DeleteDonor``: a Leave PendingNode, the instance, then the Node.

A new node no outdated node needs (the rollout ended or changed its image, or the group
created it from another image) is drained like a donor, loses its stacked etcd member if it
is a control-plane node, and is deleted (``RetireObsolete``). No control-plane node is
replaced or retired while ``spec.etcd`` is unset: whether its etcd member must be removed is
the user's word (``Held``, Degraded names the field).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kustos.api.common import Condition
from kustos.api.nodeimage import NodeImageSpec, NodeImageStatus, ReplacementStatus, RolloutPolicy
from kustos.nodes.labels import user_key
from kustos.runtime.cloud import Role
from kustos.runtime.conditions import set_model_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.objects import Taint
from kustos.runtime.steps import Done, Wait
from kustos.runtime.times import parse_duration

DRAIN_ATTEMPT_SECONDS = 5.0  # one pass evicts for this long at most, then looks again
ROLES = (Role.CONTROL_PLANE, Role.WORKER)


# ---- what the controller observes ----------------------------------------------------------


@dataclass(frozen=True)
class NodeView:
    name: str
    provider_id: str = ""
    group: str | None = None
    """The provider group of its instance; None when no group knows the instance."""
    image: str | None = None
    """The image its instance was created from (the provider's word)."""
    ready: bool = True
    unschedulable: bool = False
    donor: str | None = None
    """kustos.dev/donor: the node this one is the heir of."""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    drain_started: datetime | None = None
    drained: bool = False
    etcd_member_removed: bool = False
    internal_ip: str = ""
    deleting: bool = False


@dataclass(frozen=True)
class GroupView:
    group_id: str
    role: Role
    image: str
    """The image the provider creates new instances of the group from."""
    instances: tuple[str, ...] = ()
    """Provider IDs of the group's instances that are not gone."""


@dataclass(frozen=True)
class PendingView:
    name: str
    group: str
    goal: str  # Join | Leave
    provider_id: str = ""
    known: tuple[str, ...] = ()
    """A Join without provider ID: the group's instances before it asked for one."""
    node_image: str = ""


@dataclass(frozen=True)
class Gate:
    """One health gate: ``ok`` or ``message`` says why not; ``nodes`` limits it to steps on those
    nodes (None: every step)."""

    name: str
    ok: bool
    message: str = ""
    nodes: frozenset[str] | None = None


@dataclass(frozen=True)
class Observed:
    name: str
    spec: NodeImageSpec
    nodes: tuple[NodeView, ...]
    groups: tuple[GroupView, ...]
    pending: tuple[PendingView, ...] = ()
    gates: tuple[Gate, ...] = ()
    now: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    generation: int | None = None
    previous: NodeImageStatus = field(default_factory=NodeImageStatus)
    provider: bool = True
    """False when kustos runs without a cloud provider: the rollout waits."""
    malformed: tuple[str, ...] = ()
    """Annotations kustos could not read (node, key, value), reported in Degraded; the planner
    sees them as absent, and the next step on that node writes them anew."""


# ---- steps ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateHeir:
    group: str
    role: Role
    known: tuple[str, ...]
    pending_name: str


@dataclass(frozen=True)
class ClaimInstance:
    pending: str
    provider_id: str
    node_name: str


@dataclass(frozen=True)
class Pair:
    heir: str
    donor: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    pending: str | None
    """The heir's Join PendingNode, deleted once paired."""


@dataclass(frozen=True)
class ForgetPending:
    """A Join whose node is paired (or whose pairing the previous pass wrote): delete it."""

    pending: str


@dataclass(frozen=True)
class Drain:
    donor: str
    force: bool = False
    """drainTimeout passed and onDrainTimeout is force: delete the blocking pods."""
    started: bool = False
    """The drain began in an earlier pass (its start is on the Node)."""


@dataclass(frozen=True)
class RemoveEtcdMember:
    donor: str
    internal_ip: str
    heir_ip: str = ""
    """The heir's InternalIP: its member must have joined, healthy, before the donor's leaves
    (so the membership never shrinks below its size while nodes are replaced)."""


@dataclass(frozen=True)
class DeleteDonor:
    donor: str
    group: str
    provider_id: str
    role: Role
    heir: str = ""
    """Its heir, whose pairing annotation goes once the donor is gone."""


@dataclass(frozen=True)
class RetireObsolete:
    """A new node no outdated node needs as heir (the rollout ended or was reverted)."""

    node: str
    group: str
    provider_id: str
    role: Role
    pending: str | None


@dataclass(frozen=True)
class Invalid:
    message: str


@dataclass(frozen=True)
class Held(Wait):
    """A wait only the user can end: Degraded (``condition``) says what to change."""

    condition: str = "Held"


ETCD_UNSET = (
    "spec.etcd is unset: set spec.etcd (enabled: true for kubeadm's stacked etcd, enabled: false "
    "for an external etcd) before control-plane nodes are replaced, so that no dead etcd member "
    "is left behind"
)


Step = (
    CreateHeir | ClaimInstance | Pair | ForgetPending | Drain | RemoveEtcdMember | DeleteDonor
    | RetireObsolete | Invalid | Held | Wait | Done
)  # fmt: skip


# ---- arithmetic --------------------------------------------------------------------------------


def resolve(value: int | str, total: int, round_up: bool) -> int:
    """An IntOrString against ``total`` nodes: ``25%`` of 10 is 3 rounded up, 2 down."""
    if isinstance(value, int):
        return value
    percent = int(value.rstrip("%"))
    exact = total * percent / 100
    return math.ceil(exact) if round_up else math.floor(exact)


def surge(policy: RolloutPolicy, total: int) -> int:
    """Heirs in flight at once; at least 1 (a heir always comes before its donor goes)."""
    return max(1, resolve(policy.max_surge, total, round_up=True))


def unavailable(policy: RolloutPolicy, total: int) -> int:
    return max(0, resolve(policy.max_unavailable, total, round_up=False))


def policy_for(spec: NodeImageSpec, role: Role) -> RolloutPolicy:
    return spec.control_plane if role == Role.CONTROL_PLANE else spec.workers


def user_labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if user_key(k)}


def user_taints(taints: Sequence[Taint]) -> tuple[Taint, ...]:
    return tuple(t for t in taints if user_key(t.key))


def pending_name(image_name: str, group: str, known: Sequence[str], joins: Sequence[str] = ()) -> str:
    """A deterministic name: the same intent in a restarted pass (or one reading a cache that
    lags behind its own create) is the same object, so the create conflicts and the provider is
    not asked twice. ``joins`` (the group's Join PendingNodes already there) tells a second
    intent from the first while the provider has not listed the first one's instance yet."""
    import hashlib

    parts = [group, *sorted(known), "\0joins", *sorted(joins)]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]
    return f"{image_name[:40]}-join-{digest}".lower()


# ---- the classification --------------------------------------------------------------------------


@dataclass
class View:
    """The nodes sorted into the states status reports (every list sorted by name)."""

    by_name: dict[str, NodeView]
    role_of_group: dict[str, Role]
    invalid: list[str] = field(default_factory=list)
    up_to_date: list[str] = field(default_factory=list)
    outdated: list[str] = field(default_factory=list)
    pairs: list[tuple[NodeView, NodeView]] = field(default_factory=list)
    """(donor, heir)"""
    joining: list[PendingView] = field(default_factory=list)
    """Join PendingNodes whose node is not yet paired."""
    leaving: list[PendingView] = field(default_factory=list)

    def role(self, node: NodeView) -> Role | None:
        return self.role_of_group.get(node.group or "")

    @property
    def donors(self) -> list[str]:
        return sorted(d.name for d, _ in self.pairs)

    @property
    def heirs(self) -> list[str]:
        return sorted(h.name for _, h in self.pairs)


def classify(o: Observed) -> View:
    by_name = {n.name: n for n in o.nodes}
    role_of_group = {g.group_id: g.role for g in o.groups}
    view = View(by_name, role_of_group)
    paired_donors: dict[str, NodeView] = {}
    heirs: set[str] = set()
    for node in sorted(o.nodes, key=lambda n: n.name):
        donor = by_name.get(node.donor or "")
        if donor is not None and donor.name != node.name and donor.name not in paired_donors:
            paired_donors[donor.name] = node
            heirs.add(node.name)
    joiners: set[str] = set()
    for p in sorted(o.pending, key=lambda p: p.name):
        if p.goal == "Leave":
            view.leaving.append(p)
            continue
        joined = _node_of(o, p)
        if joined is not None and joined.name in heirs:
            continue  # paired: ForgetPending deletes it
        view.joining.append(p)
        if joined is not None:
            joiners.add(joined.name)
    for node in sorted(o.nodes, key=lambda n: n.name):
        if node.name in heirs or node.name in joiners:
            continue
        if node.name in paired_donors:
            view.pairs.append((node, paired_donors[node.name]))
        elif not node.provider_id or node.group is None or node.group not in role_of_group:
            view.invalid.append(node.name)
        elif node.image == o.spec.image:
            view.up_to_date.append(node.name)
        else:
            view.outdated.append(node.name)
    view.pairs.sort(key=lambda p: p[0].name)
    return view


def _node_of(o: Observed, pending: PendingView) -> NodeView | None:
    if not pending.provider_id:
        return None
    return next((n for n in o.nodes if n.provider_id == pending.provider_id), None)


# ---- the plan ----------------------------------------------------------------------------------


def _gate_failure(o: Observed, involved: set[str]) -> str | None:
    for gate in o.gates:
        if gate.ok:
            continue
        if gate.nodes is None or gate.nodes & involved:
            return f"gate {gate.name}: {gate.message}"
    return None


def _role_total(view: View, role: Role) -> int:
    """The role's node count the budgets are counted against: every node but heirs and joiners."""
    return sum(
        1
        for name in (*view.up_to_date, *view.outdated, *view.donors)
        if view.role(view.by_name[name]) == role
    )


def _available(o: Observed, view: View, role: Role) -> int:
    return sum(
        1
        for n in o.nodes
        if view.role(n) == role and n.ready and not n.unschedulable and not n.deleting
        and n.name not in view.invalid
    )  # fmt: skip


def _unavailable_room(o: Observed, view: View, role: Role) -> int:
    """How many more nodes of the role may become unavailable now."""
    total = _role_total(view, role)
    allowed = unavailable(policy_for(o.spec, role), total)
    return _available(o, view, role) - (total - allowed)


def _drain_deadline_passed(o: Observed, donor: NodeView) -> bool:
    if donor.drain_started is None:
        return False
    return o.now - donor.drain_started >= parse_duration(o.spec.drain_timeout)


def _advance_pair(o: Observed, view: View, donor: NodeView, heir: NodeView, involved: set[str]) -> Step:
    role = view.role(donor) or view.role(heir) or Role.WORKER
    wanted_labels = user_labels(donor.labels)
    wanted_taints = user_taints(donor.taints)
    if any(heir.labels.get(k) != v for k, v in wanted_labels.items()) or not set(wanted_taints) <= set(
        heir.taints
    ):
        return Pair(heir.name, donor.name, wanted_labels, wanted_taints, None)
    if role == Role.CONTROL_PLANE and o.spec.etcd is None:
        return Held(f"before replacing {donor.name}: {ETCD_UNSET}", 30, "EtcdUnset")
    if not donor.drained:
        if not heir.ready:
            return Wait(f"heir {heir.name} of {donor.name} is not Ready", 5)
        if not donor.unschedulable and donor.drain_started is None:
            gate = _gate_failure(o, involved)
            if gate is not None:
                return Wait(f"before draining {donor.name}: {gate}", 5)
            if _unavailable_room(o, view, role) < 1:
                return Wait(f"maxUnavailable: draining {donor.name} would leave too few {role} nodes", 5)
        force = _drain_deadline_passed(o, donor) and o.spec.on_drain_timeout == "force"
        return Drain(donor.name, force=force, started=donor.drain_started is not None)
    stacked = role == Role.CONTROL_PLANE and o.spec.etcd is not None and o.spec.etcd.enabled
    if stacked and not donor.etcd_member_removed:
        gate = _gate_failure(o, involved)
        if gate is not None:
            return Wait(f"before removing {donor.name}'s etcd member: {gate}", 5)
        return RemoveEtcdMember(donor.name, donor.internal_ip, heir.internal_ip)
    gate = _gate_failure(o, involved)
    if gate is not None:
        return Wait(f"before deleting {donor.name}: {gate}", 5)
    return DeleteDonor(donor.name, donor.group or heir.group or "", donor.provider_id, role, heir.name)


def _claim(o: Observed, view: View, p: PendingView) -> Step | None:
    group = next((g for g in o.groups if g.group_id == p.group), None)
    if group is None:
        return None
    claimed = {q.provider_id for q in o.pending if q.provider_id}
    known = set(p.known)
    for provider_id in sorted(group.instances):
        if provider_id in known or provider_id in claimed:
            continue
        node = next((n for n in o.nodes if n.provider_id == provider_id), None)
        return ClaimInstance(p.name, provider_id, node.name if node else "")
    return None


def plan(o: Observed) -> Step:
    if not o.provider:
        return Wait("no cloud provider configured (kustos run --cloud-provider)", 60)
    view = classify(o)
    # 1. Bookkeeping first: a Join that asked for an instance claims it.
    for p in view.joining:
        if not p.provider_id:
            step = _claim(o, view, p)
            if step is not None:
                return step
    for p in o.pending:
        node = _node_of(o, p)
        if p.goal == "Join" and node is not None and node.name in view.heirs:
            return ForgetPending(p.name)
    if o.spec.paused:
        return Wait("paused", 30)
    # 2. Replacements under way, oldest donor first; the first that can move moves.
    involved = {d.name for d, _ in view.pairs}
    waits: list[Wait] = []
    for donor, heir in view.pairs:
        step = _advance_pair(o, view, donor, heir, involved | {heir.name})
        if not isinstance(step, Wait):
            return step
        waits.append(step)
    # 3. New nodes that joined: pair each with an outdated node of its group, or retire it.
    for p in view.joining:
        node = _node_of(o, p)
        if node is None or not node.ready or node.image is None:
            continue
        retiring = node.drain_started is not None or node.drained or node.etcd_member_removed
        candidates = [view.by_name[n] for n in view.outdated if view.by_name[n].group == node.group]
        if node.image == o.spec.image and candidates and not retiring:
            donor = candidates[0]
            return Pair(node.name, donor.name, user_labels(donor.labels), user_taints(donor.taints), p.name)
        # Not needed, or joined on another image (the group created it from the old one, or
        # spec.image changed since): it would never be paired, so it goes like a donor.
        step = _retire(o, view, node, p)
        if not isinstance(step, Wait):
            return step
        waits.append(step)
    # 4. More heirs, control plane first.
    for role in ROLES:
        step = _create_heir(o, view, role)
        if step is not None:
            return step
        if role == Role.CONTROL_PLANE and _role_busy(o, view, role):
            waits.append(Wait("workers wait while the control plane is replaced", 5))
            break
    if waits:
        return next((w for w in waits if isinstance(w, Held)), waits[0])
    if view.joining:
        return Wait(f"waiting for {len(view.joining)} new node(s) to join", 5)
    if view.outdated:
        return Wait(f"{len(view.outdated)} outdated node(s) wait for a free slot", 5)
    return Done()


def _retire(o: Observed, view: View, node: NodeView, p: PendingView) -> Step:
    """A joined node no donor needs: drained (it may run pods by now), its stacked etcd member
    removed, then deleted."""
    role = view.role(node) or Role.WORKER
    if role == Role.CONTROL_PLANE and o.spec.etcd is None:
        return Held(f"before retiring {node.name}: {ETCD_UNSET}", 30, "EtcdUnset")
    if not node.drained:
        if node.drain_started is None and not node.unschedulable:
            gate = _gate_failure(o, {node.name})
            if gate is not None:
                return Wait(f"before draining {node.name}: {gate}", 5)
        force = _drain_deadline_passed(o, node) and o.spec.on_drain_timeout == "force"
        return Drain(node.name, force=force, started=node.drain_started is not None)
    stacked = role == Role.CONTROL_PLANE and o.spec.etcd is not None and o.spec.etcd.enabled
    if stacked and not node.etcd_member_removed:
        gate = _gate_failure(o, {node.name})
        if gate is not None:
            return Wait(f"before removing {node.name}'s etcd member: {gate}", 5)
        return RemoveEtcdMember(node.name, node.internal_ip)
    return RetireObsolete(node.name, node.group or "", node.provider_id, role, p.name)


def _role_busy(o: Observed, view: View, role: Role) -> bool:
    nodes = (view.by_name[n] for n in (*view.outdated, *view.donors))
    if any(view.role(n) == role for n in nodes):
        return True
    return any(view.role_of_group.get(p.group) == role for p in view.joining)


def _create_heir(o: Observed, view: View, role: Role) -> Step | None:
    outdated = [view.by_name[n] for n in view.outdated if view.role(view.by_name[n]) == role]
    joining = [p for p in view.joining if view.role_of_group.get(p.group) == role]
    if len(outdated) <= len(joining):
        return None
    in_flight = len(joining) + sum(1 for d, _ in view.pairs if view.role(d) == role)
    if in_flight >= surge(policy_for(o.spec, role), _role_total(view, role)):
        return None
    # The group with the most outdated nodes not yet matched by a joining node.
    need: Counter[str] = Counter(n.group or "" for n in outdated)
    need.subtract(Counter(p.group for p in joining))
    group_id, count = max(sorted(need.items()), key=lambda item: item[1])
    if count <= 0:
        return None
    group = next(g for g in o.groups if g.group_id == group_id)
    if role == Role.CONTROL_PLANE and o.spec.etcd is None:
        return Held(f"{len(outdated)} outdated control-plane node(s) wait: {ETCD_UNSET}", 30, "EtcdUnset")
    if group.image != o.spec.image:
        return Wait(f"group {group_id} still creates nodes from {group.image} (ScalingGroup syncing)", 3)
    joins = [p.name for p in o.pending if p.goal == "Join" and p.group == group_id]
    name = pending_name(o.name, group_id, group.instances, joins)
    return CreateHeir(group_id, role, group.instances, name)


# ---- the status -------------------------------------------------------------------------------------


def step_name(step: Step) -> str:
    return type(step).__name__


def _phase(o: Observed, donor: NodeView) -> str:
    if donor.drained:
        etcd = o.spec.etcd is not None and o.spec.etcd.enabled
        return "RemovingEtcdMember" if etcd and not donor.etcd_member_removed else "Deleting"
    return "Draining" if donor.unschedulable or donor.drain_started else "WaitingForHeir"


def status(o: Observed, step: Step, now: datetime, failure: ReconcileError | None = None) -> NodeImageStatus:
    """The whole status after ``step`` (acted on unless ``failure`` says it failed)."""

    def _set(
        o: Observed, conditions: list[Condition], type_: str, value: bool, reason: str, message: str
    ) -> list[Condition]:
        return set_model_condition(
            Condition, conditions, type_, value, reason, message[:1000], o.generation, now
        )

    view = classify(o)
    result = o.previous.model_copy(deep=True)
    result.up_to_date = view.up_to_date
    result.outdated = view.outdated
    result.donors = view.donors
    result.heirs = view.heirs
    result.invalid = view.invalid
    result.pending = sorted(p.name for p in view.joining)
    if isinstance(step, RetireObsolete) and failure is None:
        result.obsolete = sorted({*result.obsolete, step.node})[-20:]
    replacements = []
    for donor, heir in view.pairs:
        phase = _phase(o, donor)
        replacements.append(
            ReplacementStatus(donor=donor.name, heir=heir.name, group=donor.group or "", phase=phase)
        )
    counted = len(view.up_to_date) + len(view.outdated) + len(view.donors)
    result.progress = f"{len(view.up_to_date)}/{counted}"
    result.step = step_name(step)
    waiting = step.reason if isinstance(step, Wait) else None
    if failure is not None:
        waiting = failure.message[:1000]
    result.waiting_for = waiting
    for r in replacements:
        if waiting and r.donor in waiting:
            r.message = waiting
    result.replacements = replacements
    conditions = list(o.previous.conditions)
    done = isinstance(step, Done)
    if isinstance(step, Invalid):
        conditions = _set(o, conditions, "Degraded", True, "InvalidSpec", step.message)
        result.conditions = conditions
        return result
    conditions = _set(
        o, conditions, "Available", done, "AllNodesUpToDate" if done else "Rolling",
        f"every node runs {o.spec.image}" if done else f"{result.progress} nodes run {o.spec.image}",
    )  # fmt: skip
    conditions = _set(
        o, conditions, "Progressing", not done, "Replacing" if not done else "Complete",
        (waiting or f"step {result.step}") if not done else "",
    )  # fmt: skip
    conditions = _set(o, conditions, "Paused", o.spec.paused, "Paused" if o.spec.paused else "Running", "")
    if failure is not None:
        conditions = _set(o, conditions, "Degraded", True, failure.reason, failure.message)
    elif isinstance(step, Held):
        conditions = _set(o, conditions, "Degraded", True, step.condition, step.reason)
    elif o.malformed:
        message = "unreadable annotations (taken as absent): " + "; ".join(o.malformed)
        conditions = _set(o, conditions, "Degraded", True, "MalformedAnnotation", message)
    elif any(c.type == "Degraded" and c.status == "True" for c in conditions):
        conditions = _set(o, conditions, "Degraded", False, "AsExpected", "")
    result.conditions = conditions
    return result


def unobserved(
    previous: NodeImageStatus, failure: ReconcileError, generation: int | None, now: datetime
) -> NodeImageStatus:
    """The status when the world could not be observed (the provider refused): what was known
    stays, Degraded and waitingFor say why nothing moves."""
    result = previous.model_copy(deep=True)
    result.waiting_for = failure.message[:1000]
    result.conditions = set_model_condition(
        Condition,
        previous.conditions,
        "Degraded",
        True,
        failure.reason,
        failure.message[:1000],
        generation,
        now,
    )
    return result


def requeue_after(step: Step) -> float | None:
    if isinstance(step, Wait):
        return step.seconds
    if isinstance(step, Done):
        return 60.0
    return 0.5


__all__ = [
    "ClaimInstance", "CreateHeir", "DeleteDonor", "Drain", "ForgetPending", "Gate", "GroupView", "Held",
    "Invalid", "NodeView", "Observed", "Pair", "PendingView", "RemoveEtcdMember", "RetireObsolete", "Step",
    "Taint", "classify", "plan", "requeue_after", "resolve", "status", "surge", "unavailable",
]  # fmt: skip
