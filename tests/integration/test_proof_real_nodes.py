"""The proof suite on real kubelet nodes (issue 25, item 2): the catalogue's actions that a real
kubelet does differently, each whole inside one recorded history checked for linearizability.

test_proof.py runs these actions on the process runner, whose agent only mimics a kubelet.
Here the members are containers that a kubelet runs with containerd and runc, on four real
nodes (test_real_nodes_lifecycle's: three hold one member each, the fourth is free for a
replacement). The failures are a real node's:

- a member pod deleted: the kubelet stops the container, and the operator replaces the member;
- a member container killed (its process SIGKILLed through the runtime): the kubelet restarts
  it, and the member stays the same;
- a node partitioned (its kubelet stopped, its pods' bridge ports down, the containers still
  running), a follower's node and then the leader's, each healed: the same members serve on;
- a node stopped (kubelet and containers): the operator replaces the member on the free node.

Each scenario is test_proof's own function, on a cluster of its own whose members outlast a
partition. Not one cluster shared: a write sent to a partitioned member and recorded as
indeterminate was once applied a minute later, 7.6 s into the next scenario's history, where
no client of that history had written it (the checker rightly refused that history).

The rows go to test_proof's report, printed at the module's end and appended to
$KUSTOS_PROOF_REPORT. The histories are kept in ``real-nodes/`` beside the process runner's.

This module is in the full profile only (`make proof`); `make test` deselects it. It starts
real nodes, so run it under the machine-wide real-node lock (docs/proof.md).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.realnode import RealNode
from kustos.proof.catalogue import REAL_NODE_ACTIONS, on_real_nodes
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import wait_healthy
from tests.integration.operator import OperatorProcess
from tests.integration.test_proof import (
    Report,
    checker,
    follower_node_partitioned,
    full_profile_only,
    histories,
    leader_node_partitioned,
    member_container_killed,
    member_node_stopped,
    member_pod_deleted,
    module_report,
    spread_over_three_nodes,
)
from tests.integration.test_real_nodes_lifecycle import (
    FAILURE_TIMEOUT,
    ON_REAL_NODES,
    assert_on_real_nodes,
    delete_cluster,
    kubectl,
    member_pods,
    operator,
    real_nodes,
)

__all__ = ["checker", "histories", "kubectl", "operator", "real_nodes"]  # fixtures, re-exported for pytest

pytestmark = [pytest.mark.integration, pytest.mark.real_nodes, full_profile_only, pytest.mark.timeout(420)]

NUMBERS = itertools.count()


@pytest.fixture(scope="module")
def report() -> Iterator[Report]:
    """Printed once the module ends, and appended to $KUSTOS_PROOF_REPORT (`make proof` runs
    test_proof.py first, which writes it)."""
    yield from module_report("proof report, real kubelet nodes", "Real kubelet nodes", REAL_NODE_ACTIONS)


@pytest.fixture
def real_histories(histories: Path) -> Path:
    """Beside the process runner's histories of the same actions, not over them."""
    where = histories / "real-nodes"
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture
async def spread(
    kubectl: Kubectl, operator: OperatorProcess, real_nodes: list[RealNode]
) -> AsyncIterator[str]:
    """The scenario's own cluster: three members, one per real node, that outlast a partition
    (the fourth node free); deleted after it."""
    name = f"pr{next(NUMBERS)}"
    try:
        status = await spread_over_three_nodes(kubectl, name, ON_REAL_NODES)
        assert_on_real_nodes(kubectl, name, real_nodes, status)
        yield name
    finally:
        delete_cluster(kubectl, name)


async def healthy_on_real_nodes(kubectl: Kubectl, name: str, real_nodes: list[RealNode]) -> dict[str, Any]:
    """The cluster's status once it is whole, every member a container of a real node."""
    status = await wait_healthy(kubectl, name, 3, timeout=180)
    assert_on_real_nodes(kubectl, name, real_nodes, status)
    return status


