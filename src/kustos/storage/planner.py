"""What a StorageCluster needs next, and what its status says (pure: no I/O, no clock;
``now`` comes from the injected clock).

``plan(observed)`` picks one step: finish a deletion, refuse (another cluster is active,
or the spec cannot be deployed), hold still (pause or maintenance), wait (key-value
endpoints not known yet), take the finalizer, apply what is out of date, prune what is
no longer wanted, or nothing. ``status(observed, step, now, failure)`` derives the status
from the same observation, so a restarted operator reports and does exactly the same; a
step that failed puts its error on the Progressing condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kustos.runtime.conditions import set_condition
from kustos.runtime.errors import ReconcileError
from kustos.runtime.steps import WARNING, Done, Note, Wait
from kustos.storage.manifests import HASH_ANNOTATION

Obj = dict[str, Any]
ObjKey = tuple[str, str, str]  # (kind, namespace or "", name)


def key_of(obj: Obj) -> ObjKey:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace") or "", meta["name"]


def hash_of(obj: Obj) -> str:
    return str((obj["metadata"].get("annotations") or {}).get(HASH_ANNOTATION, ""))


def template_images(obj: Obj) -> tuple[tuple[str, str], ...]:
    """(container, image) of a workload's pod template, init containers included; () otherwise."""
    pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    return tuple(sorted((str(c.get("name")), str(c.get("image"))) for c in containers))


@dataclass(frozen=True)
class PodView:
    name: str
    node: str
    phase: str
    ready: bool
    node_ready: bool
    deleting: bool = False
    image: str = ""


@dataclass(frozen=True)
class Observed:
    generation: int
    deleting: bool = False
    has_finalizer: bool = False
    pause: bool = False
    maintenance: str | None = None
    """The StorageUpgrade named by the maintenance annotation."""
    active_elsewhere: str | None = None
    """``namespace/name`` of the StorageCluster active in this Kubernetes cluster, if another."""
    refusals: tuple[str, ...] = ()
    waiting: str | None = None
    desired: tuple[Obj, ...] = ()
    current: Mapping[ObjKey, str] = field(default_factory=dict)
    """Live objects carrying this cluster's label (not being deleted) -> their applied hash."""
    current_images: Mapping[ObjKey, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Live workloads -> their template's images: someone else changing an image (a
    StorageUpgrade that was abandoned, a hand edit) is drift the hash cannot see."""
    pods: tuple[PodView, ...] = ()
    desired_scheduled: int | None = None
    """The node DaemonSet's status.desiredNumberScheduled; None when it does not exist."""
    previous_phase: str | None = None
    previous_conditions: tuple[Obj, ...] = ()
    kv_endpoints: tuple[str, ...] = ()
    node_image: str | None = None


@dataclass(frozen=True)
class ClusterSummary:
    """One StorageCluster anywhere in the Kubernetes cluster, for choosing the active one."""

    key: str  # namespace/name
    created: str  # metadata.creationTimestamp (RFC 3339 sorts as text)
    was_active: bool  # its status says Active=True
    deleting: bool = False


def choose_active(clusters: list[ClusterSummary]) -> str | None:
    """The one StorageCluster allowed to act: once active, a cluster stays so (even while it
    is being deleted and cleans up); otherwise the oldest live one, by name on a tie."""
    pool = [c for c in clusters if c.was_active] or [c for c in clusters if not c.deleting]
    if not pool:
        return None
    return min(pool, key=lambda c: (c.created, c.key)).key


# ---- steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Inactive:
    active: str


@dataclass(frozen=True)
class Refuse:
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Hold:
    reason: str  # "Paused" or "StorageUpgrade"
    message: str


@dataclass(frozen=True)
class AddFinalizer:
    pass


@dataclass(frozen=True)
class Apply:
    objects: tuple[Obj, ...]


@dataclass(frozen=True)
class Prune:
    keys: tuple[ObjKey, ...]


@dataclass(frozen=True)
class Cleanup:
    keys: tuple[ObjKey, ...]


@dataclass(frozen=True)
class RemoveFinalizer:
    pass


