"""MinIO moves from its Deployment to a six-replica StatefulSet on real nodes (issue 23, item 5).

Real MinIO, not a stand-in: the server built from its Go module (binaries.minio_binary, the
module pinned in gomod/minio), written as an image under MinIO's own name and imported into
three real nodes (kubelet, containerd, runc). It runs as the old single-drive server and as the
new distributed one, each replica on its own local-path volume, found by its peers through the
headless Service's DNS names. The process runner could not host it: it gives volumes by
rewriting paths, so six distributed replicas would share one drive. MinIO is placed on the real
nodes by the old Deployment's nodeSelector and toleration, which the StatefulSet inherits.
The operator runs as the chart's ServiceAccount.

A failed copy is retried: the old MinIO is broken before the move (a flag its server refuses,
so its pod crash-loops at its address), the copy fails and says so on the policy's Degraded
condition while MinIO stays offline; once the Deployment is mended, the next try copies it all.

A node out of the count while the replicas are placed: one real node carries a taint the
replicas do not tolerate until the copy has failed, as a node briefly NotReady carries the node
lifecycle controller's not-ready taint (a loaded run once left the replicas three and three on
two nodes that way). The scheduler places them three and three; once the node is back, the
operator moves one replica per pass, with its volume, until two run on each node, and MinIO
heals the fresh drives.

What a user sees is asserted: every object written through the old MinIO's S3 API is readable
through the Service ``minio`` afterwards with the same checksum, also after the replicas moved;
the Service selected no pod only while the data was copied; the old Deployment and its claim are
gone; two replicas on each of the three nodes; each phase recorded in the policy's status, with
an Event. ``Migrated`` promises the data moved and the Service switched, not six ready replicas:
their readiness and spread are waited for, and the status's message says them.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.nodeimages import MINIO_IMAGE, image_archive, minio_image_spec
from kustos.devcluster.provisioner import STORAGE_CLASS
from kustos.devcluster.realnode import REAL_NODE_LABEL, RealNode
from kustos.maintenance import minio, minio_copy
from tests.integration.conftest import Kubectl
from tests.integration.kube import is_ready, wait_until
from tests.integration.operator import OperatorProcess, chart_maintenance_operator
from tests.integration.test_maintenance_minio_copy import contents

pytestmark = [pytest.mark.integration, pytest.mark.real_nodes]

NODES = 3
AWAY = "kustos.dev/test-away"
"""The taint that keeps one node out of the spread's count while the replicas are placed."""
ACCESS, SECRET = "kustos-minio", "kustos-minio-secret"
BUCKETS = ("kurl-registry", "kotsadm")
SERVER = ["minio", "server", "--address", ":9000", "/data"]
ON_REAL_NODES: dict[str, Any] = {
    "nodeSelector": {REAL_NODE_LABEL: "true"},
    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}


@pytest.fixture(scope="module")
def real_nodes(dev_cluster: DevCluster) -> Iterator[list[RealNode]]:
    """Three real nodes, tainted so that only MinIO lands there, each with MinIO's image."""
    binaries.ensure_built(binaries.minio_binary())
    archive = image_archive(minio_image_spec())
    started = time.monotonic()
    nodes: list[RealNode] = []
    try:
        nodes = dev_cluster.start_real_nodes(range(1, NODES + 1))
        with ThreadPoolExecutor(NODES) as pool:
            list(pool.map(lambda node: node.ctr("images", "import", str(archive)), nodes))
        for node in nodes:
            dev_cluster.kubectl(
                "taint", "node", node.name, f"{REAL_NODE_LABEL}=true:NoSchedule", "--overwrite"
            )
        print(f"\n{NODES} real nodes Ready with MinIO's image in {time.monotonic() - started:.1f} s")
        yield nodes
    finally:
        with ThreadPoolExecutor(NODES) as pool:
            list(pool.map(dev_cluster.remove_real_node, nodes or dev_cluster.real_nodes()))
        # The session cluster goes on without real nodes: no kube-proxy, no tables of it.
        dev_cluster.stop_kube_proxy()


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    with chart_maintenance_operator(kubectl.cluster, tmp_path / "operator") as process:
        yield process


def old_minio(namespace: str) -> list[dict[str, Any]]:
    """kURL's MinIO: one Deployment, its data on one claim, credentials from a Secret."""
    labels = {"app": "minio"}
    env = [
        {"name": "MINIO_ROOT_USER", "valueFrom": {"secretKeyRef": {"name": "minio-credentials",
                                                                   "key": "MINIO_ACCESS_KEY"}}},
        {"name": "MINIO_ROOT_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "minio-credentials",
                                                                       "key": "MINIO_SECRET_KEY"}}},
        # The local-path volumes are directories of the machine's root filesystem, which
        # distributed MinIO refuses as drives unless told it runs in CI.
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
                      **ON_REAL_NODES,
                      "containers": [{"name": "minio", "image": MINIO_IMAGE,
                                      "command": SERVER,
                                      "env": env, "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                                      "readinessProbe": {"httpGet": {"path": "/minio/health/ready",
                                                                     "port": 9000}, "periodSeconds": 2}}],
                      "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "minio-pv-claim"}}],
                  }}}},
    ]  # fmt: skip


