"""EtcdClusters and the drains every cluster has (SPEC F-ETCD-15): the PodDisruptionBudget
keeps quorum through `kubectl drain`, with a writer checking every acknowledged write; a pod
that cannot start says why."""

from __future__ import annotations

import asyncio
from typing import Any

import yaml

from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, assert_consistent, etcd_cluster, status_of, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess


def member_nodes(kubectl: Kubectl, name: str) -> dict[str, str]:
    """Member pod -> the node it runs on."""
    pods = kubectl.get("pods", None, "-l", f"kustos.dev/cluster={name},kustos.dev/member")["items"]
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


async def kubectl_drain(kubectl: Kubectl, nodes: list[str], selector: str, timeout: int) -> tuple[int, str]:
    """`kubectl drain` as a person types it (its own retries on a refused eviction)."""
    cluster = kubectl.cluster
    process = await asyncio.create_subprocess_exec(
        str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "drain", *nodes,
        "--ignore-daemonsets", "--delete-emptydir-data", f"--pod-selector={selector}",
        f"--timeout={timeout}s",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_a_drain_of_two_member_nodes_at_once_keeps_quorum(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("q", 3))
    status = await wait_healthy(kubectl, "q", 3)

    async def budget_allows_one() -> dict[str, Any] | None:
        pdb = kubectl.get("pdb", "q")
        ok = pdb["spec"]["minAvailable"] == 2 and (pdb.get("status") or {}).get("disruptionsAllowed") == 1
        return pdb if ok else None

    pdb = await wait_until(budget_allows_one, "the budget to allow one eviction", timeout=30)
    assert pdb["metadata"]["ownerReferences"][0]["kind"] == "EtcdCluster"
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"

    drained = sorted(set(member_nodes(kubectl, "q").values()))[:2]
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    phases: set[str] = set()
    watching = True

    async def watch_phase() -> None:
        while watching:
            current = status_of(kubectl, "q")
            phases.add(str(current.get("phase")))
            writer.update(current)
            await asyncio.sleep(0.5)

    watcher = asyncio.create_task(watch_phase())
    try:
        code, output = await kubectl_drain(kubectl, drained, "kustos.dev/cluster=q", timeout=240)
        watching = False
        await watcher
        # The budget refused the second member while the first was being replaced, and the
        # drain went on by itself once the replacement was healthy.
        assert code == 0, output
        assert "violate the pod's disruption budget" in output, output
        assert "QuorumLost" not in phases, phases
        status = await wait_healthy(kubectl, "q", 3)
        writer.update(status)
    finally:
        watching = False
        await writer.stop()
        for node in drained:
            kubectl.cluster.kubectl("uncordon", node, check=False)
    assert not set(member_nodes(kubectl, "q").values()) & set(drained)
    assert_consistent(kubectl, "q", 3, status)
    assert len(writer.acknowledged) > 50
    assert await writer.missing(status["members"][0]["clientUrl"]) == []

    kubectl("delete", "etcdcluster", "q")

    async def budget_gone() -> bool:
        return not kubectl.get("pdb")["items"]

    await wait_until(budget_gone, "the budget to go with its cluster", timeout=60)


async def test_pods_that_cannot_start_are_named_with_their_reason(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """Each state reproduced as it happens on any cluster: an image nobody has, a flag etcd
    refuses, a nodeSelector no node matches, a StorageClass nothing provisions."""
    never = f"never-binds-{kubectl.namespace}"
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": never},
        "provisioner": "kustos.dev/nobody", "volumeBindingMode": "Immediate",
    }))  # fmt: skip
    expected = {
        "img": ("ImagePullFailed", "registry.k8s.io/etcd:3.7.3-0"),
        "crash": ("CrashLoopBackOff", "flag provided but not defined"),
        "sched": ("Unschedulable", "didn't match Pod's node affinity/selector"),
        "vol": ("VolumePending", f"storage class {never}"),
    }
    try:
        kubectl.apply(
            etcd_cluster("img", 1, version="3.7.3"),
            etcd_cluster("crash", 1, extraArgs=["--no-such-flag"]),
            etcd_cluster("sched", 1, pod={"nodeSelector": {"kustos.dev/no-such-node": "true"}}),
            etcd_cluster("vol", 1, storage={"type": "pvc", "size": "1Gi", "storageClassName": never}),
        )

        async def all_named() -> bool:
            for name, (reason, words) in expected.items():
                status = status_of(kubectl, name)
                stuck = status.get("stuck") or []
                degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})
                if not stuck or stuck[0]["reason"] != reason or words not in stuck[0]["message"]:
                    return False
                if degraded.get("reason") != reason or words not in degraded.get("message", ""):
                    return False
            return True

        await wait_until(all_named, "each cluster to name why its pod cannot start", timeout=60,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        table = kubectl("get", "etcdclusters")
        assert table.split("\n")[0].split() == ["NAME", "READY", "VERSION", "PHASE", "STUCK", "AGE"]
        rows = {line.split()[0]: line for line in table.strip().split("\n")[1:]}
        for name, (reason, _) in expected.items():
            assert reason in rows[name], table
        events = kubectl("get", "events", "--field-selector", "involvedObject.kind=EtcdCluster")
        for reason, _ in expected.values():
            assert reason in events, events
    finally:
        kubectl("delete", "etcdclusters", "--all", "--wait=false")
        kubectl.cluster.kubectl("delete", "storageclass", never, "--wait=false", check=False)
