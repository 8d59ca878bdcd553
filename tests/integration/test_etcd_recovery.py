"""Disaster recovery (F-ETCD-8) with real etcd members: a majority is killed, the cluster comes
back under the same name and Services, from its best survivor or its newest backup."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kustos.etcd.client import EtcdClient
from kustos.etcd.recovery import BUMP_REVISION
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    etcd_cluster,
    put_all,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_backup import BUCKET, s3, s3_secret, s3_storage  # noqa: F401  (fixture)
from tests.integration.test_etcd_tls import user_client_certificate

pytestmark = pytest.mark.process_runner(
    "many majorities killed at once, one per scenario; quorum loss on runc: test_real_nodes_lifecycle"
)

AUTOMATIC = {"automatic": True, "delay": "3s"}


async def put_keys(endpoint: str, prefix: str, count: int) -> list[str]:
    """``count`` keys; every key returned was acknowledged."""
    keys = [f"{prefix}{i:05d}" for i in range(count)]
    async with EtcdClient(endpoint, timeout=10.0) as client:
        await put_all(client, ((key, "v" * 64) for key in keys))
    return keys


async def missing_keys(endpoint: str, keys: list[str], prefix: str) -> list[str]:
    async with EtcdClient(endpoint, timeout=10.0) as client:
        found = await client.range(prefix, prefix=True, keys_only=True)
    present = {kv.key.decode() for kv in found.kvs}
    return [k for k in keys if k not in present]


async def take_backup(kubectl: Kubectl, name: str, cluster: str, **spec: Any) -> dict[str, Any]:
    kubectl.apply({"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup", "metadata": {"name": name},
                   "spec": {"clusterName": cluster, **spec}})  # fmt: skip

    async def succeeded() -> dict[str, Any] | None:
        status = dict(kubectl.get("etcdbackup", name).get("status") or {})
        assert status.get("phase") != "Failed", status
        return status if status.get("phase") == "Succeeded" else None

    return await wait_until(succeeded, f"backup {name}", timeout=90, cluster=kubectl.cluster,
                            namespace=kubectl.namespace)  # fmt: skip


def kill_members(kubectl: Kubectl, members: list[str], delete_pods: bool = True) -> None:
    """SIGKILL each member's etcd (kept down), and delete its pod (its emptyDir data goes too)."""
    for member in members:
        kubectl.cluster.crash_container(kubectl.namespace, member, "etcd", stay_down=True)
    if delete_pods:
        kubectl("delete", "pod", *members, "--wait=false")


async def wait_recovered(kubectl: Kubectl, name: str, size: int, timeout: float = 180) -> dict[str, Any]:
    async def rebuilt() -> dict[str, Any] | None:
        status = status_of(kubectl, name)
        done = (status.get("recovery") or {}).get("phase") == "Succeeded"
        return status if done else None

    await wait_until(rebuilt, f"{name} rebuilt", timeout=timeout, cluster=kubectl.cluster,
                     namespace=kubectl.namespace)  # fmt: skip
    return await wait_healthy(kubectl, name, size, timeout=timeout)


async def revision(endpoint: str) -> int:
    async with EtcdClient(endpoint) as client:
        return (await client.status()).revision


async def test_automatic_recovery_rebuilds_from_the_survivor_with_every_acknowledged_key(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("dr", 3, recovery=AUTOMATIC))
    status = await wait_healthy(kubectl, "dr", 3)
    service_uid = kubectl.get("service", "dr-client")["metadata"]["uid"]
    keys = await put_keys(status["members"][0]["clientUrl"], "/bulk/", 10_000)
    await take_backup(kubectl, "dr-before", "dr")
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    await asyncio.sleep(2)
    await writer.stop()
    survivor = next(m["name"] for m in status["members"] if not m["leader"])
    kill_members(kubectl, [m["name"] for m in status["members"] if m["name"] != survivor])

    status = await wait_recovered(kubectl, "dr", 3)
    recovery = status["recovery"]
    assert recovery["sourceKind"] == "member" and recovery["source"] == survivor, recovery
    assert status["epoch"] == 1 and all(int(m["name"].rsplit("-", 1)[1]) >= 3 for m in status["members"])
    assert kubectl.get("service", "dr-client")["metadata"]["uid"] == service_uid
    endpoint = status["members"][0]["clientUrl"]
    assert await missing_keys(endpoint, keys, "/bulk/") == []
    assert await writer.missing(endpoint) == [], "a write the old cluster acknowledged is gone"
    assert await revision(endpoint) > BUMP_REVISION  # watchers never see an old revision again
    pods = kubectl.get("pods", None, "-l", "kustos.dev/cluster=dr")["items"]
    assert {p["metadata"]["labels"]["kustos.dev/epoch"] for p in pods} == {"1"}
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=dr")
    assert "RecoveryStarted" in events and "Recovered" in events


async def test_with_no_survivor_the_newest_backup_brings_the_cluster_back(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("drb", 3, recovery=AUTOMATIC))
    status = await wait_healthy(kubectl, "drb", 3)
    endpoint = status["members"][0]["clientUrl"]
    await put_keys(endpoint, "/old/", 200)
    await take_backup(kubectl, "drb-1", "drb")
    keys = await put_keys(endpoint, "/kept/", 2_000)
    backup = await take_backup(kubectl, "drb-2", "drb")
    await put_keys(
        endpoint, "/after/", 100
    )  # written after the newest backup: the price of losing every member
    kill_members(kubectl, [m["name"] for m in status["members"]])

    status = await wait_recovered(kubectl, "drb", 3)
    assert status["recovery"]["sourceKind"] == "backup" and status["recovery"]["source"] == "drb-2"
    endpoint = status["members"][0]["clientUrl"]
    assert await missing_keys(endpoint, keys, "/kept/") == []
    assert await revision(endpoint) > BUMP_REVISION + backup["revision"] - 1


