"""Typed accessors and facts over the plain dicts the informer caches hold.

Controllers read objects as the API server sent them (no model building on the hot
path); these helpers keep ``obj["metadata"]["name"]``-style lookups, and the small
judgements every family makes (is this pod ready, is that node lost), in one place.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from kustos.runtime.times import parse_rfc3339

Obj = dict[str, Any]

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# kubeadm's control-plane role label, and the one it used before 1.20.
CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


class HasMetadata(Protocol):
    """A typed resource (``kustos.api`` models): its metadata is the plain dict."""

    @property
    def metadata(self) -> Mapping[str, Any]: ...


Object = Mapping[str, Any] | HasMetadata
"""A plain dict from a cache, or a typed resource: the accessors read either."""


def _meta(obj: Object) -> Mapping[str, Any]:
    meta: Mapping[str, Any] | None = obj.get("metadata") if isinstance(obj, Mapping) else obj.metadata
    return meta or {}


def name(obj: Object) -> str:
    return str(_meta(obj)["name"])


def namespace(obj: Object) -> str | None:
    value = _meta(obj).get("namespace")
    return str(value) if value else None


def key(obj: Object) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object: the work-queue key."""
    ns = namespace(obj)
    return f"{ns}/{name(obj)}" if ns else name(obj)


def split_key(value: str) -> tuple[str | None, str]:
    """A key back into (namespace or None, name)."""
    ns, _, rest = value.rpartition("/")
    return (ns or None), rest


def labels(obj: Object) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def annotations(obj: Object) -> dict[str, str]:
    return dict(_meta(obj).get("annotations") or {})


def uid(obj: Object) -> str | None:
    value = _meta(obj).get("uid")
    return str(value) if value else None


def generation(obj: Object) -> int | None:
    value = _meta(obj).get("generation")
    return int(value) if value is not None else None


def resource_version(obj: Object) -> str | None:
    value = _meta(obj).get("resourceVersion")
    return str(value) if value else None


def deleting(obj: Object) -> bool:
    """Whether the object has a deletionTimestamp (it waits only for finalizers)."""
    return bool(_meta(obj).get("deletionTimestamp"))


def deletion_deadline(obj: Object) -> datetime | None:
    """When a graceful deletion ends (the deletionTimestamp: the kubelet kills what still runs
    then), None when the object is not being deleted."""
    return parse_rfc3339(_meta(obj).get("deletionTimestamp"))


def owner_of(obj: Object, kind: str) -> str | None:
    """The name of the owner of kind ``kind`` (the controlling one first), or None."""
    refs = [r for r in _meta(obj).get("ownerReferences") or [] if r.get("kind") == kind]
    refs.sort(key=lambda r: not r.get("controller"))
    return str(refs[0]["name"]) if refs else None


def _condition(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    if obj is None:
        return None
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def pod_ready(pod: Mapping[str, Any], *, trust_containers: bool = False) -> bool:
    """The pod's Ready condition is True.

    ``trust_containers``: also ready when it runs and every container says ready. The
    node lifecycle controller marks a lost node's pods NotReady and not every kubelet
    (kwok's, for one) flips the condition back, so a controller that judges the node
    separately may count the containers' own readiness.
    """
    condition = _condition(pod, "Ready")
    if condition is not None and condition.get("status") == "True":
        return True
    if not trust_containers:
        return False
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    return bool(containers) and status.get("phase") == "Running" and all(c.get("ready") for c in containers)


def pod_running(pod: Mapping[str, Any]) -> bool:
    """Some container of the pod is running."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (s.get("state") or {}) for s in statuses)


def running_since(pod: Mapping[str, Any]) -> datetime | None:
    """When the latest-started running container started (None if none runs)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    started = [((s.get("state") or {}).get("running") or {}).get("startedAt") for s in statuses]
    moments = [m for m in (parse_rfc3339(s) for s in started if s) if m is not None]
    return max(moments) if moments else None


def pod_node(pod: Mapping[str, Any]) -> str | None:
    value = (pod.get("spec") or {}).get("nodeName")
    return str(value) if value else None


def mirror_pod(pod: Object) -> bool:
    """A static pod's mirror: the kubelet owns it, the API cannot evict it."""
    return MIRROR_ANNOTATION in (_meta(pod).get("annotations") or {})


def node_ready(node: Mapping[str, Any] | None) -> bool:
    """The node's Ready condition is True (False for an absent node)."""
    condition = _condition(node, "Ready")
    return condition is not None and condition.get("status") == "True"


def node_lost(node: Mapping[str, Any] | None) -> bool:
    """Absent, not Ready (Unknown or False), or tainted unreachable by the node lifecycle controller."""
    if node is None or not node_ready(node):
        return True
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == UNREACHABLE_TAINT for t in taints)