def containers(kubectl: Kubectl, name: str) -> dict[str, tuple[str, int]]:
    """Each member pod's uid and its etcd container's restart count, as its kubelet reports."""
    return {
        p["metadata"]["name"]: (p["metadata"]["uid"], p["status"]["containerStatuses"][0]["restartCount"])
        for p in member_pods(kubectl, name)
    }


async def test_a_member_container_killed_on_real_nodes_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, spread: str, real_nodes: list[RealNode], real_histories: Path, checker: Path,
    report: Report,
) -> None:  # fmt: skip
    """The member's etcd process SIGKILLed through its node's runtime: its kubelet restarts
    the container in the same pod (its emptyDir kept), and the same member serves on."""
    status = await healthy_on_real_nodes(kubectl, spread, real_nodes)
    before = containers(kubectl, spread)
    victim = await member_container_killed(
        kubectl, spread, status, real_histories, checker, report, key=on_real_nodes("container-killed")
    )
    uid, restarts = containers(kubectl, spread)[victim]
    assert uid == before[victim][0], f"{victim}'s pod was replaced, not its container restarted"
    assert restarts > before[victim][1], f"the kubelet did not restart {victim}'s etcd"
    await healthy_on_real_nodes(kubectl, spread, real_nodes)


async def test_a_real_member_node_partitioned_and_healed_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, spread: str, real_nodes: list[RealNode], real_histories: Path, checker: Path,
    report: Report,
) -> None:  # fmt: skip
    """A follower's real node cut off for half the run (kubelet stopped, its pods' links down,
    the containers running on), then healed: the same members serve on."""
    status = await healthy_on_real_nodes(kubectl, spread, real_nodes)
    await follower_node_partitioned(
        kubectl, spread, status, real_histories, checker, report, key=on_real_nodes("node-partitioned")
    )
    await healthy_on_real_nodes(kubectl, spread, real_nodes)


async def test_the_leaders_real_node_partitioned_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, spread: str, real_nodes: list[RealNode], real_histories: Path, checker: Path,
    report: Report,
) -> None:  # fmt: skip
    """The etcd leader's real node cut off likewise: the other two elect a leader within the
    run; healed, the old leader rejoins as a follower."""
    status = await healthy_on_real_nodes(kubectl, spread, real_nodes)
    await leader_node_partitioned(
        kubectl, spread, status, real_histories, checker, report, key=on_real_nodes("leader-partitioned")
    )
    await healthy_on_real_nodes(kubectl, spread, real_nodes)


async def test_a_member_pod_deleted_on_real_nodes_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, spread: str, real_nodes: list[RealNode], real_histories: Path, checker: Path,
    report: Report,
) -> None:  # fmt: skip
    """A member's pod deleted: its kubelet stops the container, the operator removes the
    member and adds a new one on a real node."""
    status = await healthy_on_real_nodes(kubectl, spread, real_nodes)
    await member_pod_deleted(
        kubectl, spread, status, real_histories, checker, report, key=on_real_nodes("pod-deleted")
    )
    await healthy_on_real_nodes(kubectl, spread, real_nodes)


async def test_a_real_member_node_stopped_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, spread: str, real_nodes: list[RealNode], real_histories: Path, checker: Path,
    report: Report,
) -> None:  # fmt: skip
    """A follower's real node stops (kubelet and containers): once the failure timeout real
    nodes use (20 s) has passed, the operator replaces the member on the free real node."""
    patch = f'{{"spec":{{"memberFailureTimeout":"{FAILURE_TIMEOUT}"}}}}'
    kubectl("patch", "etcdcluster", spread, "--type=merge", "-p", patch)
    status = await healthy_on_real_nodes(kubectl, spread, real_nodes)
    node = await member_node_stopped(
        kubectl, spread, status, real_histories, checker, report, key=on_real_nodes("node-stopped")
    )
    await healthy_on_real_nodes(kubectl, spread, real_nodes)
    assert node not in {p["spec"]["nodeName"] for p in member_pods(kubectl, spread)}
