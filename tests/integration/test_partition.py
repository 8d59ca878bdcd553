"""Nodes that fail like real nodes: a network partition with every process alive.

The dev cluster cuts a node off (its pods' links down, its heartbeat stopped, nothing it
hears or says reaches the API server) and heals it. A writer puts keys through any
member that answers all along; every write it saw acknowledged must survive.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kustos.etcd.client import EtcdClient, EtcdError
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    endpoint_status,
    etcd_cluster,
    member_list,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "partitions of several nodes at once; one real node's partition: test_real_nodes"
)

# Pods that stay bound to an unreachable node (no eviction while the test runs): only the
# operator's memberFailureTimeout decides whether a member is replaced.
STAY = [
    {
        "key": f"node.kubernetes.io/{kind}",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 600,
    }
    for kind in ("unreachable", "not-ready")
]


@contextmanager
def partitioned(kubectl: Kubectl, node: str) -> Iterator[None]:
    kubectl.cluster.partition_node(node)
    try:
        yield
    finally:
        kubectl.cluster.heal_node(node)


def node_of(kubectl: Kubectl, pod: str) -> str:
    return str(kubectl.get("pod", pod)["spec"]["nodeName"])


def process_alive(kubectl: Kubectl, pod: str) -> int:
    pid = kubectl.cluster.container_pid(kubectl.namespace, pod, "etcd")
    assert pid is not None, f"{pod} has no etcd process"
    os.kill(pid, 0)  # raises if it is gone
    return pid


def member_names(kubectl: Kubectl, name: str) -> set[str]:
    return {m["name"] for m in status_of(kubectl, name).get("members") or []}


async def keep_acknowledging(writer: Writer, writes: int, seconds: float) -> None:
    """The members still connected keep serving: ``writes`` more acknowledged (however loaded
    the machine: a wait, not a rate), and the partition held at least ``seconds``."""
    before, started = len(writer.acknowledged), time.monotonic()

    async def served() -> bool:
        return len(writer.acknowledged) - before >= writes

    await wait_until(served, f"{writes} writes acknowledged while a member is cut off", timeout=60)
    await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))


def started_writer(status: dict[str, Any], last: str) -> Writer:
    """A writer that tries member ``last`` after the others: a client that learned which
    endpoint stopped answering (each attempt on a cut-off member waits out its timeout)."""
    members = sorted(status["members"], key=lambda m: m["name"] == last)
    writer = Writer([m["clientUrl"] for m in members])
    writer.start()
    return writer


async def test_a_member_partitioned_for_less_than_the_failure_timeout_rejoins_without_replacement(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(
        etcd_cluster(
            "pa", 3, memberFailureTimeout="90s", pod={"antiAffinity": "required", "tolerations": STAY}
        )
    )
    status = await wait_healthy(kubectl, "pa", 3)
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    pid = process_alive(kubectl, victim)
    writer = started_writer(status, last=victim)
    with partitioned(kubectl, node_of(kubectl, victim)):
        # The others keep serving; the cut-off member is not replaced, its process lives on.
        await keep_acknowledging(writer, writes=20, seconds=20)
        assert member_names(kubectl, "pa") == {m["name"] for m in status["members"]}
        assert process_alive(kubectl, victim) == pid
    healed = await wait_healthy(kubectl, "pa", 3, timeout=120)
    assert {m["name"] for m in healed["members"]} == {m["name"] for m in status["members"]}
    assert process_alive(kubectl, victim) == pid, "the member was restarted, not healed"
    await writer.stop()
    assert await writer.missing(healed["members"][0]["clientUrl"]) == []
    assert_consistent(kubectl, "pa", 3, healed)


async def test_a_member_partitioned_past_the_failure_timeout_is_replaced_and_serves_no_write_after(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(
        etcd_cluster(
            "pb", 3, memberFailureTimeout="10s", pod={"antiAffinity": "required", "tolerations": STAY}
        )
    )
    status = await wait_healthy(kubectl, "pb", 3)
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    old_ip = kubectl.get("pod", victim)["status"]["podIP"]
    node = node_of(kubectl, victim)
    writer = started_writer(status, last=victim)
    with partitioned(kubectl, node):

        async def replaced() -> dict[str, Any] | None:
            names = member_names(kubectl, "pb")
            return status_of(kubectl, "pb") if victim not in names and len(names) == 3 else None

        await wait_until(replaced, f"partitioned {victim} replaced", timeout=120, cluster=kubectl.cluster,
                         namespace=kubectl.namespace)  # fmt: skip
        status = await wait_healthy(kubectl, "pb", 3, timeout=120)
        writer.update(status)
    # Healed: the old process is not a member, and nothing it might still accept is a write.
    await asyncio.sleep(3)
    members = member_list(status["members"][0]["clientUrl"])
    assert victim not in {m.get("name") for m in members}, members
    try:
        async with EtcdClient(f"http://{old_ip}:2379", timeout=3.0) as client:
            await client.put("/after-heal", "from the old member")
        accepted = True
    except (EtcdError, OSError):
        accepted = False
    assert not accepted, f"the removed member {victim} at {old_ip} acknowledged a write"
    status = await wait_healthy(kubectl, "pb", 3)
    await writer.stop()
    endpoint = status["members"][0]["clientUrl"]
    assert await writer.missing(endpoint) == []
    async with EtcdClient(endpoint) as client:
        assert (await client.range("/after-heal")).kvs == []
    assert_consistent(kubectl, "pb", 3, status)


async def test_the_leaders_node_partitioned_elects_a_new_leader_and_loses_no_acknowledged_write(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(
        etcd_cluster(
            "pc", 3, memberFailureTimeout="90s", pod={"antiAffinity": "required", "tolerations": STAY}
        )
    )
    status = await wait_healthy(kubectl, "pc", 3)
    leader = next(m for m in status["members"] if m["leader"])
    others = [m for m in status["members"] if not m["leader"]]
    writer = started_writer(status, last=leader["name"])
    await asyncio.sleep(2)
    with partitioned(kubectl, node_of(kubectl, leader["name"])):

        async def new_leader() -> bool:
            views = endpoint_status({"members": others})
            leaders = {v["Status"]["leader"] for v in views}
            return len(leaders) == 1 and int(leader["id"], 16) not in leaders

        await wait_until(new_leader, "a new leader among the connected members", timeout=60,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        await keep_acknowledging(writer, writes=5, seconds=5)
    healed = await wait_healthy(kubectl, "pc", 3, timeout=120)
    await writer.stop()
    assert writer.acknowledged
    for member in healed["members"]:
        assert await writer.missing(member["clientUrl"]) == [], f"{member['name']} lost acknowledged writes"
    assert_consistent(kubectl, "pc", 3, healed)