def node_unschedulable(node: Mapping[str, Any] | None) -> bool:
    return bool(node is not None and (node.get("spec") or {}).get("unschedulable"))


# ---- nodes: the facts every family reads off a Node ----------------------------------------


@dataclass(frozen=True)
class Taint:
    """A Node taint as a planner compares it (timeAdded left out: it is when, not what)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect} if self.value else {
            "key": self.key, "effect": self.effect,
        }  # fmt: skip


def node_taints(node: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The Node's taints as the API server has them (timeAdded included)."""
    return list(((node or {}).get("spec") or {}).get("taints") or [])


def taints(node: Mapping[str, Any] | None) -> tuple[Taint, ...]:
    return tuple(
        Taint(t.get("key", ""), t.get("value", ""), t.get("effect", "NoSchedule")) for t in node_taints(node)
    )


def tolerates(
    taint: Taint, key: str = "", operator: str = "Equal", value: str = "", effect: str = ""
) -> bool:
    """One toleration (a pod spec's fields) tolerates ``taint``, as the scheduler matches them: an
    empty effect matches every effect, Exists with an empty key every taint."""
    if effect and effect != taint.effect:
        return False
    if operator == "Exists":
        return not key or key == taint.key
    return key == taint.key and value == taint.value


def pod_tolerates(taint: Taint, tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Some toleration of a pod spec's ``tolerations`` tolerates ``taint``."""
    return any(
        tolerates(taint, str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                  str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in tolerations
    )  # fmt: skip


def provider_id(node: Mapping[str, Any] | None) -> str:
    """``spec.providerID`` (e.g. ``aws:///us-east-1a/i-0abc``); "" when the Node has none."""
    return str(((node or {}).get("spec") or {}).get("providerID") or "")


def internal_ip(node: Mapping[str, Any] | None) -> str:
    """The Node's InternalIP address; "" when it reports none."""
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address") or "")
    return ""


def is_control_plane(node: Mapping[str, Any]) -> bool:
    """kubeadm's role label (or the one it used before 1.20)."""
    found = labels(node)
    return any(label in found for label in CONTROL_PLANE_LABELS)


def annotation_time(
    obj: Object | None, key: str, malformed: list[str] | None = None, kind: str = "node"
) -> datetime | None:
    """An RFC 3339 annotation; one that is not (a hand edit, another tool) is taken as absent and
    said in ``malformed``, instead of failing every pass over every node."""
    if obj is None:
        return None
    text = annotations(obj).get(key)
    if not text:
        return None
    try:
        moment = parse_rfc3339(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        if malformed is not None:
            malformed.append(f"{kind} {name(obj)} annotation {key}={text[:64]!r} is not an RFC 3339 time")
        return None
    return moment


__all__ = [
    "CONTROL_PLANE_LABELS",
    "Taint",
    "annotation_time",
    "annotations",
    "deleting",
    "generation",
    "internal_ip",
    "is_control_plane",
    "key",
    "labels",
    "mirror_pod",
    "name",
    "namespace",
    "node_lost",
    "node_ready",
    "node_taints",
    "node_unschedulable",
    "owner_of",
    "pod_node",
    "pod_ready",
    "pod_running",
    "provider_id",
    "resource_version",
    "running_since",
    "split_key",
    "taints",
    "uid",
]  # fmt: skip


def _without_heartbeat(obj: Mapping[str, Any]) -> dict[str, Any]:
    ignored = ("resourceVersion", "managedFields")
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ignored}
    status = dict(obj.get("status") or {})
    if "conditions" in status:
        status["conditions"] = [
            {k: v for k, v in c.items() if k != "lastHeartbeatTime"} for c in status["conditions"] or []
        ]
    return {**obj, "metadata": meta, "status": status}


def changed_beyond_heartbeat(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """False for an update that only renewed heartbeats (a Node's condition lastHeartbeatTime) or the
    resourceVersion: with many nodes those arrive several times a second, and waking every
    controller that watches nodes for them turns a failing reconcile's backoff into a hot loop."""
    return _without_heartbeat(old) != _without_heartbeat(new)


def changed_beyond_status(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update changed more than the status (and resourceVersion, managedFields): its
    spec (generation), labels, annotations, finalizers, owners, deletion. A status-only change to
    a controller's own object is usually that controller's record of a pass."""
    ignored = ("resourceVersion", "managedFields")

    def rest(obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ignored}
        return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}

    return rest(old) != rest(new)
