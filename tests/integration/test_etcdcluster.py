"""EtcdCluster against the real control plane with real etcd members (SPEC F-ETCD-1..6, 11, 12, 14)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kustos.api.etcd import DEFAULT_VERSION
from kustos.etcd.client import EtcdClient, EtcdError
from tests.integration.conftest import WORKERS, Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    assert_rejected,
    etcd_cluster,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "create, scale and status over ~40 clusters are kustos's; on runc: test_real_nodes_lifecycle"
)


@pytest.mark.parametrize("size", [1, 3, 5])
async def test_create(size: int, kubectl: Kubectl, operator: OperatorProcess) -> None:
    kubectl.apply(etcd_cluster("c", size))
    status = await wait_healthy(kubectl, "c", size)
    assert_consistent(kubectl, "c", size, status)
    assert sorted(m["name"] for m in status["members"]) == [f"c-{i}" for i in range(size)]
    assert status["currentVersion"] == DEFAULT_VERSION and status["clusterId"]
    table = kubectl("get", "etcdclusters")
    assert table.split("\n")[0].split() == ["NAME", "READY", "VERSION", "PHASE", "STUCK", "AGE"]
    assert f"{size}/{size}" in table and "Running" in table
    services = {s["metadata"]["name"]: s for s in kubectl.get("services")["items"]}
    assert services["c-client"]["spec"]["type"] == "ClusterIP"
    assert services["c-peer"]["spec"]["clusterIP"] == "None"
    events = kubectl("get", "events", "--field-selector", "involvedObject.kind=EtcdCluster")
    assert "SeedMemberCreated" in events and (size == 1 or "MemberPromoted" in events)


async def test_resize_keeps_every_acknowledged_write(kubectl: Kubectl, operator: OperatorProcess) -> None:
    kubectl.apply(etcd_cluster("r", 3))
    status = await wait_healthy(kubectl, "r", 3)
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    phases: set[str] = set()
    try:
        for size in (5, 3, 1, 3):
            kubectl("patch", "etcdcluster", "r", "--type=merge", "-p", f'{{"spec":{{"size":{size}}}}}')

            async def resized(size: int = size) -> bool:
                current = status_of(kubectl, "r")
                writer.update(current)
                phases.add(str(current.get("phase")))
                return current.get("ready") == f"{size}/{size}" and len(current.get("members") or []) == size

            await wait_until(resized, f"resize to {size}", timeout=120, cluster=kubectl.cluster,
                             namespace=kubectl.namespace)  # fmt: skip
            assert "QuorumLost" not in phases
            status = await wait_healthy(kubectl, "r", size)
            writer.update(status)
    finally:
        await writer.stop()
    assert_consistent(kubectl, "r", 3, status)
    assert len(writer.acknowledged) > 50
    assert await writer.missing(status["members"][0]["clientUrl"]) == []


async def test_deleted_pod_is_replaced(kubectl: Kubectl, operator: OperatorProcess) -> None:
    kubectl.apply(etcd_cluster("d", 3, addressing="podIP"))
    await wait_healthy(kubectl, "d", 3)
    kubectl("delete", "pod", "d-1", "--wait=false")

    async def replaced() -> bool:
        names = {m["name"] for m in status_of(kubectl, "d").get("members") or []}
        return "d-1" not in names and "d-3" in names

    await wait_until(replaced, "d-1 replaced by d-3", timeout=90, cluster=kubectl.cluster,
                     namespace=kubectl.namespace)  # fmt: skip
    status = await wait_healthy(kubectl, "d", 3)
    assert_consistent(kubectl, "d", 3, status)


async def test_the_leaders_pvc_member_whose_pod_is_deleted_comes_back_with_its_data(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """The leader's pod: the survivors elect a new leader meanwhile, and the member is brought back
    on a survivor's own list during that election (observe.py), as the same member."""
    kubectl.apply(etcd_cluster("p", 3, storage={"type": "pvc", "size": "1Gi"}, memberFailureTimeout="60s"))
    status = await wait_healthy(kubectl, "p", 3)
    before = {m["name"]: m["id"] for m in status["members"]}
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        await client.put("kept", "on the volume")
        said = await client.status()
        leader = next(m.name for m in (await client.member_list()).members if m.id == said.leader_id)
    old_uid = kubectl.get("pod", leader)["metadata"]["uid"]  # before: the pod may be gone at once
    kubectl("delete", "pod", leader, "--wait=false")

    async def back() -> dict[str, Any] | None:
        current = status_of(kubectl, "p")
        members = {m["name"]: m for m in current.get("members") or []}
        pod = kubectl.get("pods", None, "-l", f"kustos.dev/member={leader}")["items"]
        fresh = pod and pod[0]["metadata"]["uid"] != old_uid
        ok = fresh and leader in members and members[leader]["healthy"] and current.get("ready") == "3/3"
        return current if ok else None

    status = await wait_until(back, f"{leader} back on its volume", timeout=90, cluster=kubectl.cluster,
                              namespace=kubectl.namespace)  # fmt: skip
    # The same member (same ID, same name): not a replacement.
    assert {m["name"]: m["id"] for m in status["members"]} == before
    member = next(m for m in status["members"] if m["name"] == leader)

    async def kept_value() -> bytes | None:
        # Its own answer (serializable) from its own data; tolerate a restart of the fresh
        # process (seen once under load right after it reported healthy: connection refused).
        try:
            async with EtcdClient(member["clientUrl"]) as client:
                kv = await client.get("kept", serializable=True)
        except EtcdError:
            return None
        return kv.value if kv is not None else b"<missing>"

    value = await wait_until(kept_value, f"{leader} to answer from its volume", timeout=30)
    assert value == b"on the volume"
    assert "MemberPodRecreated" in kubectl("get", "events", "--field-selector", "involvedObject.name=p")


