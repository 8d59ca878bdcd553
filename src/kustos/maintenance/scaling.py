"""Auto-resource scaling (EKCO's feature of that name, SPEC F-MAINT-11), pure.

A workload that wants one replica per node (anti-affinity, a quorum spread over nodes) cannot
be created at its full size before its nodes have joined: its extra replicas would stay
Pending and health checks would report them. So the policy lists such workloads with the
replicas they want, and kustos raises each, one patch per pass, to as many replicas as there
are Ready, schedulable nodes that count for it (``nodeSelector``), never above what it wants.

It only scales up. EKCO also scales down when nodes go (its Prometheus and Alertmanager to
``min(2 or 3, nodes)``); kustos does not: a lost node usually comes back, a StatefulSet scaled
down loses its highest ordinal, not the replica on the lost node, and a count the user set
higher is theirs. The patch is guarded by the count it read, so a count the user raised
meanwhile is never lowered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kustos.api.maintenance import ScaledResource, ScalingState


@dataclass(frozen=True)
class Candidate:
    """A node as scaling counts it."""

    name: str
    ready: bool
    unschedulable: bool = False
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class WorkloadView:
    """What one listed workload says now: its replicas, or why they cannot be read."""

    replicas: int | None
    problem: str = ""


@dataclass(frozen=True)
class ScaleWorkload:
    """Patch one workload's replicas from ``current`` to ``to`` (guarded by ``current``)."""

    entry: ScaledResource
    current: int
    to: int
    nodes: int


def describe(entry: ScaledResource) -> str:
    return f"{entry.kind} {entry.namespace}/{entry.name}"


def replicas_at(obj: Mapping[str, Any], path: str) -> int | None:
    """The integer at a dotted path (None: absent or not an integer)."""
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def json_pointer(path: str) -> str:
    return "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in path.split("."))


def eligible(entry: ScaledResource, nodes: Sequence[Candidate]) -> int:
    """Ready, schedulable nodes carrying every label of the entry's nodeSelector."""
    wanted = entry.node_selector.items()
    return sum(1 for n in nodes if n.ready and not n.unschedulable and wanted <= dict(n.labels).items())


def plan(
    entries: Sequence[ScaledResource], views: Sequence[WorkloadView], nodes: Sequence[Candidate]
) -> ScaleWorkload | None:
    """The first workload below what its nodes allow, raised to that (never above desired)."""
    for entry, view in zip(entries, views, strict=True):
        count = eligible(entry, nodes)
        target = min(entry.replicas, count)
        if view.replicas is not None and view.replicas < target:
            return ScaleWorkload(entry, view.replicas, target, count)
    return None


def status(
    entries: Sequence[ScaledResource], views: Sequence[WorkloadView], nodes: Sequence[Candidate]
) -> list[ScalingState]:
    rows = []
    for entry, view in zip(entries, views, strict=True):
        count = eligible(entry, nodes)
        if view.replicas is None:
            message = view.problem
        elif view.replicas >= entry.replicas:
            message = f"at {view.replicas} of {entry.replicas} desired replicas"
        elif view.replicas < min(entry.replicas, count):
            message = f"scaling to {min(entry.replicas, count)}: {count} node(s) count for it"
        else:
            where = f" with {', '.join(f'{k}={v}' for k, v in sorted(entry.node_selector.items()))}"
            message = (
                f"waiting for nodes: {entry.replicas} desired, {view.replicas} now; {count} Ready, "
                f"schedulable node(s){where if entry.node_selector else ''}, "
                f"{entry.replicas - count} more needed"
            )
        rows.append(ScalingState(workload=describe(entry), desired=entry.replicas, replicas=view.replicas,
                                 nodes=count, message=message[:500]))  # fmt: skip
    return rows
