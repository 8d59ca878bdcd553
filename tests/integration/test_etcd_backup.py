"""EtcdBackup and scheduled backups (F-ETCD-7): real etcd members, a real S3 server, real claims."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import binaries
from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.s3 import S3Server, S3ServerConfig
from kustos.etcd.client import EtcdClient
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    etcd_cluster,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "schedules, retention and S3 errors are kustos's; agents on runc: test_real_nodes_lifecycle"
)

BUCKET = "etcd-backups"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory, dev_cluster: DevCluster) -> Iterator[S3Server]:
    binaries.build_missing("versitygw")
    # On the pod network's gateway: pods live in their own network namespaces.
    config = S3ServerConfig(
        data_dir=tmp_path_factory.mktemp("s3"), buckets=(BUCKET,), host=dev_cluster.network.gateway
    )
    server = S3Server(config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def s3_secret(kubectl: Kubectl, s3: S3Server, secret_key: str | None = None) -> None:
    keys = {"accessKeyId": s3.config.access_key, "secretAccessKey": secret_key or s3.config.secret_key}
    kubectl.apply(
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3-creds"}, "stringData": keys}
    )


def s3_storage(s3: S3Server) -> dict[str, Any]:
    return {
        "s3": {"endpoint": s3.endpoint, "bucket": BUCKET, "prefix": "kustos", "credentialsSecret": "s3-creds"}
    }


def etcd_backup(name: str, cluster: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup", "metadata": {"name": name},
            "spec": {"clusterName": cluster, **spec}}  # fmt: skip


def backup_status(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return dict(kubectl.get("etcdbackup", name).get("status") or {})


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def etcdutl_status(path: Path) -> dict[str, Any]:
    """What etcd's own tool says of a snapshot file (it fails on a corrupt one)."""
    etcdutl = binary_path("etcdutl", ETCD_VERSIONS[-1])
    out = subprocess.run([str(etcdutl), "snapshot", "status", str(path), "-w", "json"], check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return dict(json.loads(out))


def claim_directory(kubectl: Kubectl, claim: str) -> Path:
    volume = kubectl.get("pvc", claim)["spec"]["volumeName"]
    return Path(kubectl.get("pv", volume)["spec"]["local"]["path"])


async def write_keys(status: dict[str, Any], count: int) -> int:
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        revision = 0
        for i in range(count):
            revision = await client.put(f"/data/{i:05d}", "x" * 100)
    return revision


async def test_an_on_demand_backup_to_s3_is_verified_and_recorded(
    kubectl: Kubectl, operator: OperatorProcess, s3: S3Server
) -> None:
    kubectl.apply(etcd_cluster("bk", 3))
    status = await wait_healthy(kubectl, "bk", 3)
    revision = await write_keys(status, 200)
    s3_secret(kubectl, s3)
    kubectl.apply(etcd_backup("first", "bk", storage=s3_storage(s3)))

    async def succeeded() -> dict[str, Any] | None:
        current = backup_status(kubectl, "first")
        return current if current.get("phase") == "Succeeded" else None

    result = await wait_until(succeeded, "the backup to succeed", timeout=120, cluster=kubectl.cluster,
                              namespace=kubectl.namespace)  # fmt: skip
    key = f"kustos/{kubectl.namespace}/bk/first.db"
    assert result["location"] == f"s3://{BUCKET}/{key}"
    stored = s3.root / BUCKET / key
    assert result["size"] == stored.stat().st_size and result["sha256"] == sha256_of(stored)
    assert result["revision"] >= revision
    leader = next(m["name"] for m in status_of(kubectl, "bk")["members"] if m["leader"])
    assert result["member"] != leader, "a follower's snapshot is preferred"
    verified = etcdutl_status(stored)
    assert verified["revision"] == result["revision"] and verified["totalKey"] >= 200
    assert result["conditions"][0]["type"] == "Succeeded" and result["attempts"] == 1
    assert "BackupSucceeded" in kubectl("get", "events", "--field-selector", "involvedObject.name=first")


async def test_scheduled_backups_to_the_default_claim_keep_exactly_n(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("sched", 1, backup={"interval": "4s", "keep": 2}))
    await wait_healthy(kubectl, "sched", 1)
    seen: set[str] = set()

    async def retained() -> bool:
        items = kubectl.get("etcdbackups", "-l", "kustos.dev/scheduled=true")["items"]
        seen.update(b["metadata"]["name"] for b in items)
        done = sorted(
            b["metadata"]["name"] for b in items if (b.get("status") or {}).get("phase") == "Succeeded"
        )
        if len(seen) < 4 or len(done) != 2 or len(items) != 2:
            return False
        directory = claim_directory(kubectl, "sched-backups") / kubectl.namespace / "sched"
        files = sorted(p.name for p in directory.glob("*.db"))
        return files == [f"{name}.db" for name in done]

    await wait_until(retained, "two scheduled backups kept after four", timeout=150, cluster=kubectl.cluster,
                     namespace=kubectl.namespace)  # fmt: skip
    claim = kubectl.get("pvc", "sched-backups")
    assert not claim["metadata"].get("ownerReferences"), "backups must outlive their cluster"


async def test_a_failing_backup_is_retried_with_backoff_and_leaves_the_cluster_alone(
    kubectl: Kubectl, operator: OperatorProcess, s3: S3Server
) -> None:
    kubectl.apply(etcd_cluster("fragile", 1))
    before = await wait_healthy(kubectl, "fragile", 1)
    pods_before = [
        p["metadata"]["uid"] for p in kubectl.get("pods", "-l", "kustos.dev/cluster=fragile")["items"]
    ]
    s3_secret(kubectl, s3, secret_key="wrong-secret")
    kubectl.apply(etcd_backup("doomed", "fragile", storage=s3_storage(s3)))

    async def retried() -> dict[str, Any] | None:
        current = backup_status(kubectl, "doomed")
        return current if current.get("attempts", 0) >= 2 else None

    result = await wait_until(retried, "a second attempt after the first failed", timeout=90)
    assert result["phase"] == "Running"
    events = kubectl(
        "get", "events", "--field-selector", "involvedObject.name=doomed,reason=BackupAttemptFailed"
    )
    assert "attempt 1 failed" in events and "retrying in 10s" in events
    after = await wait_healthy(kubectl, "fragile", 1)
    assert after["members"] == before["members"]
    pods_after = [
        p["metadata"]["uid"] for p in kubectl.get("pods", "-l", "kustos.dev/cluster=fragile")["items"]
    ]
    assert pods_after == pods_before