async def test_without_automatic_recovery_nothing_happens_until_kustos_etcd_recover(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("drm", 3))
    status = await wait_healthy(kubectl, "drm", 3)
    keys = await put_keys(status["members"][0]["clientUrl"], "/m/", 500)
    survivor = status["members"][2]["name"]
    kill_members(kubectl, [m["name"] for m in status["members"] if m["name"] != survivor], delete_pods=False)

    async def waiting_for_approval() -> dict[str, Any] | None:
        current = status_of(kubectl, "drm")
        degraded = next((c for c in current.get("conditions") or [] if c["type"] == "Degraded"), {})
        waiting = current.get("phase") == "QuorumLost" and "kustos etcd recover drm" in degraded.get(
            "message", ""
        )
        return degraded if waiting else None

    degraded = await wait_until(waiting_for_approval, "QuorumLost asking for approval", timeout=60,
                                cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert f"member {survivor}" in degraded["message"]
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.get("pods")["items"]}
    await asyncio.sleep(8)
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.get("pods")["items"]} == pods_before
    assert "recovery" not in status_of(kubectl, "drm")

    result = subprocess.run(
        [sys.executable, "-m", "kustos.cli", "etcd", "recover", "drm", "-n", kubectl.namespace,
         "--kubeconfig", str(kubectl.cluster.kubeconfig)],
        capture_output=True, text=True, check=False, env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "asked the operator to rebuild" in result.stdout
    status = await wait_recovered(kubectl, "drm", 3)
    assert status["recovery"]["reason"].startswith("approved")
    assert await missing_keys(status["members"][0]["clientUrl"], keys, "/m/") == []


async def test_a_new_cluster_is_restored_from_an_s3_backup(
    kubectl: Kubectl,
    operator: OperatorProcess,
    s3: Any,  # noqa: F811
) -> None:
    s3_secret(kubectl, s3)
    kubectl.apply(etcd_cluster("orig", 1))
    status = await wait_healthy(kubectl, "orig", 1)
    keys = await put_keys(status["members"][0]["clientUrl"], "/s3/", 1_000)
    backup = await take_backup(kubectl, "orig-s3", "orig", storage=s3_storage(s3))
    assert backup["location"].startswith(f"s3://{BUCKET}/")

    kubectl.apply(etcd_cluster("copy", 3, restore={"backup": "orig-s3"}))
    status = await wait_healthy(kubectl, "copy", 3, timeout=180)
    assert status["recovery"]["sourceKind"] == "backup" and status["recovery"]["phase"] == "Succeeded"
    endpoint = status["members"][0]["clientUrl"]
    assert await missing_keys(endpoint, keys, "/s3/") == []
    assert await revision(endpoint) > BUMP_REVISION
    assert status["clusterId"] != status_of(kubectl, "orig")["clusterId"]


async def test_a_restore_from_a_missing_backup_waits_and_says_so(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("nobk", 1, restore={"backup": "does-not-exist"}))

    async def told() -> dict[str, Any] | None:
        degraded = next((c for c in status_of(kubectl, "nobk").get("conditions") or []
                         if c["type"] == "Degraded"), None)  # fmt: skip
        return degraded if degraded and "does-not-exist" in degraded["message"] else None

    await wait_until(told, "a condition naming the missing backup", timeout=30)
    assert not kubectl.get("pods", None, "-l", "kustos.dev/cluster=nobk")["items"]


async def test_an_operator_killed_mid_rebuild_finishes_it(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    with running_operator(kubectl, tmp_path / "a"):
        kubectl.apply(etcd_cluster("drk", 3, recovery=AUTOMATIC))
        status = await wait_healthy(kubectl, "drk", 3)
    keys = await put_keys(status["members"][0]["clientUrl"], "/k/", 300)
    survivor = status["members"][0]["name"]
    kill_members(kubectl, [m["name"] for m in status["members"] if m["name"] != survivor])
    marker = tmp_path / "fault"
    faulty_env = {"KUSTOS_FAULT_EXIT_AFTER": "CreateRestoreSeed", "KUSTOS_FAULT_MARKER": str(marker)}
    with running_operator(kubectl, tmp_path / "b", env=faulty_env) as faulty:

        async def crashed() -> bool:
            return not faulty.alive()

        await wait_until(crashed, "the operator to exit after creating the seed", timeout=90)
        assert marker.exists()
    with running_operator(kubectl, tmp_path / "c"):
        status = await wait_recovered(kubectl, "drk", 3)
    assert status["recovery"]["attempts"] == 1, "a restarted operator started a second seed"
    assert await missing_keys(status["members"][0]["clientUrl"], keys, "/k/") == []


async def test_a_tls_cluster_is_rebuilt_from_its_survivor_over_tls(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    kubectl.apply(
        etcd_cluster("drt", 3, recovery=AUTOMATIC, tls={"lifetime": "24h"}, memberFailureTimeout="15s")
    )
    status = await wait_healthy(kubectl, "drt", 3, timeout=180)
    client = user_client_certificate(kubectl, "drt", tmp_path / "tls")
    writer = Writer([m["clientUrl"] for m in status["members"]], tls=client)
    writer.start()
    await asyncio.sleep(2)
    await writer.stop()
    survivor = next(m["name"] for m in status["members"] if not m["leader"])
    kill_members(kubectl, [m["name"] for m in status["members"] if m["name"] != survivor])

    status = await wait_recovered(kubectl, "drt", 3, timeout=240)
    assert status["recovery"]["source"] == survivor
    assert all(m["clientUrl"].startswith("https://") for m in status["members"])
    assert len(writer.acknowledged) > 0
    assert await writer.missing(status["members"][0]["clientUrl"]) == []
