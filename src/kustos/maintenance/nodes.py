"""A Node (a cache dict) as the maintenance planner sees it, and the provider's word on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kustos.api.maintenance import FENCED_ANNOTATION
from kustos.maintenance.planner import (
    OUT_OF_SERVICE_OWNER,
    OUT_OF_SERVICE_TAINT,
    UNREACHABLE_TAINT,
    NodeView,
)
from kustos.maintenance.purge_planner import PURGE_ANNOTATION, steps_done
from kustos.maintenance.rook_scaling import RookNode
from kustos.runtime import objects
from kustos.runtime.cloud import InstanceState
from kustos.runtime.times import parse_rfc3339


def node_view(node: Mapping[str, Any], instance: InstanceState | None = None) -> NodeView:
    unreachable = [t for t in objects.node_taints(node) if t.get("key") == UNREACHABLE_TAINT]
    since = None
    if unreachable:
        # The node lifecycle controller stamps timeAdded on the NoExecute taint; the NoSchedule
        # one has none: fall back to the Ready condition's transition only when neither says.
        added = [parse_rfc3339(t.get("timeAdded")) for t in unreachable if t.get("timeAdded")]
        since = min((a for a in added if a is not None), default=None) or _not_ready_since(node)
    annotations = objects.annotations(node)
    fenced_at, problem = None, None
    raw = annotations.get(FENCED_ANNOTATION)
    if raw:
        try:
            fenced_at = parse_rfc3339(raw)
        except ValueError:
            problem = f"annotation {FENCED_ANNOTATION}={raw!r} is not an RFC 3339 time"
    out_of_service = any(t.get("key") == OUT_OF_SERVICE_TAINT for t in objects.node_taints(node))
    return NodeView(
        name=objects.name(node),
        ready=objects.node_ready(node),
        uid=objects.uid(node) or "",
        control_plane=objects.is_control_plane(node),
        unreachable_since=since,
        out_of_service=out_of_service,
        out_of_service_ours=out_of_service and OUT_OF_SERVICE_OWNER in annotations,
        fenced_at=fenced_at,
        fenced_annotation_problem=problem,
        instance=instance,
        purge_done=steps_done(annotations),
        hostname=objects.labels(node).get("kubernetes.io/hostname", ""),
    )


def _not_ready_since(node: Mapping[str, Any]) -> Any:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            return parse_rfc3339(condition.get("lastTransitionTime"))
    return None


__all__ = ["node_view"]


def rook_node(node: Mapping[str, Any]) -> RookNode:
    """A Node as Rook's following of the nodes counts it (a node being purged never rejoins)."""
    return RookNode(
        name=objects.name(node),
        ready=objects.node_ready(node),
        labels=tuple(sorted(objects.labels(node).items())),
        purging=bool(objects.annotations(node).get(PURGE_ANNOTATION)),
    )
