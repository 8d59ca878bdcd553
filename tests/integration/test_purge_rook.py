"""A purge's Rook steps against Rook's own CephCluster CRD (vendored under tests/integration/rook/
from rook/rook deploy/examples/crds.yaml), on the real API server.

The Ceph toolbox is faked at its boundary (``rook.CephToolbox``: what would be an exec in
the toolbox pod) by one that records the commands and answers as Ceph would for a dead
node's OSD (``down`` fails: it is down already).

The operator's own purge execs in a toolbox pod through the API server (runtime/podexec.py):
there the pod is a kwok pod labelled app=rook-ceph-tools, and kwok runs what is exec'd in it
(a kwok ``Exec``) with a fake ``ceph`` on kwok's PATH (``DevCluster.exec_path``) that
records its arguments; the operator runs as the chart's ServiceAccount.
"""

from __future__ import annotations

import json
import stat
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import MANAGED_LABEL, node_manifest
from kustos.maintenance.purge import OSDS_ANNOTATION, PurgeOptions, Purger
from kustos.runtime.api import Api
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from kustos.runtime.podexec import exec_in_pod
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import running_operator
from tests.integration.kube import wait_until
from tests.integration.operator import ROOK_NAMESPACE, chart_identity
from tests.integration.test_purge_node import purge_policy

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
        # One Ceph command per step (each pass stays well under the controller's timeout).
        steps = ["RookStorageNode", "RookOSDDeployment", *["CephOSDPurge"] * 5, "Node"]
        assert [o.step for o in said] == steps

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
        outcome = await purger.next(node)
        assert outcome.step == "CephOSDPurge"
        assert ["ceph", "osd", "purge", "12", "--yes-i-really-mean-it"] in toolbox.commands
    finally:
        dev_cluster.kubectl("delete", "node", node, "--wait=false", check=False)


FAKE_CEPH = """#!/bin/sh
# Rook's toolbox, faked: records each command; `ceph osd down` of a dead node's OSD fails.
echo "ceph $*" >> "$CEPH_LOG"
case "$*" in
  "osd down "*) echo "$3 is already down" >&2; exit 1 ;;
esac
echo "done: $*"
"""
KEEP_OFF = {"key": "kustos.dev/rook-test", "effect": "NoSchedule"}


