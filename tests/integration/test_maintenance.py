"""Node maintenance against the real control plane: dead nodes cleared only once fenced.

A StatefulSet whose pod runs as a real process (etcd, on a local volume pinned to its
node), beside a member of a kustos EtcdCluster taking writes, loses its node two ways:
stopped (heartbeat and processes gone) and partitioned (heartbeat gone, the process
alive). Without fencing nothing moves, so a partitioned node never has its pod running
twice; once a fencing agent powers the node off and says so, kustos taints it out of
service, the pod is deleted, its pinned claim released (the workload opted in), and the
replacement runs elsewhere; the EtcdCluster replaces its member (its own controller's job)
and keeps every write it acknowledged. The node's return removes the taint.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.cluster import PARTITIONED_ANNOTATION
from kustos.devcluster.kwokconfig import MANAGED_LABEL
from kustos.maintenance.planner import OUT_OF_SERVICE_TAINT, RELEASE_CLAIMS_ANNOTATION
from kustos.runtime.times import rfc3339
from tests.integration import handwritten_etcd as demo
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, etcd_cluster, wait_healthy
from tests.integration.kube import is_ready, wait_until
from tests.integration.operator import OperatorProcess, start_chart_operator

pytestmark = pytest.mark.process_runner(
    "fencing and claim release across kwok nodes; a real node's: test_real_nodes_lifecycle"
)

FENCED = "kustos.dev/fenced"


def statefulset(name: str, beside: str | None = None) -> dict[str, Any]:
    """One etcd replica on a claim of the dev cluster's local-path class (pinned to its node),
    on the node of a member of EtcdCluster ``beside``."""
    pod = demo.etcd_pod(f"{name}-0", [f"--initial-cluster={name}-0=http://$(POD_IP):2380"])
    spec = pod["spec"]
    spec["volumes"] = []  # the claim template's volume takes its place
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}
                        ]
                    }
                ]
            }
        }
    }
    if beside is not None:
        spec["affinity"]["podAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"kustos.dev/cluster": beside}},
                 "topologyKey": "kubernetes.io/hostname"}
            ]
        }  # fmt: skip
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "annotations": {RELEASE_CLAIMS_ANNOTATION: "true"}},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                }
            ],
        },
    }


def policy(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "MaintenancePolicy",
        "metadata": {"name": "default"},
        "spec": spec,
    }


@pytest.fixture
async def maintenance(kubectl: Kubectl, operator: OperatorProcess) -> AsyncIterator[Kubectl]:
    """The default MaintenancePolicy (fencing by annotation, clear on), removed afterwards."""
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy()))
    yield kubectl
    kubectl.cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)


def node(kubectl: Kubectl, name: str) -> dict[str, Any]:
    return dict(json.loads(kubectl.cluster.kubectl("get", "node", name, "-o", "json")))


def taint_keys(kubectl: Kubectl, name: str) -> set[str]:
    return {t["key"] for t in node(kubectl, name).get("spec", {}).get("taints") or []}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")", 1)[1].split()[0] != "Z"


async def running(kubectl: Kubectl, pod: str, timeout: float = 90) -> dict[str, Any]:
    async def ready() -> dict[str, Any] | None:
        found = json.loads(kubectl("get", "pod", pod, "-o", "json", check=False) or "null")
        return found if found and is_ready(found) and not found["metadata"].get("deletionTimestamp") else None

    return await wait_until(ready, f"pod {pod} Ready", timeout=timeout, cluster=kubectl.cluster,
                            namespace=kubectl.namespace)  # fmt: skip


async def unreachable(kubectl: Kubectl, name: str) -> None:
    async def tainted() -> bool:
        return "node.kubernetes.io/unreachable" in taint_keys(kubectl, name)

    await wait_until(tainted, f"node {name} tainted unreachable", timeout=60)


def fence(kubectl: Kubectl, name: str) -> None:
    """What a fencing agent does once it has powered the node off: say so, with the time."""
    kubectl.cluster.kubectl("annotate", "node", name, f"{FENCED}={rfc3339(datetime.now(UTC))}", "--overwrite")


async def restored(kubectl: Kubectl, name: str) -> None:
    """Bring the node back as it was; kustos removes its out-of-service taint."""
    patch = {
        "metadata": {
            "labels": {MANAGED_LABEL: "true"},
            "annotations": {PARTITIONED_ANNOTATION: None, FENCED: None},
        }
    }
    kubectl.cluster.kubectl("patch", "node", name, "--type", "merge", "-p", json.dumps(patch))

    async def back() -> bool:
        n = node(kubectl, name)
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
        return ready and OUT_OF_SERVICE_TAINT not in taint_keys(kubectl, name)

    await wait_until(back, f"node {name} Ready without the out-of-service taint", timeout=90)


async def with_member(kubectl: Kubectl, name: str) -> tuple[dict[str, Any], Writer]:
    """A 3-member EtcdCluster (one member per node) and a writer through its members."""
    kubectl.apply(etcd_cluster(name, 3, pod={"antiAffinity": "required"}))
    status = await wait_healthy(kubectl, name, 3, timeout=180)
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    return status, writer


async def writes_kept(kubectl: Kubectl, name: str, writer: Writer, before: int) -> None:
    """The EtcdCluster is whole again, took writes after the node died (``before`` had been
    acknowledged then) and kept every write it acknowledged."""
    status = await wait_healthy(kubectl, name, 3, timeout=240)
    writer.update(status)
    await asyncio.sleep(2)
    await writer.stop()
    assert len(writer.acknowledged) > before, "no write was acknowledged after the node died"
    for member in status["members"]:
        assert await writer.missing(member["clientUrl"]) == [], f"{member['name']} lost acknowledged writes"


def last_action(kubectl: Kubectl) -> dict[str, Any]:
    found = json.loads(kubectl.cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json"))
    return dict((found.get("status") or {}).get("lastAction") or {})


async def test_a_stopped_node_is_cleared_once_fenced_and_its_pinned_pod_runs_elsewhere(
    maintenance: Kubectl,
) -> None:
    kubectl = maintenance
    _, writer = await with_member(kubectl, "es")
    kubectl.apply(statefulset("stopped", beside="es"))
    first = await running(kubectl, "stopped-0")
    victim = first["spec"]["nodeName"]
    old_pid = kubectl.cluster.container_pid(kubectl.namespace, "stopped-0", "etcd")
    assert old_pid is not None and process_alive(old_pid)
    old_claim = kubectl.get("pvc", "data-stopped-0")["metadata"]["uid"]
    started = time.monotonic()
    before = len(writer.acknowledged)
    kubectl.cluster.take_node_down(victim)
    try:
        await unreachable(kubectl, victim)
        fence(kubectl, victim)

        async def elsewhere() -> dict[str, Any] | None:
            pod = await running(kubectl, "stopped-0", timeout=5)
            return pod if pod["spec"]["nodeName"] != victim else None

        async def moved() -> dict[str, Any] | None:
            try:
                return await elsewhere()
            except AssertionError:
                return None

        second = await wait_until(moved, "stopped-0 Running on another node", timeout=120,
                                  cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        print(f"dead node -> replacement Running: {time.monotonic() - started:.1f} s")
        assert second["metadata"]["uid"] != first["metadata"]["uid"]
        assert not process_alive(old_pid)
        assert OUT_OF_SERVICE_TAINT in taint_keys(kubectl, victim)
        assert kubectl.get("pvc", "data-stopped-0")["metadata"]["uid"] != old_claim, (
            "the claim was not released"
        )
        mine = f"involvedObject.uid={policy_uid(kubectl)}"
        events = kubectl.cluster.kubectl("get", "events", "-A", "--field-selector", mine, "-o", "json")
        reasons = {e["reason"] for e in json.loads(events)["items"]}
        assert {"Clear", "ReleaseClaim"} <= reasons, reasons
        await writes_kept(kubectl, "es", writer, before)
    finally:
        await restored(kubectl, victim)
    assert last_action(kubectl)["action"] == "Uncordon"


async def test_a_partitioned_node_never_runs_the_pod_twice_and_is_cleared_once_fenced(
    maintenance: Kubectl,
) -> None:
    kubectl = maintenance
    _, writer = await with_member(kubectl, "ec")
    kubectl.apply(statefulset("cut", beside="ec"))
    first = await running(kubectl, "cut-0")
    victim = first["spec"]["nodeName"]
    old_pid = kubectl.cluster.container_pid(kubectl.namespace, "cut-0", "etcd")
    assert old_pid is not None
    before = len(writer.acknowledged)
    kubectl.cluster.partition_node(victim)
    try:
        await unreachable(kubectl, victim)

        # Unfenced: the pod's deletion (after its 10 s toleration) stays pending, nothing
        # replaces it, and its process keeps running on the cut-off node.
        async def evicted() -> bool:
            pod = kubectl.get("pod", "cut-0")
            return bool(pod["metadata"].get("deletionTimestamp"))

        await wait_until(evicted, "cut-0 deleted by the taint eviction", timeout=60)
        for _ in range(20):
            await asyncio.sleep(1)
            pod = kubectl.get("pod", "cut-0")
            assert pod["metadata"]["uid"] == first["metadata"]["uid"], "replaced without fencing"
            assert process_alive(old_pid), "the partitioned process should still run"
        assert OUT_OF_SERVICE_TAINT not in taint_keys(kubectl, victim)

        # The fencing agent powers the node off (its processes stop), then says so.
        kubectl.cluster.take_node_down(victim)

        async def powered_off() -> bool:
            return not process_alive(old_pid)

        await wait_until(powered_off, "the partitioned node's process stopped", timeout=30)
        fence(kubectl, victim)

        async def replaced() -> dict[str, Any] | None:
            found = json.loads(kubectl("get", "pod", "cut-0", "-o", "json", check=False) or "null")
            if not found or found["metadata"]["uid"] == first["metadata"]["uid"]:
                return None
            # Never two copies: whenever the replacement runs, the old process is gone.
            assert not process_alive(old_pid)
            return found if is_ready(found) else None

        second = await wait_until(replaced, "cut-0 replaced and Ready", timeout=120,
                                  cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        assert second["spec"]["nodeName"] != victim
        await writes_kept(kubectl, "ec", writer, before)
    finally:
        await restored(kubectl, victim)


async def test_fencing_by_the_provider_waits_out_a_partition_and_clears_once_the_instance_stops(
    kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """``kustos run --cloud-provider kwok``, the annotation not accepted: the provider says a
    partitioned node's instance runs (nothing moves), and once it is stopped, that it is."""
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy(fencing={"annotation": False})))
    process = start_chart_operator(
        kubectl.cluster, tmp_path / "operator", "--namespace", kubectl.namespace, "--cloud-provider", "kwok"
    )
    try:
        kubectl.apply(statefulset("prov"))
        first = await running(kubectl, "prov-0")
        victim = first["spec"]["nodeName"]
        old_pid = kubectl.cluster.container_pid(kubectl.namespace, "prov-0", "etcd")
        assert old_pid is not None
        if not node(kubectl, victim)["spec"].get("providerID"):
            kubectl.cluster.kubectl(
                "patch", "node", victim, "-p", json.dumps({"spec": {"providerID": f"kwok://{victim}"}})
            )
        kubectl.cluster.partition_node(victim)
        try:
            await unreachable(kubectl, victim)
            for _ in range(15):
                await asyncio.sleep(1)
                assert kubectl.get("pod", "prov-0")["metadata"]["uid"] == first["metadata"]["uid"], (
                    "moved unfenced"
                )
                assert process_alive(old_pid)
            assert OUT_OF_SERVICE_TAINT not in taint_keys(kubectl, victim)
            started = time.monotonic()
            kubectl.cluster.take_node_down(victim)  # the instance stops: the provider says so

            async def replaced() -> dict[str, Any] | None:
                found = json.loads(kubectl("get", "pod", "prov-0", "-o", "json", check=False) or "null")
                if not found or found["metadata"]["uid"] == first["metadata"]["uid"]:
                    return None
                assert not process_alive(old_pid), "two copies running"
                return found if is_ready(found) else None

            second = await wait_until(replaced, "prov-0 replaced and Ready", timeout=120,
                                      cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
            took = time.monotonic() - started
            print(f"instance stopped -> replacement Running (provider fencing): {took:.1f} s")
            assert second["spec"]["nodeName"] != victim
            assert "the provider reports its instance Stopped" in last_message(kubectl, "Clear")
        finally:
            await restored(kubectl, victim)
    finally:
        process.stop()
        kubectl.cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)


def policy_uid(kubectl: Kubectl) -> str:
    """The uid of the MaintenancePolicy as it is now: an earlier test's policy of the same name
    (deleted since) left Events that must not count for this one."""
    return kubectl.cluster.kubectl("get", "maintenancepolicy", "default", "-o", "jsonpath={.metadata.uid}")


def last_message(kubectl: Kubectl, reason: str) -> str:
    selector = f"involvedObject.uid={policy_uid(kubectl)},reason={reason}"
    events = kubectl.cluster.kubectl("get", "events", "-A", "--field-selector", selector, "-o", "json")
    return " | ".join(e["message"] for e in json.loads(events)["items"])