def s3_at(address: str) -> Any:
    return minio_copy.client(f"http://{address}:9000", ACCESS, SECRET)


def set_command(kubectl: Kubectl, command: list[str]) -> None:
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/command", "value": command}]
    kubectl("patch", "deployment", "minio", "--type=json", "-p", json.dumps(patch))


def policy_status(cluster: DevCluster) -> dict[str, Any]:
    return dict(
        json.loads(cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json")).get("status") or {}
    )


def degraded(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})


def not_ready_events(cluster: DevCluster, nodes: list[RealNode]) -> Counter[str]:
    """How often the node lifecycle controller found each real node NotReady (said, not asserted:
    it shows whether the kubelets' heartbeats kept up on this run)."""
    reasons = json.loads(cluster.kubectl("get", "events", "-A", "--field-selector", "reason=NodeNotReady",
                                         "-o", "json"))["items"]  # fmt: skip
    names = {n.name for n in nodes}
    return Counter(e["involvedObject"]["name"] for e in reasons if e["involvedObject"]["name"] in names)


async def test_minio_moves_to_six_replicas_on_three_nodes_with_every_object(
    kubectl: Kubectl, real_nodes: list[RealNode], operator: OperatorProcess
) -> None:
    cluster = kubectl.cluster
    kubectl.apply(*old_minio(kubectl.namespace))

    def pods(selector: str) -> list[dict[str, Any]]:
        return list(kubectl.get("pods", None, "-l", selector)["items"])

    async def old_ready() -> dict[str, Any] | None:
        return next((p for p in pods("app=minio") if is_ready(p)), None)

    old_pod = await wait_until(old_ready, "the old MinIO Ready", timeout=120, cluster=cluster,
                               namespace=kubectl.namespace)  # fmt: skip
    assert old_pod["spec"]["nodeName"] in {n.name for n in real_nodes}
    service_ip = kubectl.get("service", "minio")["spec"]["clusterIP"]
    through_service = s3_at(service_ip)

    async def routed() -> bool:
        # kube-proxy programs the Service's address after the pod turns Ready: a CI run's first
        # call came in between and was refused.
        try:
            through_service.list_buckets()
        except botocore.exceptions.EndpointConnectionError:
            return False
        return True

    await wait_until(
        routed, "the MinIO Service routed", timeout=60, cluster=cluster, namespace=kubectl.namespace
    )
    for bucket in BUCKETS:
        through_service.create_bucket(Bucket=bucket)
    for index in range(30):
        body = os.urandom(500 + 311 * index)
        through_service.put_object(Bucket=BUCKETS[index % 2], Key=f"blobs/{index:02d}", Body=body)
    # One larger object, as kotsadm's archives are.
    through_service.put_object(Bucket="kotsadm", Key="archive.tar.gz", Body=os.urandom(5 << 20))
    written = contents(through_service)
    assert len(written) == 31

    # (phase, the Service's selector) at every look, to show when MinIO was offline.
    seen: list[tuple[str, str]] = []

    def look() -> dict[str, Any]:
        # The status first: the operator writes the Service before the status that tells of it,
        # so a Service read afterwards is at least as new as that status.
        status = policy_status(cluster)
        selector = json.dumps(kubectl.get("service", "minio")["spec"].get("selector"), sort_keys=True)
        phase = str((status.get("minio") or {}).get("phase") or "")
        if phase and (not seen or seen[-1] != (phase, selector)):
            seen.append((phase, selector))
        return status

    # One node is out of the count while the replicas are placed: not the old MinIO's, whose
    # local volume keeps its pod there.
    away = next(n.name for n in real_nodes if n.name != old_pod["spec"]["nodeName"])
    cluster.kubectl("taint", "node", away, f"{AWAY}=true:NoSchedule", "--overwrite")
    # The old MinIO breaks: its pod is Running at its address, its server exits at once.
    set_command(kubectl, [*SERVER, "--no-such-flag"])
    kubectl.apply({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default"},
        "spec": {"minioNamespace": kubectl.namespace, "minioStorageClass": STORAGE_CLASS},
    })  # fmt: skip

    async def copy_failed() -> dict[str, Any] | None:
        condition = degraded(look())
        return condition if condition.get("reason") == "MinioCopyFailed" else None

    started = time.monotonic()
    failure = await wait_until(copy_failed, "the copy to fail", timeout=300, interval=0.5, cluster=cluster,
                               namespace=kubectl.namespace)  # fmt: skip
    assert failure["status"] == "True" and "copying MinIO's objects" in failure["message"], failure
    assert seen[-1] == ("Copying", json.dumps(minio.DISABLED_SELECTOR)), "offline while the copy fails"
    assert "tried again" in policy_status(cluster)["minio"]["message"]
    failed_after = time.monotonic() - started
    # The copy waited for six ready replicas: on the two nodes counted, three each.
    placed = Counter(p["spec"]["nodeName"] for p in pods(f"app={minio.STATEFULSET}"))
    assert sorted(placed.values()) == [3, 3] and away not in placed, placed
    cluster.kubectl("taint", "node", away, f"{AWAY}-")
    set_command(kubectl, SERVER)

    async def migrated() -> bool:
        return (look().get("minio") or {}).get("phase") == "Migrated"

    await wait_until(migrated, "MinIO migrated to its StatefulSet", timeout=600, interval=0.5,
                     cluster=cluster, namespace=kubectl.namespace)  # fmt: skip
    print(
        f"\ncopy failed after {failed_after:.1f} s; MinIO moved in {time.monotonic() - started:.1f} s: {seen}"
    )

    # Offline (the Service selects no pod) once, from the copy's start until the switch: the old
    # Service's selector before, the StatefulSet's after.
    offline = json.dumps(minio.DISABLED_SELECTOR, sort_keys=True)
    selectors = [selector for _, selector in seen]
    first, last = selectors.index(offline), len(selectors) - 1 - selectors[::-1].index(offline)
    assert set(selectors[first : last + 1]) == {offline}, seen
    assert "Copying" in [phase for phase, _ in seen[first : last + 1]], seen
    assert set(selectors[:first]) == {json.dumps({"app": "minio"})}, seen
    assert (
        set(selectors[last + 1 :]) == {json.dumps(minio.STATEFULSET_LABELS)} and seen[-1][0] == "Migrated"
    ), seen

    # Every object, through the Service, with the same checksum.
    service = kubectl.get("service", "minio")
    assert service["spec"]["selector"] == minio.STATEFULSET_LABELS
    assert contents(s3_at(service["spec"]["clusterIP"])) == written

    # Migrated is not six ready replicas: they move, one per pass, until two run on each node.
    moving = time.monotonic()

    async def spread_and_ready() -> Counter[str] | None:
        statefulset = kubectl.get("statefulset", minio.STATEFULSET)
        replicas = pods(f"app={minio.STATEFULSET}")
        per_node = Counter(p["spec"].get("nodeName") for p in replicas)
        if (
            statefulset["status"].get("readyReplicas") != 6
            or len(replicas) != 6
            or not all(map(is_ready, replicas))
        ):
            return None
        return per_node if sorted(per_node.values()) == [2, 2, 2] else None

    per_node = await wait_until(spread_and_ready, "two ready replicas on each node", timeout=600, interval=1,
                                cluster=cluster, namespace=kubectl.namespace)  # fmt: skip
    assert set(per_node) == {n.name for n in real_nodes}, per_node
    print(f"replicas spread two per node in {time.monotonic() - moving:.1f} s")

    async def said() -> dict[str, Any] | None:
        state = look().get("minio") or {}
        return state if "6 of 6 replicas ready" in state.get("message", "") else None

    state = await wait_until(said, "the status to say six replicas ready", timeout=60, cluster=cluster,
                             namespace=kubectl.namespace)  # fmt: skip
    assert state["phase"] == "Migrated" and all(f"{n.name} 2" in state["message"] for n in real_nodes), state
    # The replicas moved with fresh drives: MinIO still has every object, the same.
    assert contents(s3_at(service["spec"]["clusterIP"])) == written

    status = policy_status(cluster)
    assert status["minio"]["objects"] == status["minio"]["copied"] == 31, status["minio"]
    assert degraded(status)["status"] == "False", "the failure is cleared once the copy succeeds"
    assert kubectl("get", "deployment", "minio", "--ignore-not-found").strip() == ""
    claim = kubectl("get", "pvc", "minio-pv-claim", "--ignore-not-found", "-o", "name").strip()
    assert not claim or kubectl.get("pvc", "minio-pv-claim")["metadata"].get("deletionTimestamp"), (
        "the old claim is deleted"
    )

    reasons = set(
        cluster.kubectl("get", "events", "-n", "default", "-o", "jsonpath={.items[*].reason}").split()
    )
    assert {
        "MinioStatefulSet",
        "MinioService",
        "MinioVerified",
        "MinioRemoveOld",
        "MinioRebalance",
    } <= reasons, reasons
    print(f"real nodes found NotReady: {dict(not_ready_events(cluster, real_nodes)) or 'none'}")
