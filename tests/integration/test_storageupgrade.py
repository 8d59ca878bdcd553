"""StorageUpgrade on the real control plane (F-STOR-5).

What is real here: the API server, the controllers (Deployment, StatefulSet, DaemonSet,
garbage collection), the scheduler and the operator; kwok simulates the storage node
pods and the workloads' pods. Two things are simulated and said so:

- the workloads' claims use the cluster's StorageClass, whose CSI provisioner does not
  run in the dev cluster, so the claims stay Pending and so do the workloads' pods (the
  scheduler cannot place a pod whose claim is unbound). Their pods still exist, which is
  what the upgrade waits on: it must delete them (scale to 0) and they must come back.
- the pre-pull NodeJob runs the new node image, which kwok simulates; kwok's log
  simulation (a ClusterLogs object for the test namespace) serves the line "done" as that
  container's log, which is what a real image prints through the NodeJob's command.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.cluster import DevCluster
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import running_operator
from tests.integration.kube import claim, condition, wait_until

NEW_IMAGE = "registry.example.com/storage/node:9.9.9"
REPLICAS = {"deployment/app-a": 2, "deployment/app-b": 3, "statefulset/app-s": 2}


def storage_cluster(kubectl: Kubectl) -> dict[str, Any]:
    ns = kubectl.namespace
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "StorageCluster",
        "metadata": {"name": "store"},
        "spec": {"namespace": ns, "storageClassName": f"fast-{ns}"},
    }


def upgrade(name: str = "up") -> dict[str, Any]:
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "StorageUpgrade",
        "metadata": {"name": name},
        "spec": {"newImage": NEW_IMAGE, "stepTimeout": "3m"},
    }


def pod_template(app: str, volumes: list[dict[str, Any]]) -> dict[str, Any]:
    mounts = [{"name": v["name"], "mountPath": "/" + v["name"]} for v in volumes]
    return {
        "metadata": {"labels": {"app": app}},
        "spec": {
            "containers": [{"name": "main", "image": "registry.example.com/app:1",
                            "volumeMounts": mounts}],
            "volumes": volumes,
        },
    }  # fmt: skip


def claim_volume(claim_name: str) -> dict[str, Any]:
    return {"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}


def workloads(kubectl: Kubectl) -> list[dict[str, Any]]:
    sc = f"fast-{kubectl.namespace}"
    return [
        claim("data-a", sc),
        claim("data-b", sc),
        {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app-a"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "app-a"}},
                     "template": pod_template("app-a", [claim_volume("data-a")])},
        },
        {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app-b"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "app-b"}},
                     "template": pod_template("app-b", [claim_volume("data-b")])},
        },
        {
            "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "app-s"},
            "spec": {"replicas": 2, "serviceName": "app-s", "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": {"app": "app-s"}},
                     "template": pod_template("app-s", []),
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                         "accessModes": ["ReadWriteOnce"], "storageClassName": sc,
                         "resources": {"requests": {"storage": "1Gi"}}}}]},
        },
        {   # uses no storage-cluster volume: the upgrade leaves it alone
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "bystander"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "bystander"}},
                     "template": pod_template("bystander", [{"name": "scratch", "emptyDir": {}}])},
        },
    ]  # fmt: skip


def pod_uids(kubectl: Kubectl, app: str) -> set[str]:
    pods = kubectl.get("pods", None, "-l", f"app={app}")["items"]
    return {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


@pytest.fixture
def pull_logs(dev_cluster: DevCluster, kubectl: Kubectl, tmp_path: Path) -> Iterator[None]:
    """kwok serves "done" as the log of the pre-pull job's container in this namespace."""
    log_file = tmp_path / "pull.log"
    log_file.write_text("2026-01-01T00:00:00.000000000Z stdout F done\n")
    name = f"pull-{kubectl.namespace}"
    kubectl.apply({
        "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": {"name": name},
        "spec": {"selector": {"matchNamespaces": [kubectl.namespace]},
                 "logs": [{"containers": ["job"], "logsFile": str(log_file), "follow": False}]},
    })  # fmt: skip
    yield
    dev_cluster.kubectl("delete", "clusterlogs", name, "--wait=false", check=False)


