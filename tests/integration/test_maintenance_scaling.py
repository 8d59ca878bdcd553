"""Auto-resource scaling on the real control plane: workloads grow as kwok nodes join.

A Deployment and a StatefulSet, created at one replica, are listed in the policy with the
replicas they want and a nodeSelector only this test's nodes carry. The operator (the chart's
identity) raises each as labelled nodes join, never above what they want; a count the user
raises is left alone; the policy's status says what waits for nodes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.kwokconfig import node_manifest
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, chart_maintenance_operator

FIRST_INDEX = 231
POOL = "kustos.dev/scaling-test"


def workload(kind: str, name: str, namespace: str) -> dict[str, Any]:
    labels = {"app": name}
    spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
        },
    }
    if kind == "StatefulSet":
        spec["serviceName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    with chart_maintenance_operator(kubectl.cluster, tmp_path / "operator") as process:
        yield process


async def test_workloads_grow_as_nodes_join_and_never_shrink(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    cluster = kubectl.cluster
    namespace = kubectl.namespace
    kubectl.apply(workload("Deployment", "web", namespace), workload("StatefulSet", "db", namespace))
    pool = {POOL: namespace}
    kubectl.apply({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default"},
        "spec": {"autoResourceScaling": [
            {"kind": "Deployment", "namespace": namespace, "name": "web", "replicas": 3,
             "nodeSelector": pool},
            {"kind": "StatefulSet", "namespace": namespace, "name": "db", "replicas": 2,
             "nodeSelector": pool},
        ]},
    })  # fmt: skip
    names: list[str] = []

    def replicas(kind: str, name: str) -> int:
        return int(cluster.kubectl("get", kind, name, "-n", namespace, "-o", "jsonpath={.spec.replicas}"))

    def scaling_status() -> list[dict[str, Any]]:
        found = json.loads(cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json"))
        return list((found.get("status") or {}).get("autoResourceScaling") or [])

    def join(count: int) -> None:
        for _ in range(count):
            name = f"{cluster.config.name}-scale-{FIRST_INDEX + len(names)}"
            node = node_manifest(name, cluster.slot, FIRST_INDEX + len(names), control_plane=False)
            node["metadata"]["labels"][POOL] = namespace
            cluster.kubectl("apply", "-f", "-", input_text=json.dumps(node))
            names.append(name)

    try:
        # No node of the pool: both wait, at the one replica they were created with.
        async def waiting() -> bool:
            rows = scaling_status()
            return len(rows) == 2 and all(r["message"].startswith("waiting for nodes") for r in rows)

        await wait_until(waiting, "the status saying both wait for nodes", timeout=60)
        assert scaling_status()[0]["message"] == (
            f"waiting for nodes: 3 desired, 1 now; 0 Ready, schedulable node(s) with {POOL}={namespace}, "
            "3 more needed"
        )
        assert (replicas("deployment", "web"), replicas("statefulset", "db")) == (1, 1)

        join(2)

        async def two_each() -> bool:
            return (replicas("deployment", "web"), replicas("statefulset", "db")) == (2, 2)

        await wait_until(two_each, "web and db at 2 with two nodes", timeout=60)

        join(2)

        async def web_at_three() -> bool:
            return replicas("deployment", "web") == 3

        await wait_until(web_at_three, "web at its desired 3 with four nodes", timeout=60)
        assert replicas("statefulset", "db") == 2  # never above what it wants

        # The user raises web; kustos never lowers it.
        cluster.kubectl("scale", "deployment", "web", "-n", namespace, "--replicas=5")

        async def settled() -> bool:
            rows = scaling_status()
            return (
                bool(rows) and rows[0]["replicas"] == 5 and rows[0]["message"] == "at 5 of 3 desired replicas"
            )

        await wait_until(settled, "the status seeing web at 5", timeout=90)
        assert replicas("deployment", "web") == 5
        events = cluster.kubectl(
            "get", "events", "-n", "default", "--field-selector", "reason=Scale", "-o", "name"
        )
        assert events.strip(), "a Scale Event on the policy"
    finally:
        for name in names:
            cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)
