"""MinIO's replicas kept spread over the nodes, decided without I/O (maintenance/minio_spread.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kustos.api.maintenance import MaintenancePolicySpec, MinioStatus
from kustos.maintenance import minio, minio_spread, planner
from kustos.maintenance.minio import DISABLED_SELECTOR, STATEFULSET_LABELS, MinioView, StatefulSetView
from kustos.maintenance.minio_spread import MoveReplica, Replica, Spread

NS = "minio"
NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
SPEC = MaintenancePolicySpec()
POOL = {"nodeSelector": {"pool": "storage"},
        "tolerations": [{"key": "pool", "operator": "Exists", "effect": "NoSchedule"}]}  # fmt: skip


def node(name: str, *, ready: bool = True, cordoned: bool = False, labels: dict[str, str] | None = None,
         taints: tuple[dict[str, str], ...] = ()) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name, "labels": {"pool": "storage"} if labels is None else labels},
        "spec": {"unschedulable": cordoned, "taints": list(taints)},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "Unknown"}]},
    }


def placed(*nodes: str, ready: int = 6) -> tuple[Replica, ...]:
    """Replicas ha-minio-0.. on these nodes, the first ``ready`` of them Ready, running for a minute."""
    return tuple(
        Replica(f"ha-minio-{i}", f"uid-{i}", where, i < ready, f"10.0.0.{i}:9000", f"data-ha-minio-{i}",
                f"c{i}", started=NOW - timedelta(minutes=1))
        for i, where in enumerate(nodes)
    )  # fmt: skip


def spread(*nodes: str, eligible: tuple[str, ...] = ("a", "b", "c"), **changes: Any) -> Spread:
    return Spread(
        placed(*nodes, ready=changes.pop("ready", 6)), eligible, **{"spare": True, "now": NOW, **changes}
    )


def test_the_nodes_counted_are_those_a_replica_may_be_scheduled_on() -> None:
    """As the scheduler's spread counts them (nodeAffinityPolicy and nodeTaintsPolicy Honor)
    and could place one: a node NotReady or tainted not-ready for a moment is left out."""
    nodes = [
        node("a"),
        node("b", taints=({"key": "pool", "value": "storage", "effect": "NoSchedule"},)),  # tolerated
        node("c", taints=({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},)),
        node("d", ready=False),
        node("e", cordoned=True),
        node("f", labels={}),  # another pool
        node("g", taints=({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"},)),
        node("h", taints=({"key": "busy", "effect": "PreferNoSchedule"},)),  # never blocks
        node("i", taints=({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},)),
    ]
    assert minio_spread.eligible_nodes(nodes, POOL) == ("a", "b", "h")
    anywhere = {"tolerations": [{"operator": "Exists"}]}
    assert minio_spread.eligible_nodes(nodes, anywhere) == ("a", "b", "c", "f", "g", "h", "i")


def test_three_and_three_on_two_of_three_nodes_moves_one_replica_off_the_fullest() -> None:
    """The failure seen under a loaded run: node c was out of the count when the replicas were
    placed. One replica moves, its claim with it (its local volume would pin it to node a)."""
    step = minio_spread.plan(NS, spread("a", "b", "a", "b", "a", "b"), 6)
    assert isinstance(step, MoveReplica)
    assert (step.pod, step.node, step.claim, step.uid, step.claim_uid) == (
        "ha-minio-4", "a", "data-ha-minio-4", "uid-4", "c4"
    )  # fmt: skip
    assert "node a holds 3 replicas" in step.why and "node c holds 0" in step.why


def test_one_replica_per_pass_until_two_per_node() -> None:
    """Each pass moves one replica; the scheduler puts it on the emptiest node (the skew allows
    nothing else); two passes later the spread is two per node and nothing more moves."""
    nodes = ["a", "b", "a", "b", "a", "b"]
    moves = 0
    while (step := minio_spread.plan(NS, spread(*nodes), 6)) is not None:
        assert isinstance(step, MoveReplica)
        counts = Counter(nodes)
        nodes[int(step.pod.rsplit("-", 1)[1])] = min("abc", key=lambda n: counts[n])
        moves += 1
    assert moves == 2 and sorted(Counter(nodes).values()) == [2, 2, 2]


def test_a_spread_within_the_share_stays() -> None:
    assert minio_spread.plan(NS, spread("a", "b", "c", "a", "b", "c"), 6) is None
    # Two nodes eligible (c NotReady): three each is their share.
    assert minio_spread.plan(NS, spread("a", "b", "a", "b", "a", "b", eligible=("a", "b")), 6) is None
    # Four nodes: two on each of three and none on the fourth is within the share of two.
    assert (
        minio_spread.plan(NS, spread("a", "b", "c", "a", "b", "c", eligible=("a", "b", "c", "d")), 6) is None
    )
    # Replicas on a cordoned node are not counted against the others.
    assert minio_spread.plan(NS, spread("a", "a", "b", "b", "e", "e", eligible=("a", "b")), 6) is None


def test_nothing_moves_unless_every_replica_is_ready_and_minio_can_spare_it() -> None:
    """MinIO keeps its quorum: a move only while all six serve, MinIO's maintenance check says
    the cluster keeps write quorum without that server, and no drive heals (a replica moved
    before has a fresh one)."""
    assert minio_spread.plan(NS, spread("a", "b", "a", "b", "a", "b", ready=5), 6) is None
    assert (
        minio_spread.plan(NS, Spread(placed("a", "b", "a", "b", "a"), ("a", "b", "c"), True, now=NOW), 6)
        is None
    )
    # The replica moved before runs for less than SETTLE: its fresh drive may not be formatted yet,
    # offline without MinIO saying so.
    fresh = list(placed("a", "b", "a", "b", "a", "b"))
    fresh[5] = dataclasses.replace(fresh[5], started=NOW - timedelta(seconds=12))
    young = minio_spread.plan(NS, Spread(tuple(fresh), ("a", "b", "c"), True, now=NOW), 6)
    assert isinstance(young, str) and "has run 30 s" in young, "said, and looked at again soon"
    fresh[5] = dataclasses.replace(fresh[5], started=NOW - timedelta(seconds=30))
    assert isinstance(
        minio_spread.plan(NS, Spread(tuple(fresh), ("a", "b", "c"), True, now=NOW), 6), MoveReplica
    )
    healing = minio_spread.plan(NS, spread("a", "b", "a", "b", "a", "b", healing=1), 6)
    assert isinstance(healing, str) and "healed 1 drive(s)" in healing and "ha-minio-4" in healing
    refused = minio_spread.plan(NS, spread("a", "b", "a", "b", "a", "b", spare=False), 6)
    assert isinstance(refused, str) and minio_spread.MAINTENANCE_CHECK in refused
    unasked = minio_spread.plan(NS, spread("a", "b", "a", "b", "a", "b", spare=None), 6)
    assert isinstance(unasked, str)


def test_a_move_begun_before_is_finished() -> None:
    """An operator stopped between the claim's deletion and the pod's: the next pass deletes that
    pod (its claim goes only then), even with the replicas otherwise spread."""
    replicas = list(placed("a", "b", "c", "a", "b", "c"))
    replicas[2] = dataclasses.replace(replicas[2], claim_deleting=True)
    step = minio_spread.plan(NS, Spread(tuple(replicas), ("a", "b", "c"), True, now=NOW), 6)
    assert isinstance(step, MoveReplica) and step.pod == "ha-minio-2" and "already being deleted" in step.why


@given(st.lists(st.sampled_from("abcdef"), min_size=6, max_size=6), st.integers(min_value=1, max_value=6))
def test_moves_end_with_no_node_above_its_share(start: list[str], eligible_count: int) -> None:
    """Whatever the placement, with the scheduler putting each moved replica on an emptiest node,
    the moves end within six with no eligible node above its share, ceil(6 / nodes): what one
    node's loss costs MinIO. A placement already like that moves nothing (on four nodes 2/2/2/0
    stays: a move would wipe a drive and lower no node's loss)."""
    eligible = tuple("abcdef"[:eligible_count])
    nodes = [n if n in eligible else eligible[0] for n in start]
    share = -(-6 // eligible_count)
    within = max(Counter(nodes).values()) <= share
    moves = 0
    while (step := minio_spread.plan(NS, spread(*nodes, eligible=eligible), 6)) is not None:
        assert isinstance(step, MoveReplica) and not within
        counts = {n: nodes.count(n) for n in eligible}
        nodes[int(step.pod.rsplit("-", 1)[1])] = min(eligible, key=lambda n: counts[n])
        moves += 1
        assert moves <= 6
    assert max(nodes.count(n) for n in eligible) <= share


# ---- in the move ---------------------------------------------------------------------------


def moved(unbalanced: Spread, **changes: Any) -> MinioView:
    statefulset = StatefulSetView(replicas=6, ready=sum(r.ready for r in unbalanced.replicas),
                                  target="10.0.0.0:9000", healthy=True, spread=unbalanced)  # fmt: skip
    base: dict[str, Any] = {"namespace": NS, "deployment": None, "statefulset": statefulset,
                            "selector": STATEFULSET_LABELS, "storage_class": True,
                            "ready_nodes": 3}  # fmt: skip
    return MinioView(**{**base, **changes})


def test_after_the_move_a_replica_moves_and_the_phase_stays_migrated() -> None:
    previous = MinioStatus(phase="Migrated", message="deleted Deployment minio/minio", objects=31, copied=31)
    observed = planner.Observed(spec=SPEC, nodes=(), minio=moved(spread("a", "b", "a", "b", "a", "b")),
                                previous=planner.MaintenancePolicyStatus(minio=previous))  # fmt: skip
    step = planner.plan(observed)
    assert isinstance(step, MoveReplica) and step.pod == "ha-minio-4"
    status = planner.status(observed, step, observed.now)
    assert status.minio is not None and status.minio.phase == "Migrated"
    assert (status.minio.objects, status.minio.copied) == (31, 31)
    assert "deleted claim data-ha-minio-4 and pod minio/ha-minio-4 on node a" in status.minio.message
    assert status.last_action is not None
    assert (status.last_action.node, status.last_action.action) == ("a", "MinioRebalance")
    notes = planner.action_notes(observed.previous, status)
    assert [n.reason for n in notes] == ["MinioRebalance"]


def test_migrated_says_how_many_replicas_are_ready_and_where() -> None:
    """Migrated promises the data moved, verified, and MinIO served by the StatefulSet; it does not
    promise six ready replicas, so the message says how many are, read again until all are."""
    coming = minio.plan_minio(SPEC, moved(spread("a", "b", "c", "a", "b", "c", ready=4)), None)
    assert coming.step is None and coming.waiting is not None
    assert coming.waiting.phase == "Migrated" and coming.waiting.poll
    assert "4 of 6 replicas ready; per node: a 2, b 2, c 2" in coming.waiting.message
    status = minio.minio_status(coming, None, MinioStatus(phase="Migrated", message="deleted"))
    assert status is not None and "4 of 6 replicas ready" in status.message
    settled = minio.plan_minio(SPEC, moved(spread("a", "b", "c", "a", "b", "c")), None)
    assert settled.waiting is not None and not settled.waiting.poll
    assert "6 of 6 replicas ready" in settled.waiting.message
    waits = minio.plan_minio(SPEC, moved(spread("a", "b", "a", "b", "a", "b", healing=2)), None)
    assert waits.waiting is not None and waits.waiting.poll and "healed 2 drive(s)" in waits.waiting.message


def test_before_the_copy_the_replicas_are_spread_first_and_not_while_offline() -> None:
    """Moving a replica of the still empty StatefulSet costs no data; once MinIO is offline for the
    copy, the copy comes first."""
    old = minio.DeploymentView(uid="u1", template={"spec": {"containers": [{"name": "minio", "env": [
        {"name": "MINIO_ROOT_USER", "value": "u"}, {"name": "MINIO_ROOT_PASSWORD", "value": "p"}]}]}},
        source="10.0.0.99:9000")  # fmt: skip
    unbalanced = spread("a", "b", "a", "b", "a", "b")
    before = minio.plan_minio(SPEC, moved(unbalanced, deployment=old, selector={"app": "minio"}), None)
    assert isinstance(before.step, MoveReplica)
    waiting = minio.plan_minio(
        SPEC,
        moved(dataclasses.replace(unbalanced, spare=False), deployment=old, selector={"app": "minio"}),
        None,
    )
    assert waiting.step is None and waiting.waiting is not None
    assert waiting.waiting.phase == "WaitingForStatefulSet" and waiting.waiting.poll
    copying = minio.plan_minio(
        SPEC, moved(unbalanced, deployment=old, selector=DISABLED_SELECTOR), MinioStatus(phase="Copying")
    )
    assert isinstance(copying.step, minio.CopyObjects)
