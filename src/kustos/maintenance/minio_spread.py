"""MinIO's replicas kept spread over the nodes once they run (EKCO's rebalance), pure.

The StatefulSet's topology spread constraint (maxSkew 1 per node, DoNotSchedule) places a
replica only when it is created; nothing moves one placed while a node was out of the count.
A node NotReady for a moment (a kubelet's heartbeat late under load) carries the node lifecycle
controller's ``not-ready``/``unreachable`` NoSchedule taints, which the replicas do not
tolerate, so the scheduler (``nodeTaintsPolicy: Honor``) leaves that node out of the domains and
three and three on the other two has skew 0; its NoExecute twin can evict replicas already there
into the same placement. A user was promised two per node on three nodes: any one node lost then
keeps four of six drives, MinIO's quorum.

So once every replica is Ready, a node holding more than its share, ceil(replicas / eligible
nodes), while an eligible node holds fewer, gives up one replica: its claim and its pod are
deleted (the claim's local volume pins a pod to its node), the StatefulSet makes both again, and
the scheduler puts the pod where the skew allows, on an emptier node; MinIO heals the fresh
drive from the others. One replica per pass, and only while MinIO says the cluster keeps write
quorum without that replica's server, no drive is healing, and every replica's server has run
for SETTLE seconds. The last is for the drive moved before: MinIO formats a fresh drive only at
its first new-drive check, 10 s after its server starts, and reports it healing from then on;
before that the drive is merely offline, which the two checks do not show (one offline drive
leaves five of six, above the write quorum of four).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from math import ceil
from typing import Any

from kustos.runtime import objects

MAINTENANCE_CHECK = "/minio/health/cluster?maintenance=true"
"""200 when the cluster keeps write quorum without the server asked, 412 when not."""
HEALING_HEADER = "x-minio-healing-drives"
"""MinIO's cluster check says how many drives heal (absent: none)."""
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
"""The taint effects that keep a pod off a node, and a node out of the spread's domains."""
SETTLE = timedelta(seconds=30)
"""How long every replica's server runs before one moves: three of MinIO's 10 s new-drive checks."""


@dataclass(frozen=True)
class Replica:
    name: str
    uid: str
    node: str | None
    ready: bool
    address: str | None = None
    """host:port of its MinIO server (asked whether the cluster can spare it)."""
    claim: str | None = None
    claim_uid: str | None = None
    claim_deleting: bool = False
    """Its claim is being deleted: a move begun by an earlier pass (the pod is still to go)."""
    started: datetime | None = None
    """When its MinIO container started running (None: not running)."""


@dataclass(frozen=True)
class Spread:
    replicas: tuple[Replica, ...] = ()
    """The StatefulSet's pods, not those being deleted."""
    eligible: tuple[str, ...] = ()
    """The nodes a replica may be scheduled on now (``eligible_nodes``)."""
    spare: bool | None = None
    """MinIO at the replica ``candidate`` picks answered MAINTENANCE_CHECK with 200 (None: not asked)."""
    healing: int = 0
    """Drives MinIO reports healing."""
    now: datetime | None = None


@dataclass(frozen=True)
class MoveReplica:
    """Delete one replica's claim and pod, so that the StatefulSet makes them again elsewhere."""

    namespace: str
    pod: str
    uid: str
    claim: str | None
    claim_uid: str | None
    node: str
    why: str


def eligible_nodes(nodes: Iterable[Mapping[str, Any]], pod_spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The nodes the scheduler counts as the spread's domains for these pods and could place one
    on: Ready, not cordoned, matching the pod's nodeSelector, every NoSchedule or NoExecute taint
    tolerated."""
    selector = dict(pod_spec.get("nodeSelector") or {})
    tolerations = list(pod_spec.get("tolerations") or [])
    found = []
    for node in nodes:
        if not objects.node_ready(node) or objects.node_unschedulable(node):
            continue
        labels = objects.labels(node)
        if any(labels.get(key) != value for key, value in selector.items()):
            continue
        if any(
            taint.effect in SCHEDULING_EFFECTS and not objects.pod_tolerates(taint, tolerations)
            for taint in objects.taints(node)
        ):
            continue
        found.append(objects.name(node))
    return tuple(sorted(found))


def per_node(spread: Spread) -> dict[str, int]:
    """Replicas on each eligible node (those elsewhere, on a cordoned node say, are not counted)."""
    counts = dict.fromkeys(spread.eligible, 0)
    for replica in spread.replicas:
        if replica.node in counts:
            counts[replica.node] += 1
    return counts


def candidate(spread: Spread, replicas: int) -> tuple[Replica, str] | None:
    """The replica to move and why, MinIO's answer aside (it is asked about this one replica)."""
    begun = next((r for r in spread.replicas if r.claim_deleting), None)
    if begun is not None:
        return begun, f"its claim {begun.claim} is already being deleted (a move begun before)"
    if len(spread.replicas) != replicas or not all(r.ready for r in spread.replicas) or not spread.eligible:
        return None
    counts = per_node(spread)
    share = ceil(replicas / len(counts))
    names = sorted(counts)
    fullest = max(names, key=lambda n: counts[n])
    emptiest = min(names, key=lambda n: counts[n])
    if counts[fullest] <= share or counts[emptiest] >= share:
        return None
    replica = max((r for r in spread.replicas if r.node == fullest), key=lambda r: r.name)
    return replica, (
        f"node {fullest} holds {counts[fullest]} replicas, more than its share of {share} over "
        f"{len(counts)} eligible nodes, while node {emptiest} holds {counts[emptiest]}"
    )


def _settled(spread: Spread) -> bool:
    """Every replica's server has run for SETTLE."""
    now = spread.now
    started = [r.started for r in spread.replicas]
    return now is not None and all(s is not None and now - s >= SETTLE for s in started)


def plan(namespace: str, spread: Spread, replicas: int) -> MoveReplica | str | None:
    """A replica to move, why a move waits for MinIO, or None when the spread needs nothing."""
    picked = candidate(spread, replicas)
    if picked is None:
        return None
    replica, why = picked
    if not _settled(spread):
        return (
            f"replica {replica.name} moves once every replica's server has run {SETTLE.seconds} s "
            f"(a fresh drive is formatted at MinIO's first new-drive check): {why}"
        )
    if spread.healing:
        return f"replica {replica.name} moves once MinIO has healed {spread.healing} drive(s): {why}"
    if not spread.spare or replica.node is None:
        return (
            f"replica {replica.name} moves once MinIO keeps write quorum without it "
            f"({MAINTENANCE_CHECK} at {replica.address or 'its address'}): {why}"
        )
    return MoveReplica(
        namespace, replica.name, replica.uid, replica.claim, replica.claim_uid, replica.node, why
    )


def summary(spread: Spread, replicas: int) -> str:
    """What a user checks: how many replicas are ready, and how many run on each node."""
    ready = sum(1 for r in spread.replicas if r.ready)
    placed: dict[str, int] = {}
    for replica in spread.replicas:
        where = replica.node or "(unscheduled)"
        placed[where] = placed.get(where, 0) + 1
    nodes = ", ".join(f"{node} {count}" for node, count in sorted(placed.items())) or "none"
    return f"{ready} of {replicas} replicas ready; per node: {nodes}"


def describe(step: MoveReplica) -> str:
    claim = f"claim {step.claim} and " if step.claim else ""
    return (
        f"deleted {claim}pod {step.namespace}/{step.pod} on node {step.node}, to be made again on "
        f"another node: {step.why}"
    )
