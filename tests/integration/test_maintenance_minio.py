"""MinIO moves from its Deployment to a six-replica StatefulSet; kotsadm's database grows to three.

Real MinIO (built from its Go module, binaries.minio_binary) as both the old single-drive
server and the new distributed one. Its pods run through the dev cluster's process pod runner
on kwok nodes, not on real nodes: seven MinIO pods with one volume each on containerd nodes
would need three real nodes, a MinIO image and the machine-wide real-node lock for minutes;
the runner gives each pod its own network namespace, DNS name (the headless Service) and
local-path volume, which is all distributed MinIO asks of a node. The operator runs as the
chart's ServiceAccount, under its admission policy.

Run on 2026-11-26 up to the copy: the StatefulSet made, its six pods ready, the Service
taken offline, the copy retried with backoff while the new MinIO refused to initialise (see
the skip's reason); the planner now keeps MinIO online until the new cluster's health check
passes. What a user sees is asserted: every object written to the old MinIO is on the new one with
an equal checksum, the Service minio selects the StatefulSet, the Deployment and its claim
are gone, the policy's status went through the phases, with Events.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import binaries
from kustos.devcluster.provisioner import STORAGE_CLASS
from kustos.maintenance import minio_copy
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, chart_maintenance_operator

IMAGE = "quay.io/minio/minio:RELEASE.2026-02-12T20-18-48Z"
ACCESS, SECRET = "kustos-minio", "kustos-minio-secret"
BUCKETS = ("kurl-registry", "kotsadm")


@pytest.fixture(scope="module")
def minio_binary() -> None:
    binaries.ensure_built(binaries.minio_binary())


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    with chart_maintenance_operator(kubectl.cluster, tmp_path / "operator") as process:
        yield process


def old_minio(namespace: str) -> list[dict[str, Any]]:
    labels = {"app": "minio"}
    env = [
        {"name": "MINIO_ROOT_USER", "valueFrom": {"secretKeyRef": {"name": "minio-credentials",
                                                                   "key": "MINIO_ACCESS_KEY"}}},
        {"name": "MINIO_ROOT_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "minio-credentials",
                                                                       "key": "MINIO_SECRET_KEY"}}},
        # Drives on the machine's root filesystem (the dev cluster's local-path volumes).
        {"name": "MINIO_CI_CD", "value": "on"},
    ]  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "minio-credentials", "namespace": namespace},
         "stringData": {"MINIO_ACCESS_KEY": ACCESS, "MINIO_SECRET_KEY": SECRET}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": {"name": "minio-pv-claim", "namespace": namespace},
         "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                  "resources": {"requests": {"storage": "1Gi"}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "minio", "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"name": "api", "port": 9000, "targetPort": 9000}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "minio", "namespace": namespace},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "strategy": {"type": "Recreate"},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "containers": [{"name": "minio", "image": IMAGE,
                                      "command": ["minio", "server", "--address", ":9000", "/data"],
                                      "env": env, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                                      "readinessProbe": {"httpGet": {"path": "/minio/health/ready",
                                                                     "port": 9000}, "periodSeconds": 2}}],
                      "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "minio-pv-claim"}}],
                  }}}},
    ]  # fmt: skip


def s3_at(pod: dict[str, Any]) -> Any:
    return minio_copy.client(f"http://{pod['status']['podIP']}:9000", ACCESS, SECRET)


def contents(s3: Any) -> dict[str, str]:
    found = {}
    for bucket in (b["Name"] for b in s3.list_buckets()["Buckets"]):
        for key in minio_copy.listing(s3, bucket):
            found[f"{bucket}/{key}"] = hashlib.sha256(
                s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            ).hexdigest()
    return found


@pytest.mark.skip(
    reason="the process runner gives a pod its volumes by rewriting paths in its arguments, not by "
    "mounts: distributed MinIO's drive is inside a URL (http://ha-minio-N...:9000/export) that must "
    "be the same on every replica, so all six open the host's one /export and refuse the drive "
    "order. Needs per-pod bind mounts in the runner (network._ENTER) or real nodes with a MinIO "
    "image (issue 23)"
)
async def test_minio_moves_to_a_statefulset_with_every_object(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    cluster = kubectl.cluster
    namespace = kubectl.namespace
    kubectl.apply(*old_minio(namespace))

    def pods(selector: str) -> list[dict[str, Any]]:
        return list(kubectl.get("pods", None, "-l", selector)["items"])

    async def old_ready() -> bool:
        conditions = [c for p in pods("app=minio") for c in p.get("status", {}).get("conditions") or []]
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    await wait_until(old_ready, "the old MinIO ready", timeout=120)
    old = s3_at(pods("app=minio")[0])
    for bucket in BUCKETS:
        old.create_bucket(Bucket=bucket)
    for index in range(30):
        old.put_object(
            Bucket=BUCKETS[index % 2], Key=f"blobs/{index:02d}", Body=os.urandom(500 + 311 * index)
        )
    old.put_object(Bucket="kotsadm", Key="archive.tar.gz", Body=os.urandom(5 << 20))
    written = contents(old)
    assert len(written) == 31

    phases: list[str] = []

    def policy_status() -> dict[str, Any]:
        found = json.loads(cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json"))
        return dict(found.get("status") or {})

    kubectl.apply({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default"},
        "spec": {"minioNamespace": namespace, "minioStorageClass": STORAGE_CLASS},
    })  # fmt: skip

    async def migrated() -> bool:
        phase = (policy_status().get("minio") or {}).get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        return phase == "Migrated"

    await wait_until(migrated, "MinIO migrated to its StatefulSet", timeout=600, interval=0.5)
    status = policy_status()["minio"]
    assert status["objects"] == status["copied"] == 31, status
    assert "Copying" in phases and phases[-1] == "Migrated", phases
    assert phases.index("Copying") < phases.index("Migrated")

    service = kubectl.get("service", "minio")
    assert service["spec"]["selector"] == {"app": "ha-minio"}
    assert kubectl("get", "deployment", "minio", "--ignore-not-found").strip() == ""
    claim = kubectl("get", "pvc", "minio-pv-claim", "--ignore-not-found", "-o", "name").strip()
    deleting = claim and kubectl.get("pvc", "minio-pv-claim")["metadata"].get("deletionTimestamp")
    assert not claim or deleting, "the old claim is deleted"
    statefulset = kubectl.get("statefulset", "ha-minio")
    assert statefulset["spec"]["replicas"] == 6 and statefulset["status"].get("readyReplicas") == 6
    replicas = pods("app=ha-minio")
    assert len({p["spec"]["nodeName"] for p in replicas}) >= 3, "the replicas are spread over the nodes"
    for pod in replicas[:2]:  # any replica serves every object
        assert contents(s3_at(pod)) == written
    events = cluster.kubectl("get", "events", "-n", "default", "-o", "jsonpath={.items[*].reason}").split()
    assert {"MinioStatefulSet", "MinioService", "MinioVerified", "MinioRemoveOld"} <= set(events), events


async def test_kotsadm_database_grows_to_three(kubectl: Kubectl, operator: OperatorProcess) -> None:
    cluster = kubectl.cluster
    namespace = kubectl.namespace
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    ready = [
        n
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    ]
    assert len(ready) >= 3, "the session's cluster has three Ready nodes"
    labels = {"app": "kotsadm-rqlite"}
    kubectl.apply({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "kotsadm-rqlite", "namespace": namespace},
        "spec": {"replicas": 1, "serviceName": "kotsadm-rqlite-headless", "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [{
                     "name": "rqlite", "image": "registry.example/rqlite:8",
                     "args": ["-disco-mode=dns", "-bootstrap-expect=1", "-join-interval=1s"]}]}}},
    })  # fmt: skip
    kubectl.apply({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default"},
        "spec": {"kotsadmNamespace": namespace, "minioShouldDisableManagement": True},
    })  # fmt: skip

    async def three() -> bool:
        return int(kubectl.get("statefulset", "kotsadm-rqlite")["spec"]["replicas"]) == 3

    await wait_until(three, "kotsadm-rqlite at three replicas", timeout=60)
    args = kubectl.get("statefulset", "kotsadm-rqlite")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["-disco-mode=dns", "-bootstrap-expect=3", "-join-interval=1s"]
    status = json.loads(cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json"))["status"]
    assert status["kotsadm"]["replicas"] == 3
    assert "minio" not in status or status["minio"] is None
