"""A member whose volume does not mount is said with the kubelet's words (issue 21 item 3).

Only a real kubelet mounts volumes (the process runner maps them to directories): this module
runs on a real node (kubelet, containerd), so it runs under the machine-wide real-node lock.
"""

from __future__ import annotations

import pytest
import yaml

from kustos.devcluster.realnode import REAL_NODE_LABEL, RealNode
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster, status_of
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_real_nodes import real_node  # noqa: F401 (the module's one real node)

pytestmark = [pytest.mark.integration, pytest.mark.real_nodes]


async def test_a_member_whose_volume_does_not_mount_says_why_within_a_minute(
    kubectl: Kubectl,
    operator: OperatorProcess,
    real_node: RealNode,  # noqa: F811
) -> None:
    """A local PersistentVolume whose directory is missing on its node, bound to the member's
    claim: the kubelet cannot mount it (FailedMount), and the EtcdCluster says so, naming the
    node and what to check, in Degraded, the status, the STUCK column and an Event."""
    node, ns = real_node.name, kubectl.namespace
    storage_class = f"no-mount-{ns}"
    missing = f"/kustos-missing-{ns}"
    cluster = kubectl.cluster
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all([
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": storage_class},
         "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "Immediate"},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": storage_class},
         "spec": {
             "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
             "storageClassName": storage_class, "local": {"path": missing},
             "claimRef": {"namespace": ns, "name": "vm-0-data"},
             "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                 {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
         }},
    ]))  # fmt: skip
    try:
        kubectl.apply(etcd_cluster(
            "vm", 1, storage={"type": "pvc", "size": "1Gi", "storageClassName": storage_class},
            pod={"tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}]},
        ))  # fmt: skip

        async def said() -> dict[str, str] | None:
            status = status_of(kubectl, "vm")
            stuck = (status.get("stuck") or [{}])[0]
            degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})
            if stuck.get("reason") == "VolumeMountFailed" and degraded.get("reason") == "VolumeMountFailed":
                return dict(stuck)
            return None

        stuck = await wait_until(said, "the member to name its volume that does not mount", timeout=60,
                                 cluster=cluster, namespace=ns)  # fmt: skip
        assert f"node {node}" in stuck["message"] and missing in stuck["message"], stuck
        table = kubectl("get", "etcdclusters")
        assert "VolumeMountFailed" in table, table
        events = kubectl("get", "events", "--field-selector", "involvedObject.kind=EtcdCluster")
        assert "VolumeMountFailed" in events, events
    finally:
        kubectl("delete", "etcdclusters", "--all", "--wait=false")
        cluster.kubectl("delete", "pv,storageclass", storage_class, "--wait=false", check=False)