async def cluster_running(kubectl: Kubectl) -> dict[str, Any]:
    async def running() -> dict[str, Any] | None:
        obj = kubectl.get("storagecluster", "store")
        status = obj.get("status") or {}
        ready, _, total = (status.get("ready") or "0/0").partition("/")
        return obj if status.get("phase") == "Running" and ready == total != "0" else None

    return await wait_until(running, "the StorageCluster running", timeout=120,
                            cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip


async def workloads_up(kubectl: Kubectl) -> dict[str, set[str]]:
    """Every workload's pods exist (Pending: their claims never bind here); their uids."""

    async def all_there() -> dict[str, set[str]] | None:
        uids = {app: pod_uids(kubectl, app) for app in ("app-a", "app-b", "app-s", "bystander")}
        counts = {"app-a": 2, "app-b": 3, "app-s": 2, "bystander": 1}
        return uids if all(len(uids[a]) == n for a, n in counts.items()) else None

    return await wait_until(all_there, "every workload's pods", timeout=90,
                            cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip


async def completed(kubectl: Kubectl, timeout: float = 240) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        obj = kubectl.get("storageupgrade", "up")
        step = (obj.get("status") or {}).get("step")
        assert step != "Failed", obj["status"].get("message")
        return obj if step == "Completed" else None

    return await wait_until(done, "the upgrade to complete", timeout=timeout,
                            cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip


async def assert_upgraded(kubectl: Kubectl, before: dict[str, set[str]]) -> None:
    obj = kubectl.get("storageupgrade", "up")
    status = obj["status"]
    assert condition(obj, "Completed") == "True"
    assert sorted((w["kind"], w["name"], w["replicas"], w["restored"]) for w in status["workloads"]) == [
        ("Deployment", "app-a", 2, True), ("Deployment", "app-b", 3, True), ("StatefulSet", "app-s", 2, True),
    ]  # fmt: skip
    # Exact replica counts back, and the remembering annotations gone.
    for ref, replicas in REPLICAS.items():
        workload = kubectl.get(*ref.split("/"))
        assert workload["spec"]["replicas"] == replicas, ref
        annotations = workload["metadata"].get("annotations") or {}
        assert "kustos.dev/upgrade-replicas" not in annotations and "kustos.dev/upgrade" not in annotations
    assert kubectl.get("deployment", "bystander")["spec"]["replicas"] == 1
    # The node DaemonSet and every one of its pods run the new image, and are ready.
    ds = kubectl.get("daemonset", "store-node")
    image = next(c["image"] for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "node")
    assert image == NEW_IMAGE
    pods = kubectl.get("pods", None, "-l", "app.kubernetes.io/component=node")["items"]
    node_pods = [
        p for p in pods if any(o["name"] == "store-node" for o in p["metadata"].get("ownerReferences", []))
    ]
    assert node_pods and len(node_pods) == ds["status"]["desiredNumberScheduled"]
    for pod in node_pods:
        assert next(c["image"] for c in pod["spec"]["containers"] if c["name"] == "node") == NEW_IMAGE
        assert condition(pod, "Ready") == "True"
    # The cluster's spec follows, and it stays in maintenance until the upgrade is deleted.
    cluster = kubectl.get("storagecluster", "store")
    assert cluster["spec"]["images"]["nodeContainer"] == NEW_IMAGE
    assert cluster["metadata"]["annotations"]["kustos.dev/maintenance"] == "up"
    assert condition(cluster, "Maintenance") == "True"
    # Every workload using the cluster's volumes lost its pods and got new ones; the bystander did not.

    async def pods_back() -> dict[str, set[str]] | None:
        now = {app: pod_uids(kubectl, app) for app in ("app-a", "app-b", "app-s", "bystander")}
        counts = {"app-a": 2, "app-b": 3, "app-s": 2, "bystander": 1}
        return now if all(len(now[a]) == n for a, n in counts.items()) else None

    after = await wait_until(pods_back, "the workloads' pods back", timeout=60)
    for app in ("app-a", "app-b", "app-s"):
        assert not (before[app] & after[app]), f"{app} was never scaled down"
    assert before["bystander"] == after["bystander"]
    # No pre-pull job left behind.
    assert not kubectl("get", "nodejobs", "-o", "name").strip()


def event_order(kubectl: Kubectl) -> list[str]:
    events = kubectl.get("events", None, "--field-selector", "involvedObject.kind=StorageUpgrade")["items"]
    # Timestamps have whole seconds; the steps come faster. Events are created one after the
    # other, so etcd's revision (the resourceVersion of a new object) orders them.
    events.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e["reason"] for e in events]


async def delete_and_leave_maintenance(kubectl: Kubectl) -> None:
    kubectl("delete", "storageupgrade", "up", "--timeout=60s")

    async def left() -> bool:
        cluster = kubectl.get("storagecluster", "store")
        annotations = cluster["metadata"].get("annotations") or {}
        return "kustos.dev/maintenance" not in annotations and condition(cluster, "Maintenance") != "True"

    await wait_until(left, "the cluster out of maintenance", timeout=60,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    await cluster_running(kubectl)
    ds = kubectl.get("daemonset", "store-node")
    image = next(c["image"] for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "node")
    assert image == NEW_IMAGE, "leaving maintenance must not roll the nodes back"


@pytest.fixture
def storage_cleanup(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[None]:
    """Delete the upgrade and the StorageCluster with an operator running (their finalizers need
    it), whatever the test left: a StorageCluster left behind would stay active and make the
    next test's cluster wait."""
    yield
    with running_operator(kubectl, tmp_path / "cleanup"):
        kubectl("delete", "storageupgrades", "--all", "--timeout=60s", check=False)
        kubectl("delete", "storageclusters", "--all", "--timeout=90s", check=False)


async def test_upgrade_scales_down_rolls_and_restores_exact_replicas(
    crds: None, kubectl: Kubectl, tmp_path: Path, pull_logs: None, storage_cleanup: None
) -> None:
    with running_operator(kubectl, tmp_path / "operator"):
        kubectl.apply(storage_cluster(kubectl))
        await cluster_running(kubectl)
        kubectl.apply(*workloads(kubectl))
        before = await workloads_up(kubectl)

        kubectl.apply(upgrade())
        await completed(kubectl)
        await assert_upgraded(kubectl, before)
        order = event_order(kubectl)
        expected = ["PullImage", "PauseClusterCtrl", "UpgradeInit", "UpgradeComplete"]
        assert [r for r in order if r in expected] == expected, order
        shown = kubectl("get", "storageupgrade", "up")
        assert "Completed" in shown and NEW_IMAGE in shown

        await delete_and_leave_maintenance(kubectl)


@pytest.mark.parametrize("step", ["ScaleDown", "PatchDaemonSet", "ScaleUp"])
async def test_operator_killed_mid_upgrade_ends_in_the_same_state(
    step: str, crds: None, kubectl: Kubectl, tmp_path: Path, pull_logs: None, storage_cleanup: None
) -> None:
    marker = tmp_path / "fault"
    with running_operator(kubectl, tmp_path / "a"):
        kubectl.apply(storage_cluster(kubectl))
        await cluster_running(kubectl)
        kubectl.apply(*workloads(kubectl))
        before = await workloads_up(kubectl)
    faulty_env = {"KUSTOS_FAULT_EXIT_AFTER": step, "KUSTOS_FAULT_MARKER": str(marker)}
    with running_operator(kubectl, tmp_path / "b", env=faulty_env) as faulty:
        kubectl.apply(upgrade())

        async def crashed() -> bool:
            return not faulty.alive()

        await wait_until(crashed, f"the operator to exit after {step}", timeout=180,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        assert faulty.process.returncode == 137 and marker.exists()
    assert kubectl.get("storageupgrade", "up")["status"]["step"] != "Completed"
    with running_operator(kubectl, tmp_path / "c"):
        await completed(kubectl)
        await assert_upgraded(kubectl, before)
        await delete_and_leave_maintenance(kubectl)


async def test_a_failed_upgrade_leaves_workloads_restorable_by_the_command(
    crds: None, kubectl: Kubectl, tmp_path: Path, pull_logs: None, storage_cleanup: None
) -> None:
    with running_operator(kubectl, tmp_path / "operator"):
        kubectl.apply(storage_cluster(kubectl))
        await cluster_running(kubectl)
        kubectl.apply(*workloads(kubectl))
        await workloads_up(kubectl)
        # One pod that cannot go away (a finalizer holds it): scaling down never finishes.
        stuck = sorted(
            kubectl.get("pods", None, "-l", "app=app-b")["items"], key=lambda p: p["metadata"]["name"]
        )[0]
        stuck_name = stuck["metadata"]["name"]
        kubectl(
            "patch",
            "pod",
            stuck_name,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":["test.kustos.dev/hold"]}}',
        )
        try:
            failing = upgrade()
            failing["spec"]["stepTimeout"] = "15s"
            kubectl.apply(failing)

            async def failed() -> dict[str, Any] | None:
                obj = kubectl.get("storageupgrade", "up")
                return obj if (obj.get("status") or {}).get("step") == "Failed" else None

            obj = await wait_until(failed, "the upgrade to fail", timeout=120,
                                   cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
            message = obj["status"]["message"]
            assert (
                "still exist" in message
                and f"kustos storage restore-workloads up -n {kubectl.namespace}" in message
            )
            assert condition(obj, "Failed") == "True"
            assert "UpgradeFailed" in event_order(kubectl)
            for ref, replicas in REPLICAS.items():
                workload = kubectl.get(*ref.split("/"))
                assert workload["spec"]["replicas"] == 0
                assert workload["metadata"]["annotations"]["kustos.dev/upgrade-replicas"] == str(replicas)
            # The node image was never touched.
            ds = kubectl.get("daemonset", "store-node")
            assert all(c["image"] != NEW_IMAGE for c in ds["spec"]["template"]["spec"]["containers"])

            restore = subprocess.run(
                [sys.executable, "-m", "kustos.cli", "storage", "restore-workloads", "up",
                 "-n", kubectl.namespace, "--kubeconfig", str(kubectl.cluster.kubeconfig)],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            assert f"scaled deployment/app-b -n {kubectl.namespace} to 3" in restore.stdout, restore.stdout
            for ref, replicas in REPLICAS.items():
                workload = kubectl.get(*ref.split("/"))
                assert workload["spec"]["replicas"] == replicas, ref
                assert "kustos.dev/upgrade-replicas" not in (workload["metadata"].get("annotations") or {})
        finally:
            release = '[{"op":"remove","path":"/metadata/finalizers"}]'
            kubectl("patch", "pod", stuck_name, "--type=json", "-p", release, check=False)
        await delete_and_leave_maintenance_without_roll(kubectl)


async def delete_and_leave_maintenance_without_roll(kubectl: Kubectl) -> None:
    kubectl("delete", "storageupgrade", "up", "--timeout=60s")

    async def left() -> bool:
        annotations = kubectl.get("storagecluster", "store")["metadata"].get("annotations") or {}
        return "kustos.dev/maintenance" not in annotations

    await wait_until(left, "the cluster out of maintenance", timeout=60)
