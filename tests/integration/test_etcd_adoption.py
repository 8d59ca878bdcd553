"""Adoption (F-ETCD-13): a hand-started etcd cluster is taken over, member by member, while a
writer keeps writing, and ends up made only of member pods, under its own cluster ID."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.etcd.client import EtcdClient, EtcdError
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, assert_consistent, etcd_cluster, status_of, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_client import Launcher

pytestmark = pytest.mark.process_runner(
    "adoption's member-by-member takeover is kustos's; its pods need nothing a kubelet enforces"
)


async def answers(url: str) -> bool:
    try:
        async with EtcdClient(url, timeout=2) as client:
            return (await client.status()).has_leader
    except (EtcdError, OSError):
        return False


async def test_a_hand_started_cluster_is_adopted_without_losing_a_write(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    version = ETCD_VERSIONS[-1]
    # Members on the pod network's gateway: the pods that replace them live in their own
    # network namespaces and must reach them, as in a real cluster.
    launcher = Launcher(tmp_path, version, host=kubectl.cluster.network.gateway)
    try:
        originals = launcher.cluster(3)
        await wait_until(lambda: answers(originals[0].client_url), "the hand-started cluster", timeout=30)
        async with EtcdClient(originals[0].client_url) as client:
            original_cluster_id = f"{(await client.member_list()).cluster_id:x}"
        writer = Writer([m.client_url for m in originals])
        writer.start()

        async def writing() -> bool:
            return len(writer.acknowledged) > 20

        await wait_until(writing, "the writer to write to the hand-started cluster", timeout=60)
        kubectl.apply(etcd_cluster("adopted", 3, version=version.lstrip("v"),
                                   adopt={"endpoints": [originals[0].client_url]}))  # fmt: skip

        async def adopted() -> dict[str, Any] | None:
            status = status_of(kubectl, "adopted")
            writer.update(status)  # follow the members as they change, as a client would
            writer.endpoints += [m.client_url for m in originals]
            return status if (status.get("adoption") or {}).get("phase") == "Completed" else None

        status = await wait_until(adopted, "adoption to complete", timeout=240, cluster=kubectl.cluster,
                                  namespace=kubectl.namespace)  # fmt: skip
        status = await wait_healthy(kubectl, "adopted", 3)
        writer.update(status)
        await asyncio.sleep(1)
        await writer.stop()
    finally:
        launcher.stop_all()
    original_id = status["adoption"]["externalMembers"]
    assert not set(original_id) & {m["id"] for m in status["members"]}, "an original member is left"
    assert_consistent(kubectl, "adopted", 3, status)
    assert status["clusterId"] == original_cluster_id, "adoption must keep the cluster, not copy it"
    assert await writer.missing(status["members"][0]["clientUrl"]) == []
    assert len(writer.acknowledged) > 20
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=adopted")
    assert "AdoptionStarted" in events and "AdoptionCompleted" in events


async def test_an_unreachable_cluster_is_not_adopted_and_the_status_says_why(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("ghost", 3, adopt={"endpoints": ["http://127.0.0.1:1"]}))

    async def told() -> dict[str, Any] | None:
        conditions = status_of(kubectl, "ghost").get("conditions") or []
        degraded = next((c for c in conditions if c["type"] == "Degraded"), None)
        return degraded if degraded and "does not answer" in degraded["message"] else None

    await wait_until(told, "a condition saying the endpoint does not answer", timeout=30)
    assert not kubectl.get("pods", None, "-l", "kustos.dev/cluster=ghost")["items"]