def toolbox_pod(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rook-ceph-tools", "labels": {"app": "rook-ceph-tools"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "rook-ceph-tools", "image": "quay.io/ceph/ceph:v19"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


async def test_the_operators_purge_runs_the_ceph_commands_in_the_toolbox_pod(
    dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """shouldEnablePurgeNodes with Rook's storage nodes maintained: a dead worker with two
    OSDs is purged, and ``ceph osd down/purge/crush rm`` run in the toolbox pod through the
    API server's exec, as the chart's ServiceAccount (pods/exec in Rook's namespace only)."""
    chart_identity(dev_cluster)  # the session's release, with Rook's namespace
    dev_cluster.kubectl("apply", "--server-side", "-f", str(CRD))
    dev_cluster.wait_established("cephclusters.ceph.rook.io")
    ceph_log = tmp_path / "ceph.log"
    ceph_log.touch()
    fake = dev_cluster.exec_path / "ceph"
    fake.write_text(FAKE_CEPH)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    suffix = uuid.uuid4().hex[:5]
    dead, alive = f"rook-dead-{suffix}", f"rook-tools-{suffix}"
    nodes = []
    for name, index in ((dead, 241), (alive, 242)):
        node = node_manifest(name, dev_cluster.slot, index, control_plane=False)
        node["spec"]["taints"].append(KEEP_OFF)
        node["metadata"]["labels"]["kustos.dev/rook-test"] = suffix
        nodes.append(node)
    namespace = ROOK_NAMESPACE
    policy = purge_policy(
        rookShouldUseAllNodes=False,
        rookNamespace=namespace,
        # Only this test's nodes are Rook's (kustos adds every other Ready node otherwise).
        rookStorageNodesLabel=f"kustos.dev/rook-test={suffix}",
    )
    exec_rule = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Exec",
        "metadata": {"name": "rook-ceph-tools", "namespace": namespace},
        "spec": {"execs": [{"local": {"envs": [{"name": "CEPH_LOG", "value": str(ceph_log)}]}}]},
    }
    try:
        listing = {"apiVersion": "v1", "kind": "List", "items": nodes}
        dev_cluster.kubectl("create", "-f", "-", input_text=json.dumps(listing))
        documents = [
            {
                "apiVersion": "ceph.rook.io/v1",
                "kind": "CephCluster",
                "metadata": {"name": "rook-ceph"},
                "spec": {
                    "cephVersion": {"image": "quay.io/ceph/ceph:v19"},
                    "dataDirHostPath": "/var/lib/rook",
                    "storage": {"useAllNodes": False, "nodes": [{"name": dead}, {"name": alive}]},
                },
            },
            osd_deployment(3, dead),
            osd_deployment(7, dead),
            toolbox_pod(alive),
            exec_rule,
        ]
        listing = {"apiVersion": "v1", "kind": "List", "items": documents}
        dev_cluster.kubectl("apply", "-n", namespace, "-f", "-", input_text=json.dumps(listing))

        async def toolbox_running() -> bool:
            found = json.loads(
                dev_cluster.kubectl("get", "pod", "rook-ceph-tools", "-n", namespace, "-o", "json")
            )
            return (found.get("status") or {}).get("phase") == "Running"

        await wait_until(toolbox_running, "the toolbox pod Running", timeout=60, cluster=dev_cluster)
        dev_cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy))
        with running_operator(kubectl, tmp_path / "operator") as operator:
            # The node dies: kwok stops its heartbeat.
            dev_cluster.kubectl("label", "node", dead, f"{MANAGED_LABEL}-")

            async def purged() -> bool:
                return dev_cluster.kubectl("get", "node", dead, "-o", "name", check=False).strip() == ""

            await wait_until(purged, f"Node {dead} purged by the operator", timeout=180, cluster=dev_cluster)
            assert operator.alive()
        assert ceph_log.read_text().splitlines() == [
            "ceph osd down osd.3",
            "ceph osd purge 3 --yes-i-really-mean-it",
            "ceph osd down osd.7",
            "ceph osd purge 7 --yes-i-really-mean-it",
            f"ceph osd crush rm {dead}",
        ]
        events = json.loads(dev_cluster.kubectl("get", "events", "-A", "-o", "json"))["items"]
        said = [e.get("message", "") for e in events if e.get("reason") == "PurgeCephOSDPurge"]
        assert said, [e.get("reason") for e in events]
        everything = "\n".join(said)  # one Event per command
        assert "ceph osd purge 3 --yes-i-really-mean-it: ok" in everything, said
        # kwok reports a non-zero exit as an internal error, not NonZeroExitCode: failed either way.
        assert "ceph osd down osd.3: failed" in everything, said
        assert "no Ceph toolbox" not in everything, said
        # The chart's identity execs there directly: output and exit status come back.
        identity = load_config(chart_identity(dev_cluster))
        result = await exec_in_pod(identity, namespace, "rook-ceph-tools", ["ceph", "osd", "tree"])
        assert (result.code, result.stdout, result.stderr) == (0, "done: osd tree\n", "")
        # Nowhere else: the chart grants exec in Rook's namespace only (asked, not tried: the
        # session's audit refuses any refused request of the operator's identity).
        account = "system:serviceaccount:kustos-system:kustos"
        for where, allowed in ((namespace, "yes"), ("kube-system", "no"), ("default", "no")):
            for verb in ("get", "create"):
                said_can = dev_cluster.kubectl(
                    "auth",
                    "can-i",
                    verb,
                    "pods",
                    "--subresource=exec",
                    "-n",
                    where,
                    "--as",
                    account,
                    check=False,
                )
                assert said_can.strip() == allowed, (verb, where, said_can)
        found = json.loads(
            dev_cluster.kubectl("get", "cephcluster", "rook-ceph", "-n", namespace, "-o", "json")
        )
        assert [n["name"] for n in found["spec"]["storage"]["nodes"]] == [alive]
        left = json.loads(dev_cluster.kubectl("get", "deployments", "-n", namespace, "-o", "json"))["items"]
        assert not [d for d in left if d["metadata"]["name"].startswith("rook-ceph-osd-")]
    finally:
        dev_cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)
        for kind in ("cephcluster", "deployment", "exec"):
            dev_cluster.kubectl("delete", kind, "--all", "-n", namespace, "--wait=false", check=False)
        dev_cluster.kubectl(
            "delete", "pod", "rook-ceph-tools", "-n", namespace, "--grace-period=0", "--force", check=False
        )  # fmt: skip
        for name in (dead, alive):
            dev_cluster.kubectl("delete", "node", name, "--wait=false", check=False)
        fake.unlink(missing_ok=True)
