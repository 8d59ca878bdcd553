"""Rook follows the nodes (SPEC F-MAINT-5) against Rook's own CRDs (vendored under
tests/integration/rook/ from rook/rook deploy/examples/crds.yaml) on the real API server,
with the operator running as the chart's ServiceAccount and kwok nodes joining.

No Rook operator runs: the CephCluster's ``status.ceph.health`` is written here as Rook would
write it, which is what holds a pool change.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import node_manifest
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import running_operator
from tests.integration.kube import wait_until
from tests.integration.operator import ROOK_NAMESPACE, chart_identity

ROOK = Path(__file__).parent / "rook"
CRDS = ("cephclusters", "cephblockpools", "cephfilesystems", "cephobjectstores")
KEEP_OFF = {"key": "kustos.dev/rook-test", "effect": "NoSchedule"}
MDS = {"labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["rook-ceph-mds"]}]}}


def ceph_objects(first: str) -> list[dict[str, Any]]:
    """A single-node kURL-style Rook: size-1 pools, one mon and mgr, relaxed MDS anti-affinity."""
    one = {"size": 1, "requireSafeReplicaSize": False}
    relaxed = [
        {"weight": 100, "podAffinityTerm": {**MDS, "topologyKey": "kubernetes.io/hostname"}},
        {"weight": 100, "podAffinityTerm": {**MDS, "topologyKey": "topology.kubernetes.io/zone"}},
    ]
    return [
        {
            "apiVersion": "ceph.rook.io/v1",
            "kind": "CephCluster",
            "metadata": {"name": "rook-ceph"},
            "spec": {
                "cephVersion": {"image": "quay.io/ceph/ceph:v19"},
                "dataDirHostPath": "/var/lib/rook",
                "mon": {"count": 1},
                "mgr": {"count": 1},
                "storage": {"useAllNodes": False, "nodes": [{"name": first}]},
            },
        },
        {
            "apiVersion": "ceph.rook.io/v1",
            "kind": "CephBlockPool",
            "metadata": {"name": "replicapool"},
            "spec": {"failureDomain": "host", "replicated": one},
        },
        {
            "apiVersion": "ceph.rook.io/v1",
            "kind": "CephFilesystem",
            "metadata": {"name": "rook-shared-fs"},
            "spec": {
                "metadataPool": {"replicated": one},
                "dataPools": [{"name": "replicated", "replicated": one}],
                "metadataServer": {
                    "activeCount": 1,
                    "activeStandby": True,
                    "placement": {
                        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": relaxed}
                    },
                },
            },
        },
        {
            "apiVersion": "ceph.rook.io/v1",
            "kind": "CephObjectStore",
            "metadata": {"name": "replicated"},
            "spec": {
                "metadataPool": {"replicated": one},
                "dataPool": {"replicated": one},
                "gateway": {"port": 80, "instances": 1},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "rook-ceph-operator-config"},
            "data": {"ROOK_LOG_LEVEL": "INFO"},
        },
    ]


async def test_rook_follows_the_nodes_as_they_join(
    dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    chart_identity(dev_cluster)  # the session's release, with Rook's namespace
    for plural in CRDS:
        dev_cluster.kubectl("apply", "--server-side", "-f", str(ROOK / f"{plural}.ceph.rook.io.yaml"))
        dev_cluster.wait_established(f"{plural}.ceph.rook.io")
    namespace = ROOK_NAMESPACE
    suffix = uuid.uuid4().hex[:5]
    label = f"kustos.dev/rook-follow={suffix}"
    names = [f"rook-follow-{suffix}-{i}" for i in range(3)]

    def join(i: int) -> None:
        node = node_manifest(names[i], dev_cluster.slot, 231 + i, control_plane=False)
        node["metadata"]["labels"]["kustos.dev/rook-follow"] = suffix
        node["spec"]["taints"].append(KEEP_OFF)
        dev_cluster.kubectl("create", "-f", "-", input_text=json.dumps(node))

    def get(kind: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(
            dev_cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json")
        )
        return found

    def health(value: str) -> None:
        status = json.dumps({"status": {"ceph": {"health": value}}})
        dev_cluster.kubectl(
            "patch",
            "cephcluster",
            "rook-ceph",
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            status,
        )

    def storage_nodes() -> list[str]:
        return [n["name"] for n in get("cephcluster", "rook-ceph")["spec"]["storage"]["nodes"]]

    def sizes() -> dict[str, int]:
        pool, fs, store = (
            get("cephblockpool", "replicapool"),
            get("cephfilesystem", "rook-shared-fs"),
            get("cephobjectstore", "replicated"),
        )
        return {
            "replicapool": pool["spec"]["replicated"]["size"],
            "fs.metadata": fs["spec"]["metadataPool"]["replicated"]["size"],
            "fs.data": fs["spec"]["dataPools"][0]["replicated"]["size"],
            "store.metadata": store["spec"]["metadataPool"]["replicated"]["size"],
            "store.data": store["spec"]["dataPool"]["replicated"]["size"],
        }

    def counts() -> tuple[int, int]:
        spec = get("cephcluster", "rook-ceph")["spec"]
        return spec["mon"]["count"], spec["mgr"]["count"]

    def rook_status() -> dict[str, Any]:
        policy = json.loads(dev_cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json"))
        said: dict[str, Any] = (policy.get("status") or {}).get("rook") or {}
        return said

    def anti_affinity() -> dict[str, Any]:
        fs = get("cephfilesystem", "rook-shared-fs")
        found: dict[str, Any] = fs["spec"]["metadataServer"]["placement"]["podAntiAffinity"]
        return found

    def csi_set() -> bool:
        data = get("configmap", "rook-ceph-operator-config").get("data") or {}
        return "CSI_RBD_PLUGIN_RESOURCE" in data

    policy = {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "MaintenancePolicy",
        "metadata": {"name": "default"},
        "spec": {
            "rookNamespace": namespace,
            "rookStorageNodesLabel": label,
            "rookShouldDisableReconcileMDSPlacement": True,
        },
    }
    try:
        join(0)
        join(1)
        listing = {"apiVersion": "v1", "kind": "List", "items": ceph_objects(names[0])}
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(listing))
        health("HEALTH_OK")
        dev_cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy))
        policy_uid = get("maintenancepolicy", "default")["metadata"]["uid"]
        with running_operator(kubectl, tmp_path / "operator") as operator:
            # rookShouldUseAllNodes (EKCO's default): storage.nodes, pools and counts are Rook's.
            async def observed_all_nodes() -> bool:
                return "rookShouldUseAllNodes" in rook_status().get("message", "")

            await wait_until(observed_all_nodes, "the policy's Rook status", timeout=90, cluster=dev_cluster)
            assert storage_nodes() == [names[0]]
            assert set(sizes().values()) == {1}
            assert counts() == (1, 1)
            assert "requiredDuringSchedulingIgnoredDuringExecution" not in anti_affinity()  # MDS switch off

            # kustos follows the nodes: the second node joins storage, pools rise to 2.
            managed = {
                "spec": {
                    "rookShouldUseAllNodes": False,
                    "rookStorageNodeDevices": ["sdb"],
                    "rookShouldDisableReconcileMDSPlacement": False,
                }
            }
            dev_cluster.kubectl(
                "patch", "maintenancepolicy", "default", "--type=merge", "-p", json.dumps(managed)
            )

            async def two_nodes_followed() -> bool:
                # The MDS placement is a step of its own, on a pass after the counts' (it was
                # read once, before that pass, under load).
                mds = "requiredDuringSchedulingIgnoredDuringExecution" in anti_affinity()
                return set(sizes().values()) == {2} and counts() == (1, 2) and mds

            await wait_until(
                two_nodes_followed, "pools at 2, mgr at 2, MDS spread", timeout=120, cluster=dev_cluster
            )
            cluster = get("cephcluster", "rook-ceph")
            assert cluster["spec"]["storage"]["nodes"][1] == {"name": names[1], "devices": [{"name": "sdb"}]}
            assert get("cephblockpool", "replicapool")["spec"]["replicated"]["requireSafeReplicaSize"] is True
            required = anti_affinity()["requiredDuringSchedulingIgnoredDuringExecution"]
            assert [t["topologyKey"] for t in required] == ["kubernetes.io/hostname"]
            assert not csi_set()  # two nodes: not yet

            # Ceph unhealthy: the third node joins, mons go to 3, CSI resources are set; pools wait.
            health("HEALTH_WARN")
            join(2)

            async def held() -> bool:
                return (
                    storage_nodes() == names
                    and counts() == (3, 2)
                    and csi_set()
                    and "HEALTH_WARN" in rook_status().get("message", "")
                )

            await wait_until(held, "a pool change held by HEALTH_WARN", timeout=120, cluster=dev_cluster)
            assert set(sizes().values()) == {2}
            assert "pool replication waits" in rook_status()["message"]
            rbd = yaml.safe_load(
                get("configmap", "rook-ceph-operator-config")["data"]["CSI_RBD_PLUGIN_RESOURCE"]
            )
            assert {c["name"] for c in rbd} == {"driver-registrar", "csi-rbdplugin", "liveness-prometheus"}

            health("HEALTH_OK")

            async def three() -> bool:
                return set(sizes().values()) == {3}

            await wait_until(three, "pools at 3 once Ceph is healthy", timeout=120, cluster=dev_cluster)
            said = rook_status()
            assert (said["readyStorageNodes"], said["poolReplication"]) == (3, 3)
            assert operator.alive()

        def policy_events() -> list[dict[str, Any]]:
            """This policy's: an earlier module's ``default`` (deleted) left Events of its own."""
            events = json.loads(dev_cluster.kubectl("get", "events", "-A", "-o", "json"))["items"]
            return [e for e in events if (e.get("involvedObject") or {}).get("uid") == policy_uid]

        def replication_steps() -> int:
            return sum(e.get("count", 1) for e in policy_events() if e.get("reason") == "CephPoolReplication")

        async def ten_steps_told() -> bool:
            return replication_steps() >= 10

        # Each pool one replica per step: five pools, 1 -> 2 -> 3. Events are written after the
        # step they tell of: waited for, not read once.
        await wait_until(ten_steps_told, "ten replication events", timeout=30)
        reasons = [e.get("reason") for e in policy_events()]
        assert replication_steps() == 10, reasons
        for reason in ("RookStorageNode", "CephMonCount", "CephMgrCount", "MDSPlacement", "CephCSIResources"):
            assert reason in reasons, reasons
    finally:
        dev_cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)
        for kind in ("cephcluster", "cephblockpool", "cephfilesystem", "cephobjectstore"):
            dev_cluster.kubectl("delete", kind, "--all", "-n", namespace, "--wait=false", check=False)
        dev_cluster.kubectl("delete", "configmap", "rook-ceph-operator-config", "-n", namespace, check=False)
        for name in names:
            dev_cluster.kubectl("delete", "node", name, "--wait=false", check=False)
