"""kotsadm's database grows to three replicas once three nodes are Ready (issue 23, item 5),
as the chart's ServiceAccount, under its admission policy.

The MinIO move itself: its planner in tests/unit/test_maintenance_minio.py, its copy and
verification between two S3 servers in test_maintenance_minio_copy.py, and the whole move with
real MinIO on real nodes in test_maintenance_minio_real_nodes.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, chart_maintenance_operator


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    with chart_maintenance_operator(kubectl.cluster, tmp_path / "operator") as process:
        yield process


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
