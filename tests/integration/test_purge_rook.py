"""A purge's Rook steps against Rook's own CephCluster CRD (vendored under tests/integration/rook/
from rook/rook deploy/examples/crds.yaml), on the real API server.

The Ceph toolbox is faked at its boundary (``rook.CephToolbox``: what would be an exec in
the toolbox pod) by one that records the commands and answers as Ceph would for a dead
node's OSD (``down`` fails: it is down already).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from kustos.devcluster.cluster import DevCluster
from kustos.maintenance.purge import OSDS_ANNOTATION, PurgeOptions, Purger
from kustos.runtime.api import Api
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics

CRD = Path(__file__).parent / "rook" / "cephclusters.ceph.rook.io.yaml"


class RecordingToolbox:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    async def run(self, argv: Sequence[str]) -> tuple[int, str, str]:
        self.commands.append(list(argv))
        if argv[:3] == ["ceph", "osd", "down"]:
            return 1, "", f"{argv[3]} is already down"
        return 0, "", ""


def osd_deployment(osd: int, node: str) -> dict[str, object]:
    labels = {"app": "rook-ceph-osd", "ceph-osd-id": str(osd)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"rook-ceph-osd-{osd}", "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "osd", "image": "quay.io/ceph/ceph:v19"}],
                },
            },
        },
    }


@pytest.fixture
async def api(dev_cluster: DevCluster) -> AsyncIterator[Api]:
    clients = connect(load_config(dev_cluster.kubeconfig), Metrics())
    try:
        yield Api(clients.raw)
    finally:
        await clients.close()


async def test_purge_removes_the_node_from_rook_and_purges_its_osds(
    dev_cluster: DevCluster, api: Api
) -> None:
    dev_cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    dev_cluster.wait_established("cephclusters.ceph.rook.io")
    namespace = f"rook-{uuid.uuid4().hex[:6]}"
    node = f"{namespace}-node"
    dev_cluster.kubectl("create", "namespace", namespace)
    try:
        bare = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}
        dev_cluster.kubectl("create", "-f", "-", input_text=json.dumps(bare))
        ceph_cluster = {
            "apiVersion": "ceph.rook.io/v1",
            "kind": "CephCluster",
            "metadata": {"name": "rook-ceph", "namespace": namespace},
            "spec": {
                "cephVersion": {"image": "quay.io/ceph/ceph:v19"},
                "dataDirHostPath": "/var/lib/rook",
                "mon": {"count": 3},
                "storage": {
                    "useAllNodes": False,
                    "useAllDevices": False,
                    "nodes": [
                        {"name": node, "devices": [{"name": "sdb"}]},
                        {"name": "keeper", "devices": [{"name": "sdb"}]},
                    ],
                },
            },
        }
        documents = [
            ceph_cluster,
            osd_deployment(3, node),
            osd_deployment(7, node),
            osd_deployment(4, "keeper"),
        ]
        listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=listing)
        toolbox = RecordingToolbox()
        options = PurgeOptions(maintain_rook=True, rook_namespace=namespace)
        purger = Purger(api, options, toolbox=toolbox)
        said = []
        outcome = await purger.run(node, said.append)
        assert outcome.finished, said
        assert [o.step for o in said] == ["RookStorageNode", "RookOSDDeployment", "CephOSDPurge", "Node"]

        found = json.loads(
            dev_cluster.kubectl("get", "cephcluster", "rook-ceph", "-n", namespace, "-o", "json")
        )
        assert [n["name"] for n in found["spec"]["storage"]["nodes"]] == ["keeper"]
        deployments = json.loads(dev_cluster.kubectl("get", "deployments", "-n", namespace, "-o", "json"))[
            "items"
        ]
        assert [d["metadata"]["name"] for d in deployments] == ["rook-ceph-osd-4"]
        assert toolbox.commands == [
            ["ceph", "osd", "down", "osd.3"],
            ["ceph", "osd", "purge", "3", "--yes-i-really-mean-it"],
            ["ceph", "osd", "down", "osd.7"],
            ["ceph", "osd", "purge", "7", "--yes-i-really-mean-it"],
            ["ceph", "osd", "crush", "rm", node],
        ]
        assert "ceph osd down osd.3: failed (1: osd.3 is already down)" in said[2].message
        assert dev_cluster.kubectl("get", "node", node, check=False).strip() == ""
    finally:
        dev_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        dev_cluster.kubectl("delete", "node", node, "--wait=false", check=False)


async def test_osd_ids_recorded_before_the_deployments_go_survive_a_crash(
    dev_cluster: DevCluster, api: Api
) -> None:
    """A purge that stopped after deleting the OSD Deployments still purges their OSDs."""
    node = f"rook-crash-{uuid.uuid4().hex[:6]}"
    dev_cluster.kubectl("create", "-f", "-", input_text=json.dumps({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node, "annotations": {
            "kustos.dev/purge": "RookStorageNode,RookOSDDeployment", OSDS_ANNOTATION: "12"}},
    }))  # fmt: skip
    try:
        toolbox = RecordingToolbox()
        purger = Purger(api, PurgeOptions(maintain_rook=True, rook_namespace="no-rook-here"), toolbox=toolbox)
        outcome = await purger.next(node)
        assert outcome.step == "CephOSDPurge"
        assert ["ceph", "osd", "purge", "12", "--yes-i-really-mean-it"] in toolbox.commands
    finally:
        dev_cluster.kubectl("delete", "node", node, "--wait=false", check=False)