async def test_a_majority_of_pvc_member_pods_deleted_comes_back_as_the_same_members_with_every_write(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """Two of three pods deleted, their volumes kept: the quorum is lost until they are back. Both
    come back on their volumes (the operator does not wait for a member list the survivor cannot
    answer), as the same members, and no write the cluster acknowledged before is gone."""
    kubectl.apply(etcd_cluster("m", 3, storage={"type": "pvc", "size": "1Gi"}, memberFailureTimeout="60s"))
    status = await wait_healthy(kubectl, "m", 3)
    before = {m["name"]: m["id"] for m in status["members"]}
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    await asyncio.sleep(2)
    await writer.stop()
    old = {name: kubectl.get("pod", name)["metadata"]["uid"] for name in ("m-0", "m-1")}
    kubectl("delete", "pod", *old, "--wait=false")

    async def whole() -> dict[str, Any] | None:
        current = status_of(kubectl, "m")
        listed = kubectl.get("pods", None, "-l", "kustos.dev/cluster=m")["items"]
        pods = {p["metadata"]["name"]: p for p in listed}
        fresh = all(name in pods and pods[name]["metadata"]["uid"] != uid for name, uid in old.items())
        members = current.get("members") or []
        ok = fresh and current.get("ready") == "3/3" and all(m["healthy"] for m in members)
        return current if ok else None

    status = await wait_until(whole, "m-0 and m-1 back on their volumes", timeout=90,
                              cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert {m["name"]: m["id"] for m in status["members"]} == before  # the same members, not new ones
    assert writer.acknowledged, "the writer never wrote"
    assert await writer.missing(status["members"][0]["clientUrl"]) == [], "an acknowledged write is gone"
    assert "MemberPodRecreated" in kubectl("get", "events", "--field-selector", "involvedObject.name=m")


async def test_a_pvc_member_whose_pod_stops_slower_than_the_failure_timeout_comes_back_as_itself(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """A pod deleted gracefully whose etcd takes longer to stop than the failure timeout (a
    leader deleted with another member waits 7 s on a leadership transfer; here its process is
    frozen, and killed at the end of its grace period): its member is the same one back on its
    volume, not removed and replaced by a new member that copies every key."""
    # The grace period well past the timeout; the timeout long enough for the member, back on its
    # volume, to serve on a loaded machine (a 2 s one ran out once in a run of five tests).
    kubectl.apply(etcd_cluster("g", 3, storage={"type": "pvc", "size": "1Gi"}, memberFailureTimeout="6s"))
    status = await wait_healthy(kubectl, "g", 3)
    before = {m["name"]: m["id"] for m in status["members"]}
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        await client.put("kept", "through a slow stop")
    old_uid = kubectl.get("pod", "g-1")["metadata"]["uid"]
    pid = kubectl.cluster.container_pid(kubectl.namespace, "g-1", "etcd")
    assert pid is not None
    os.killpg(pid, signal.SIGSTOP)  # the SIGTERM waits; the grace period's SIGKILL does not
    kubectl("delete", "pod", "g-1", "--grace-period=14", "--wait=false")

    async def back() -> dict[str, Any] | None:
        current = status_of(kubectl, "g")
        pods = kubectl.get("pods", None, "-l", "kustos.dev/member=g-1")["items"]
        fresh = pods and pods[0]["metadata"]["uid"] != old_uid
        healthy = all(m["healthy"] for m in current.get("members") or [])
        return current if fresh and healthy and current.get("ready") == "3/3" else None

    status = await wait_until(back, "g-1 back on its volume", timeout=90, cluster=kubectl.cluster,
                              namespace=kubectl.namespace)  # fmt: skip
    assert {m["name"]: m["id"] for m in status["members"]} == before  # not a new member
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=g")
    assert "MemberPodRecreated" in events and "MemberRemoved" not in events
    member = next(m for m in status["members"] if m["name"] == "g-1")
    async with EtcdClient(member["clientUrl"]) as client:
        kv = await client.get("kept")
    assert kv is not None and kv.value == b"through a slow stop"


async def test_the_volumes_of_members_that_left_are_deleted_and_no_other(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("v", 3, storage={"type": "pvc", "size": "1Gi"}))
    status = await wait_healthy(kubectl, "v", 3)
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        await client.put("kept", "after the scale-down")
    kubectl("patch", "etcdcluster", "v", "--type=merge", "-p", '{"spec":{"size":1}}')
    status = await wait_healthy(kubectl, "v", 1)
    survivor = status["members"][0]["name"]

    async def collected() -> list[str] | None:
        claims = kubectl.get("pvc", None, "-l", "kustos.dev/cluster=v")["items"]
        names = sorted(c["metadata"]["name"] for c in claims if not c["metadata"].get("deletionTimestamp"))
        return names if names == [f"{survivor}-data"] else None

    await wait_until(collected, "the two removed members' volumes deleted", timeout=90,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=v,reason=MemberVolumeDeleted")
    assert events.count("MemberVolumeDeleted") == 2, events
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        kv = await client.get("kept")
    assert kv is not None and kv.value == b"after the scale-down"


async def test_crashed_process_is_replaced_after_the_failure_timeout(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("k", 3))
    await wait_healthy(kubectl, "k", 3)
    kubectl.cluster.crash_container(kubectl.namespace, "k-2", "etcd", stay_down=True)

    async def replaced() -> bool:
        names = {m["name"] for m in status_of(kubectl, "k").get("members") or []}
        return "k-2" not in names and len(names) == 3

    await wait_until(replaced, "crashed k-2 replaced", timeout=90, cluster=kubectl.cluster,
                     namespace=kubectl.namespace)  # fmt: skip
    status = await wait_healthy(kubectl, "k", 3)
    assert_consistent(kubectl, "k", 3, status)
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=k")
    assert "MemberRemoved" in events and "unhealthy longer than the failure timeout" in events


async def test_member_on_a_dead_node_is_replaced(kubectl: Kubectl, operator: OperatorProcess) -> None:
    kubectl.apply(etcd_cluster("dn", 3, pod={"antiAffinity": "required"}, addressing="podIP"))
    status = await wait_healthy(kubectl, "dn", 3)
    victim = status["members"][0]["name"]
    node = kubectl.get("pod", victim)["spec"]["nodeName"]
    kubectl.cluster.take_node_down(node)
    try:

        async def replaced() -> bool:
            names = {m["name"] for m in status_of(kubectl, "dn").get("members") or []}
            return victim not in names and len(names) == 3

        await wait_until(replaced, f"{victim} on dead node {node} replaced", timeout=120,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        status = await wait_healthy(kubectl, "dn", 3)
        nodes = {kubectl.get("pod", m["name"])["spec"]["nodeName"] for m in status["members"]}
        assert node not in nodes and len(nodes) == 3
    finally:
        kubectl.cluster.bring_node_up(node)
    assert_consistent(kubectl, "dn", 3, status)


async def test_majority_loss_is_reported_and_nothing_is_destroyed(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("q", 3))
    status = await wait_healthy(kubectl, "q", 3)
    ids_before = sorted(m["id"] for m in status["members"])
    for member in ("q-0", "q-1"):
        kubectl.cluster.crash_container(kubectl.namespace, member, "etcd", stay_down=True)

    async def quorum_lost() -> dict[str, object] | None:
        current = status_of(kubectl, "q")
        return current if current.get("phase") == "QuorumLost" else None

    current = await wait_until(quorum_lost, "phase QuorumLost", timeout=60, cluster=kubectl.cluster,
                               namespace=kubectl.namespace)  # fmt: skip
    degraded = next(c for c in current["conditions"] if c["type"] == "Degraded")  # type: ignore[attr-defined]
    assert degraded["status"] == "True" and degraded["reason"] == "QuorumLost"
    await asyncio.sleep(12)  # well past the failure timeout: still nothing removed
    pods = sorted(p["metadata"]["name"] for p in kubectl.get("pods")["items"])
    assert pods == ["q-0", "q-1", "q-2"]
    survivor = next(m["clientUrl"] for m in status["members"] if m["name"] == "q-2")
    async with EtcdClient(survivor) as client:  # without quorum only a serializable read answers
        members = await client.member_list(linearizable=False)
    assert sorted(format(m.id, "x") for m in members.members) == ids_before
    assert "QuorumLost" in kubectl("get", "events", "--field-selector", "involvedObject.name=q")
    for member in ("q-0", "q-1"):
        kubectl.cluster.release_container(kubectl.namespace, member, "etcd")
    await wait_healthy(kubectl, "q", 3)


@pytest.mark.parametrize("step", ["CreatePod", "AddMember", "AnnotatePod", "PromoteMember", "RemoveMember",
                                  "DeletePod"])  # fmt: skip
async def test_operator_killed_after_a_step_resumes_without_orphans(
    step: str, crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    marker = tmp_path / "fault"
    grow_then_shrink = step in ("RemoveMember", "DeletePod")
    with running_operator(kubectl, tmp_path / "a") as first:
        kubectl.apply(etcd_cluster("f", 3))
        if grow_then_shrink:
            await wait_healthy(kubectl, "f", 3)
            first.stop()
    faulty_env = {"KUSTOS_FAULT_EXIT_AFTER": step, "KUSTOS_FAULT_MARKER": str(marker)}
    if grow_then_shrink:
        kubectl("patch", "etcdcluster", "f", "--type=merge", "-p", '{"spec":{"size":1}}')
    with running_operator(kubectl, tmp_path / "b", env=faulty_env) as faulty:

        async def crashed() -> bool:
            return not faulty.alive()

        await wait_until(crashed, f"the operator to exit after {step}", timeout=90)
        assert faulty.process.returncode == 137 and marker.exists()
    size = 1 if grow_then_shrink else 3
    with running_operator(kubectl, tmp_path / "c"):
        status = await wait_healthy(kubectl, "f", size)
        assert_consistent(kubectl, "f", size, status)
        indices = sorted(int(m["name"].rsplit("-", 1)[1]) for m in status["members"])
        assert len(set(indices)) == len(indices)


async def test_sigterm_mid_reconcile_finishes_the_step_then_releases_the_lease(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    # A rolling restart of the operator lands in the middle of busy reconciles: it must exit
    # promptly, and must not act after giving up its lease (a standby may be acting by then).
    for attempt, delay in enumerate((0.1, 0.4, 0.7, 1.0, 1.3)):
        with running_operator(kubectl, tmp_path / f"run-{attempt}") as process:

            async def leading(process: OperatorProcess = process) -> bool:
                return "became the leader" in process.log()

            # Mid-reconcile, not before it leads (on a loaded machine a start can take seconds).
            await wait_until(leading, "the operator to lead", timeout=60)
            kubectl.apply(etcd_cluster(f"busy-{attempt}", 3))
            await asyncio.sleep(delay)
            process.kill(signal.SIGTERM)
            try:
                code = process.wait(30)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"operator ignored SIGTERM:\n{process.log()[-3000:]}") from None
            assert code == 0, process.log()[-3000:]
            lines = process.log().splitlines()
            released = max((i for i, line in enumerate(lines) if "released lease" in line), default=-1)
            last_step = max((i for i, line in enumerate(lines) if " step: " in line), default=-1)
            assert released > last_step, "\n".join(lines[-20:])


async def test_deleting_the_cluster_removes_what_it_owns(kubectl: Kubectl, operator: OperatorProcess) -> None:
    kubectl.apply(etcd_cluster("gone", 1, storage={"type": "pvc", "size": "1Gi"}))
    await wait_healthy(kubectl, "gone", 1)
    assert kubectl.get("pvc", "gone-0-data")
    kubectl("delete", "etcdcluster", "gone")

    async def all_gone() -> bool:
        left = kubectl("get", "pods,services,pvc", "-l", "kustos.dev/cluster=gone", "-o", "name")
        return not left.strip()

    await wait_until(all_gone, "pods, services and claims collected", timeout=120)


async def test_a_namespace_deleted_with_its_cluster_goes_without_the_operator_fighting_it(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """The namespace's pods may go before the EtcdCluster does, and the API server refuses anything
    new there: the operator's recreations of the member pod and its Services are refused. They are
    not logged as failures (a page for the person who deleted it), and the namespace goes."""
    kubectl.apply(etcd_cluster("doomed", 1, storage={"type": "pvc", "size": "1Gi"}))
    await wait_healthy(kubectl, "doomed", 1)
    kubectl.cluster.kubectl("delete", "namespace", kubectl.namespace, "--wait=false")

    async def namespace_gone() -> bool:
        left = kubectl.cluster.kubectl("get", "namespace", kubectl.namespace, "-o", "name", check=False)
        return not left.strip()

    await wait_until(namespace_gone, "the namespace deleted", timeout=120)
    passes = [line for line in operator.log().splitlines() if f"key={kubectl.namespace}/doomed" in line]
    failed = [line for line in passes if "reconcile failed" in line]
    # The failures first: a report keeps only the message's first line.
    assert not failed, "\n".join([*failed, "-- the last passes:", *passes[-20:]])


def test_bad_specs_are_rejected_naming_the_field(crds: None, kubectl: Kubectl) -> None:
    assert_rejected(kubectl, etcd_cluster("bad", 0), "spec.size")
    assert_rejected(kubectl, etcd_cluster("bad", 10), "spec.size")
    assert_rejected(kubectl, etcd_cluster("bad", 3, version="banana"), "spec.version")
    assert_rejected(kubectl, etcd_cluster("bad", 3, sizee=3), "sizee")
    kubectl.apply(etcd_cluster("keep", 1))
    changed = etcd_cluster("keep", 1, storage={"type": "pvc"})
    assert_rejected(kubectl, changed, "storage.type cannot change on a live cluster")
    # Enforced by the API server itself (CEL), with no operator running: an operator that is
    # down must not be what stands between a user and a stranded cluster.
    moved = etcd_cluster("keep", 1, addressing="podIP")
    assert_rejected(kubectl, moved, "spec.addressing", "addressing cannot change on a live cluster")
    assert_rejected(kubectl, etcd_cluster("old", 1, version="3.4.27"), "spec.version", "older than 3.5.0")
    fighting = etcd_cluster("args", 1, extraArgs=["--quota-backend-bytes=1", "--data-dir=/tmp/x"])
    assert_rejected(kubectl, fighting, "spec.extraArgs", "cannot set a flag the operator sets")
    kubectl.apply(etcd_cluster("args", 1, extraArgs=["--quota-backend-bytes=4294967296"]))


def test_the_cluster_has_ready_nodes_for_five_members_on_distinct_nodes(kubectl: Kubectl) -> None:
    """Five-member clusters (test_etcd_tls) spread one member per node: the cluster the suite
    runs on, not the constant that configured it, must have the nodes Ready for that."""
    nodes = kubectl.get("nodes")["items"]
    ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in n["status"].get("conditions") or [])]  # fmt: skip
    workers = [n for n in ready if "-worker-" in n["metadata"]["name"]]
    assert len(workers) == WORKERS and len(ready) >= 5, [n["metadata"]["name"] for n in ready]