Step = Done | Wait | Inactive | Refuse | Hold | AddFinalizer | Apply | Prune | Cleanup | RemoveFinalizer

# Cluster-scoped and namespace objects go last on cleanup: what uses them goes first.
_CLEANUP_LAST = ("ServiceAccount", "ClusterRoleBinding", "ClusterRole", "Namespace")


def plan(o: Observed) -> Step:
    if o.deleting:
        if not o.has_finalizer:
            return Done()
        if o.current:
            order = {kind: i for i, kind in enumerate(_CLEANUP_LAST)}
            keys = sorted(o.current, key=lambda k: (order.get(k[0], -1), k))
            return Cleanup(tuple(keys))
        return RemoveFinalizer()
    if o.active_elsewhere is not None:
        return Inactive(o.active_elsewhere)
    if o.refusals:
        return Refuse(o.refusals)
    if o.maintenance is not None:
        return Hold("StorageUpgrade", f"maintenance for StorageUpgrade {o.maintenance}")
    if o.pause:
        return Hold("Paused", "spec.pause is true")
    if o.waiting is not None:
        return Wait(o.waiting)
    if not o.has_finalizer:
        return AddFinalizer()
    stale = tuple(
        obj
        for obj in o.desired
        if o.current.get(key_of(obj)) != hash_of(obj)
        or o.current_images.get(key_of(obj), template_images(obj)) != template_images(obj)
    )
    if stale:
        return Apply(stale)
    wanted = {key_of(obj) for obj in o.desired}
    leftovers = tuple(sorted(k for k in o.current if k not in wanted))
    if leftovers:
        return Prune(leftovers)
    return Done()


# ---- status --------------------------------------------------------------------------


def ready_counts(o: Observed) -> tuple[int, int]:
    live = [p for p in o.pods if not p.deleting]
    ready = sum(1 for p in live if p.ready and p.node_ready)
    return ready, max(o.desired_scheduled or 0, len(live))


def phase(o: Observed, step: Step) -> str:
    if o.deleting:
        return "Terminating"
    if isinstance(step, Inactive):
        return "Pending"
    if isinstance(step, Hold):
        return "Paused"
    ready, total = ready_counts(o)
    if o.desired_scheduled is None and not o.pods:
        return "Pending" if isinstance(step, Refuse | Wait) or not o.has_finalizer else "Creating"
    if total == 0 or (ready < total and o.previous_phase not in ("Running", "Degraded", "Paused")):
        return "Creating"
    return "Running" if ready == total else "Degraded"


def node_health(o: Observed) -> dict[str, Obj]:
    health: dict[str, Obj] = {}
    for p in sorted(o.pods, key=lambda p: p.name):
        if p.deleting or not p.node:
            continue
        message = ""
        if not p.node_ready:
            message = f"node {p.node} is not ready"
        elif not p.ready:
            message = f"pod {p.name} is {p.phase or 'not ready'}"
        health[p.node] = {
            "pod": p.name,
            "phase": p.phase,
            "ready": p.ready and p.node_ready,
            "message": message,
        }
    return health


def describe(step: Step) -> str:
    match step:
        case Done():
            return "every generated object matches the spec"
        case Wait(reason=reason):
            return reason
        case Inactive(active=active):
            return f"StorageCluster {active} is already active in this Kubernetes cluster; this one waits"
        case Refuse(reasons=reasons):
            return "; ".join(reasons)
        case Hold(message=message):
            return message
        case AddFinalizer():
            return "taking the finalizer before creating anything"
        case Apply(objects=objects):
            return "applying " + ", ".join(f"{k} {n}" for k, _, n in map(key_of, objects))
        case Prune(keys=keys) | Cleanup(keys=keys):
            return "deleting " + ", ".join(f"{k} {n}" for k, _, n in keys)
        case RemoveFinalizer():
            return "everything it created is gone"
    return str(step)


