"""The proof suite's node actions (issue 25): members moved off nodes that are drained or
replaced, each whole inside one recorded history checked for linearizability.

A drain (`kubectl drain`, evictions) and a NodeImage rollout (heirs, drains, donors deleted)
both make kustos move etcd members: the budget refuses the eviction, the operator adds the
replacement, promotes it and only then lets the member go. These scenarios run that under
the recorder's load, on the dev cluster's process-runner nodes (kwok Nodes, member pods as
processes) as test_proof's do, and with the clients following etcd's member list (a move
gives a member a new address, as etcd's client's auto-sync sees it).

Full profile only (`make proof`): `make test`'s short profile deselects them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from kustos.nodes.cloud.kwok import GROUP_LABEL
from kustos.proof.catalogue import NODE_ACTIONS
from kustos.proof.recorder import Workload
from kustos.runtime.api import Api
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import assert_consistent, etcd_cluster, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_drains import kubectl_drain, member_nodes
from tests.integration.test_etcd_drains import operator as operator  # the product's lease timings
from tests.integration.test_nodeimage import (
    ETCDCLUSTERS,
    NEW,
    NODEIMAGES,
    Fleet,
    all_replaced,
    api,
    apply_cluster,
    fleet,
    node_image,
    operator_running,
    start_fleet,
)
from tests.integration.test_proof import (
    Report,
    checker,
    felt,
    full_profile_only,
    histories,
    leader_of,
    member_urls,
    module_report,
    profile,
    proven,
    workload,
)

__all__ = ["api", "checker", "fleet", "histories", "operator"]  # fixtures, re-exported for pytest

pytestmark = pytest.mark.process_runner(
    "members moved over more nodes than real nodes fit, under a recorded load"
)


@pytest.fixture(scope="module")
def report() -> Iterator[Report]:
    """Printed once the module ends, and appended to $KUSTOS_PROOF_REPORT (`make proof` runs
    test_proof.py first, which writes it)."""
    yield from module_report("proof report, node actions", "Node actions", NODE_ACTIONS)


def moving_load(status: dict[str, Any], key: str, seconds: float) -> Workload:
    """The profile's load for at least ``seconds``, its clients following etcd's member list:
    every move gives a member a new address."""
    load = profile()
    duration = max(load.duration, seconds)
    return replace(
        workload(member_urls(status), key),
        duration=duration,
        max_operations=int(load.rate * duration * 1.5),
        follow_members=True,
    )


@dataclass
class QuorumWatch:
    """The fewest healthy voting members the EtcdCluster reported, and every phase, sampled
    every half second through the API (no blocking call: the recorder shares the loop)."""

    api: Api
    namespace: str
    name: str
    fewest_healthy: int | None = None
    phases: set[str] = field(default_factory=set)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            cluster = await self.api.get(ETCDCLUSTERS, self.namespace, self.name) or {}
            status = cluster.get("status") or {}
            self.phases.add(str(status.get("phase")))
            voters = [m for m in status.get("members") or [] if not m.get("learner")]
            if voters:
                healthy = sum(1 for m in voters if m.get("healthy"))
                if self.fewest_healthy is None or healthy < self.fewest_healthy:
                    self.fewest_healthy = healthy
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    def assert_quorum_kept(self) -> None:
        assert "QuorumLost" not in self.phases, self.phases
        assert self.fewest_healthy is not None and self.fewest_healthy >= 2, self.fewest_healthy


@contextlib.asynccontextmanager
async def watching_quorum(api: Api, namespace: str, name: str) -> AsyncIterator[QuorumWatch]:
    watch = QuorumWatch(api, namespace, name)
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        yield watch
    finally:
        stop.set()
        await task


async def timed(seconds: list[float], work: Callable[[], Awaitable[None]], after: float) -> None:
    """``work`` started ``after`` seconds into the load; its length goes to ``seconds``."""
    await asyncio.sleep(after)
    began = time.monotonic()
    await work()
    seconds.append(time.monotonic() - began)


def moved_off_events(kubectl: Kubectl) -> str:
    return kubectl("get", "events", "--field-selector", "involvedObject.kind=EtcdCluster")


DRAIN_LOAD = 180.0  # seconds of load at least: three drains (15-20 s each idle, twice that loaded)


@full_profile_only
@pytest.mark.timeout(1200)
async def test_every_member_node_drained_in_turn_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, api: Api, histories: Path, checker: Path, report: Report
) -> None:
    """Node maintenance as people do it, under load: each node that holds a member is drained
    (`kubectl drain`, evictions the budget refuses), a follower's first and the leader's last,
    and uncordoned once its drain returns. Each member moves (replacement first) before its
    pod goes; every drain completes by itself inside one history."""
    # One member per node, so each drain moves exactly one; the default failure timeout: a
    # member slowed by a loaded machine is not "dead" mid-move.
    kubectl.apply(etcd_cluster("dr", 3, memberFailureTimeout="60s", pod={"antiAffinity": "required"}))
    status = await wait_healthy(kubectl, "dr", 3)

    async def budget_steady() -> bool:
        pdb = kubectl.get("pdb", "dr")
        return pdb["spec"]["minAvailable"] == 3 and (pdb.get("status") or {}).get("currentHealthy") == 3

    await wait_until(budget_steady, "a steady budget that allows no eviction", timeout=30)
    nodes = member_nodes(kubectl, "dr")
    leader = leader_of(status)
    order = sorted(nodes.values(), key=lambda node: nodes[leader] == node)  # the leader's node last
    drains: list[str] = []

    async def drain_each() -> None:
        for node in order:
            started = time.monotonic()
            code, output = await kubectl_drain(kubectl, [node], "kustos.dev/cluster=dr", timeout=240)
            drains.append(f"{node} {time.monotonic() - started:.1f} s")
            try:
                assert code == 0, output
                now = await asyncio.to_thread(member_nodes, kubectl, "dr")
                assert node not in now.values(), f"a member still on drained {node}: {now}"
            finally:
                await asyncio.to_thread(kubectl.cluster.kubectl, "uncordon", node, check=False)

    seconds: list[float] = []
    try:
        async with watching_quorum(api, kubectl.namespace, "dr") as quorum:
            recording = await proven(
                moving_load(status, "drain", DRAIN_LOAD), histories / "drain.jsonl",
                f"{len(order)} member nodes drained in turn (leader's last)", checker, report,
                timed(seconds, drain_each, profile().duration / 6),
            )  # fmt: skip
    finally:
        for node in order:
            kubectl.cluster.kubectl("uncordon", node, check=False)
    assert seconds, f"the drains did not finish within the load: {drains}"
    assert felt(recording), "the moves were never felt"
    quorum.assert_quorum_kept()
    status = await wait_healthy(kubectl, "dr", 3)
    assert not {m["name"] for m in status["members"]} & set(nodes), "a member was never moved"
    assert "moved off draining node" in moved_off_events(kubectl)
    assert_consistent(kubectl, "dr", 3, status)
    report.notes.append(f"Drains under load ({', '.join(drains)}; {seconds[0]:.1f} s in all).")


ROLLOUT_LOAD = 240.0  # seconds of load at least: four nodes replaced one at a time, three moves


@full_profile_only
@pytest.mark.timeout(1200)
async def test_a_nodeimage_rollout_over_member_nodes_under_load_leaves_a_linearizable_history(
    api: Api, fleet: Fleet, kubectl: Kubectl, tmp_path: Path, crds: None,
    histories: Path, checker: Path, report: Report,
) -> None:  # fmt: skip
    """A NodeImage rollout of the kwok provider's fleet (a control-plane node and three
    workers), each worker holding one member: every worker is replaced (heir first, one at a
    time), each member moves to an heir as its node is drained, and the whole rollout ends
    inside one history."""
    await start_fleet(fleet, cp=1, workers=3)
    placement = {"antiAffinity": "required", "nodeSelector": {GROUP_LABEL: fleet.workers}}
    kubectl.apply(etcd_cluster("ni", 3, addressing="podIP", memberFailureTimeout="60s", pod=placement))
    # The product's lease timings, as test_etcd_drains' operator: under the recorder's load on
    # two cores the suite's 5 s renewal deadline can make the operator stand down mid-rollout.
    lease = ("--lease-duration", "15", "--renew-deadline", "10")
    with operator_running(kubectl, fleet, tmp_path / "operator", extra=lease) as operator:
        status = await wait_healthy(kubectl, "ni", 3, timeout=180)
        donors = set(member_nodes(kubectl, "ni").values())
        assert len(donors) == 3, donors

        async def roll() -> None:
            spec = node_image(fleet.name, NEW, workers={"maxSurge": 1, "maxUnavailable": 0})
            await asyncio.to_thread(apply_cluster, kubectl.cluster, spec)

            async def rolled_out() -> bool:
                image = await api.get(NODEIMAGES, None, fleet.name) or {}
                return (image.get("status") or {}).get("progress") == "4/4" and await all_replaced(fleet, 4)

            await wait_until(rolled_out, "every node of the fleet replaced", timeout=ROLLOUT_LOAD)

        seconds: list[float] = []
        async with watching_quorum(api, kubectl.namespace, "ni") as quorum:
            recording = await proven(
                moving_load(status, "nodeimage", ROLLOUT_LOAD), histories / "nodeimage.jsonl",
                "NodeImage rollout of 4 nodes, 3 holding members", checker, report,
                timed(seconds, roll, profile().duration / 6),
            )  # fmt: skip
        assert operator.alive(), operator.log()[-3000:]
        assert seconds, "the rollout did not finish within the load"
        assert felt(recording), "the moves were never felt"
        quorum.assert_quorum_kept()
        status = await wait_healthy(kubectl, "ni", 3, timeout=120)
        now = set(member_nodes(kubectl, "ni").values())
        assert len(now) == 3 and not now & donors, f"members on {now}, donors were {donors}"
        assert "moved off draining node" in moved_off_events(kubectl)
        assert_consistent(kubectl, "ni", 3, status)
    report.notes.append(f"NodeImage rollout of 4 nodes under load in {seconds[0]:.1f} s.")