def status(o: Observed, step: Step, now: datetime, failure: ReconcileError | None = None) -> Obj:
    """The status to record (conditions keep their transition times while unchanged); a
    ``failure`` of the step's action shows on Progressing."""
    ready, total = ready_counts(o)
    current_phase = phase(o, step)
    health = node_health(o)
    gen = o.generation
    conditions = [dict(c) for c in o.previous_conditions]

    def put(type_: str, value: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, value, reason, message, gen, now)

    inactive = isinstance(step, Inactive)
    put("Active", not inactive, "AnotherClusterActive" if inactive else "ActiveCluster",
        describe(step) if inactive else "this is the active StorageCluster")  # fmt: skip
    refused = isinstance(step, Refuse)
    put("SpecValid", not refused, "InvalidSpec" if refused else "Valid", describe(step) if refused else "")
    available = total > 0 and ready > 0
    put(
        "Available",
        available,
        "NodesReady" if available else "NoNodeReady",
        f"{ready}/{total} node pods ready",
    )
    progressing = isinstance(step, Apply | Prune | AddFinalizer | Wait) or current_phase == "Creating"
    if failure is not None:
        put("Progressing", True, failure.reason, f"{describe(step)} failed: {failure.message}"[:1000])
    else:
        put("Progressing", progressing, type(step).__name__, describe(step))
    degraded = refused or current_phase == "Degraded"
    if refused:
        reason, message = "InvalidSpec", describe(step)
    elif degraded:
        down = [f"{node}: {h['message']}" for node, h in health.items() if not h["ready"]]
        reason, message = "NodesNotReady", "; ".join(down) or f"{ready}/{total} node pods ready"
    else:
        reason, message = "AsExpected", ""
    put("Degraded", degraded, reason, message)
    if isinstance(step, Hold):
        put("Maintenance", True, step.reason, step.message)
    else:
        put("Maintenance", False, "NotInMaintenance", "")
    result: Obj = {
        "phase": current_phase,
        "ready": f"{ready}/{total}",
        "nodes": sorted(health),
        "nodeHealthStatus": health,
        "kvEndpoints": list(o.kv_endpoints),
        "conditions": conditions,
    }
    if o.node_image:
        result["nodeImage"] = o.node_image
    return result


def status_notes(old: Obj, new: Obj) -> list[Note]:
    """Events for what the new status says that the old did not: a transition, not a pass."""

    def became(type_: str, value: str) -> Obj | None:
        before = next((c for c in old.get("conditions") or [] if c.get("type") == type_), None) or {}
        after = next((c for c in new.get("conditions") or [] if c.get("type") == type_), None) or {}
        if after.get("status") != value:
            return None
        same = (before.get("status"), before.get("message")) == (value, after.get("message"))
        return None if same else after

    notes = []
    if (active := became("Active", "False")) is not None:
        notes.append(Note("AnotherClusterActive", str(active.get("message", "")), WARNING))
    if (invalid := became("SpecValid", "False")) is not None:
        notes.append(Note("InvalidSpec", str(invalid.get("message", ""))[:500], WARNING))
    if (held := became("Maintenance", "True")) is not None:
        reason = "Maintenance" if held.get("reason") == "StorageUpgrade" else "Paused"
        notes.append(Note(reason, str(held.get("message", ""))))
    if new.get("phase") != old.get("phase") and old.get("phase"):
        notes.append(Note("PhaseChanged", f"{old.get('phase')} -> {new['phase']}"))
    return notes


STEADY_RESYNC = 15.0
AFTER_STEP = 0.2


def requeue_after(step: Step) -> float:
    """Seconds until the next pass after ``step`` was taken."""
    match step:
        case Done() | Inactive() | Refuse() | Hold() | RemoveFinalizer():
            return STEADY_RESYNC
        case Wait(seconds=seconds):
            return seconds
        case Prune() | Cleanup():
            return 1.0
    return AFTER_STEP


__all__ = [
    "AddFinalizer",
    "Apply",
    "Cleanup",
    "ClusterSummary",
    "Done",
    "Hold",
    "Inactive",
    "Observed",
    "PodView",
    "Prune",
    "Refuse",
    "RemoveFinalizer",
    "Step",
    "Wait",
    "choose_active",
    "key_of",
    "plan",
    "requeue_after",
    "status",
    "status_notes",
]
