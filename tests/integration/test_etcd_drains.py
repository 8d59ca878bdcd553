"""EtcdClusters and the drains every cluster has (SPEC F-ETCD-15): the PodDisruptionBudget
keeps quorum through `kubectl drain`, with a writer checking every acknowledged write; a pod
that cannot start says why."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.paths import cache_root
from kustos.etcd.client import EtcdClient, NoSpace
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    etcd_cluster,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "drains move members over more nodes than real nodes fit; evictions are the API server's"
)


@pytest.fixture
def operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    """The suite's operator with the product's lease timings (15 s, renewed within 10 s): at
    load average 28 a renewal took over the suite's 5 s, the operator stood down (exit 3)
    mid-loop, and nothing restarts it as a Deployment would; the members then stayed put."""
    lease = ("--lease-duration", "15", "--renew-deadline", "10")
    with running_operator(kubectl, tmp_path / "operator", extra=lease) as process:
        yield process


def member_nodes(kubectl: Kubectl, name: str) -> dict[str, str]:
    """Member pod -> the node it runs on."""
    pods = kubectl.get("pods", None, "-l", f"kustos.dev/cluster={name},kustos.dev/member")["items"]
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


FULL_TAINT = "kustos.dev/test-full"  # not a node remover's taint: the node is not draining


def worker_nodes(kubectl: Kubectl) -> list[str]:
    names = kubectl.cluster.kubectl("get", "nodes", "-l", "node-role.kubernetes.io/worker", "-o", "name")
    return [n.removeprefix("node/") for n in names.split()]


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


@contextlib.contextmanager
def operator_log_kept_on_failure(operator: OperatorProcess, test: str) -> Iterator[None]:
    """A failure keeps the operator's log out of pytest's rotated temporary directories
    (a loaded machine runs many sessions; two failures of the eviction loop lost theirs),
    and its last lines about evictions and steps go with the failure."""
    try:
        yield
    except BaseException:
        kept = cache_root() / "failed-operator-logs" / f"{test}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(operator.log_file, kept)
        telling = [line for line in operator.log().splitlines() if "eviction" in line or "step:" in line]
        print(f"\noperator log of the failed run: {kept}\n" + "\n".join(telling[-40:]))
        raise


class Watched:
    """A writer through the members, and every phase the cluster reported meanwhile."""

    def __init__(self, kubectl: Kubectl, name: str, status: dict[str, Any]) -> None:
        self.kubectl, self.name = kubectl, name
        self.writer = Writer([m["clientUrl"] for m in status["members"]])
        self.phases: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __aenter__(self) -> Watched:
        self.writer.start()
        self._task = asyncio.create_task(self._watch())
        return self

    async def _watch(self) -> None:
        while not self._stop.is_set():
            current = await asyncio.to_thread(status_of, self.kubectl, self.name)
            self.phases.add(str(current.get("phase")))
            self.writer.update(current)
            await asyncio.sleep(0.5)

    async def __aexit__(self, *_: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        await self.writer.stop()


async def assert_moved_keeping_every_write(
    kubectl: Kubectl, name: str, watched: Watched, status: dict[str, Any]
) -> None:
    """Members moved off draining nodes (said in an Event), quorum never lost, every
    acknowledged write on the cluster."""
    assert "QuorumLost" not in watched.phases, watched.phases
    events = kubectl("get", "events", "--field-selector", "involvedObject.kind=EtcdCluster")
    assert "moved off draining node" in events, events
    assert_consistent(kubectl, name, 3, status)
    assert len(watched.writer.acknowledged) > 50
    assert await watched.writer.missing(status["members"][0]["clientUrl"]) == []


async def test_without_migration_a_drain_of_two_member_nodes_at_once_keeps_quorum(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """The issue's drain: two member nodes at once. The budget lets one member go, refuses the
    second until the first is replaced elsewhere, and the drain goes on by itself."""
    kubectl.apply(etcd_cluster("q", 3, disruption={"migrate": False}))
    status = await wait_healthy(kubectl, "q", 3)

    async def budget_allows_one() -> dict[str, Any] | None:
        pdb = kubectl.get("pdb", "q")
        ok = pdb["spec"]["minAvailable"] == 2 and (pdb.get("status") or {}).get("disruptionsAllowed") == 1
        return pdb if ok else None

    pdb = await wait_until(budget_allows_one, "the budget to allow one eviction", timeout=30)
    assert pdb["metadata"]["ownerReferences"][0]["kind"] == "EtcdCluster"
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"

    drained = sorted(set(member_nodes(kubectl, "q").values()))[:2]
    try:
        async with Watched(kubectl, "q", status) as watched:
            code, output = await kubectl_drain(kubectl, drained, "kustos.dev/cluster=q", timeout=240)
            assert code == 0, output
            assert "violate the pod's disruption budget" in output, output
            status = await wait_healthy(kubectl, "q", 3)
            watched.writer.update(status)
    finally:
        for node in drained:
            kubectl.cluster.kubectl("uncordon", node, check=False)
    assert "QuorumLost" not in watched.phases, watched.phases
    assert not set(member_nodes(kubectl, "q").values()) & set(drained)
    assert_consistent(kubectl, "q", 3, status)
    assert len(watched.writer.acknowledged) > 50
    assert await watched.writer.missing(status["members"][0]["clientUrl"]) == []

    kubectl("delete", "etcdcluster", "q")

    async def budget_gone() -> bool:
        return not kubectl.get("pdb")["items"]

    await wait_until(budget_gone, "the budget to go with its cluster", timeout=60)


async def test_members_move_off_every_drained_node_one_after_another(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """The default: each `kubectl drain` of a member's node completes by itself, the member
    having moved (replacement first) before its pod went; no acknowledged write is lost."""
    kubectl.apply(etcd_cluster("m", 3))
    status = await wait_healthy(kubectl, "m", 3)

    async def no_eviction_allowed() -> bool:
        # Steady with migration: minAvailable is the size, members are moved instead.
        pdb = kubectl.get("pdb", "m")
        return pdb["spec"]["minAvailable"] == 3 and (pdb.get("status") or {}).get("currentHealthy") == 3

    await wait_until(no_eviction_allowed, "a steady budget that allows no eviction", timeout=30)
    nodes = sorted(set(member_nodes(kubectl, "m").values()))
    drained: list[str] = []
    try:
        async with Watched(kubectl, "m", status) as watched:
            for node in nodes:
                drained.append(node)
                started = time.monotonic()
                code, output = await kubectl_drain(kubectl, [node], "kustos.dev/cluster=m", timeout=180)
                print(f"drain of {node}: {time.monotonic() - started:.1f} s")
                assert code == 0, output
                status = await wait_healthy(kubectl, "m", 3)
                assert node not in member_nodes(kubectl, "m").values()
                watched.writer.update(status)
    finally:
        for node in drained:
            kubectl.cluster.kubectl("uncordon", node, check=False)
    await assert_moved_keeping_every_write(kubectl, "m", watched, status)


async def test_pods_that_cannot_start_are_named_with_their_reason(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """Each state reproduced as it happens on any cluster: an image nobody has, a flag etcd
    refuses, a nodeSelector no node matches, a StorageClass nothing provisions (for a member
    and for a backup agent)."""
    never = f"never-binds-{kubectl.namespace}"
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": never},
        "provisioner": "kustos.dev/nobody", "volumeBindingMode": "Immediate",
    }))  # fmt: skip
    expected = {
        "img": ("ImagePullFailed", "gcr.io/etcd-development/etcd:v3.7.99"),
        "crash": ("CrashLoopBackOff", "flag provided but not defined"),
        "sched": ("Unschedulable", "didn't match Pod's node affinity/selector"),
        "vol": ("VolumePending", f"storage class {never}"),
    }
    try:
        kubectl.apply(
            etcd_cluster("img", 1, version="3.7.99"),  # a patch nobody has released
            etcd_cluster("crash", 1, extraArgs=["--no-such-flag"]),
            etcd_cluster("sched", 1, pod={"nodeSelector": {"kustos.dev/no-such-node": "true"}}),
            etcd_cluster("vol", 1, storage={"type": "pvc", "size": "1Gi", "storageClassName": never}),
            etcd_cluster("bk", 1),
        )
        await wait_healthy(kubectl, "bk", 1)
        # A backup agent whose claim never binds: the scheduler cannot place it.
        storage = {"pvc": {"size": "1Gi", "storageClassName": never}}
        kubectl.apply({
            "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup", "metadata": {"name": "agent"},
            "spec": {"clusterName": "bk", "storage": storage},
        })  # fmt: skip

        async def all_named() -> bool:
            for name, (reason, words) in expected.items():
                status = status_of(kubectl, name)
                stuck = status.get("stuck") or []
                degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})
                if not stuck or stuck[0]["reason"] != reason or words not in stuck[0]["message"]:
                    return False
                if degraded.get("reason") != reason or words not in degraded.get("message", ""):
                    return False
            backup = kubectl.get("etcdbackup", "agent").get("status") or {}
            said = next((c for c in backup.get("conditions") or [] if c["type"] == "Succeeded"), {})
            return said.get("reason") == "Unschedulable" and "backup agent pod agent-" in said.get(
                "message", ""
            )

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
        kubectl("delete", "etcdbackups,etcdclusters", "--all", "--wait=false")
        kubectl.cluster.kubectl("delete", "storageclass", never, "--wait=false", check=False)


# A kubelet registers its node with this annotation: the attach/detach controller then attaches
# the node's volumes (kube-controller-manager's addNodeToDswp). kwok's nodes are not kubelets.
CONTROLLER_ATTACHES = "volumes.kubernetes.io/controller-managed-attach-detach"


async def refuse_attachments(kubectl: Kubectl, driver: str, said: str, stop: asyncio.Event) -> None:
    """The storage system's side of an attach, faked at its API boundary: what a CSI
    external-attacher writes on a VolumeAttachment of ``driver`` when ControllerPublishVolume
    fails (``status.attachError``, the driver's words)."""
    cluster = kubectl.cluster
    while not stop.is_set():
        listed = await asyncio.to_thread(cluster.kubectl, "get", "volumeattachments", "-o", "json")
        for attachment in json.loads(listed)["items"]:
            status = attachment.get("status") or {}
            if attachment["spec"]["attacher"] != driver or status.get("attachError"):
                continue
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            patch = {"status": {"attached": False, "attachError": {"time": when, "message": said}}}
            await asyncio.to_thread(
                cluster.kubectl, "patch", "volumeattachment", attachment["metadata"]["name"],
                "--subresource=status", "--type=merge", "-p", json.dumps(patch), check=False,
            )  # fmt: skip
        await asyncio.sleep(0.5)


async def test_a_member_whose_volume_does_not_attach_says_why_within_a_minute(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """A CSI PersistentVolume whose driver requires attach (a CSIDriver with attachRequired):
    kube-controller-manager's attach/detach controller creates the VolumeAttachment and waits
    for the driver's external-attacher. That attacher is faked at its API boundary by this
    test: it sets ``status.attachError`` with the storage system's message, as the real one
    does when ControllerPublishVolume fails. The controller then says FailedAttachVolume on
    the pod, and the EtcdCluster names the member and those words in ``status.stuck``,
    Degraded, the STUCK column and an Event within a minute."""
    ns, cluster = kubectl.namespace, kubectl.cluster
    driver, volume = f"{ns}.attach.kustos.dev", f"no-attach-{ns}"
    said = f"rpc error: code = FailedPrecondition desc = disk {volume} is attached to instance i-0f00"
    workers = worker_nodes(kubectl)
    cluster.kubectl("apply", "-f", "-", input_text=yaml.safe_dump_all([
        {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": driver},
         "spec": {"attachRequired": True, "podInfoOnMount": False}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": volume},
         "provisioner": driver, "volumeBindingMode": "Immediate"},
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
         "spec": {
             "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": volume,
             "csi": {"driver": driver, "volumeHandle": volume},
             "claimRef": {"namespace": ns, "name": "att-0-data"},
         }},
    ]))  # fmt: skip
    cluster.kubectl("annotate", "--overwrite", "nodes", *workers, f"{CONTROLLER_ATTACHES}=true")
    stop = asyncio.Event()
    attacher = asyncio.create_task(refuse_attachments(kubectl, driver, said, stop))
    try:
        started = time.monotonic()
        kubectl.apply(
            etcd_cluster("att", 1, storage={"type": "pvc", "size": "1Gi", "storageClassName": volume})
        )

        async def named() -> dict[str, str] | None:
            status = status_of(kubectl, "att")
            stuck = (status.get("stuck") or [{}])[0]
            degraded = next((c for c in status.get("conditions") or [] if c["type"] == "Degraded"), {})
            if stuck.get("reason") == "VolumeAttachFailed" and degraded.get("reason") == "VolumeAttachFailed":
                return dict(stuck)
            return None

        stuck = await wait_until(named, "the member to name its volume that does not attach", timeout=60,
                                 cluster=cluster, namespace=ns)  # fmt: skip
        print(f"said after {time.monotonic() - started:.1f} s: {stuck['message']}")
        assert stuck["pod"] == "att-0" and said in stuck["message"], stuck
        node = kubectl.get("pod", "att-0")["spec"]["nodeName"]
        assert f"node {node}" in stuck["message"], stuck
        pod_events = kubectl(
            "get", "events", "--field-selector", "involvedObject.name=att-0,reason=FailedAttachVolume"
        )
        assert said in pod_events, pod_events  # the controller's own words, on the pod
        table = kubectl("get", "etcdclusters")
        assert "VolumeAttachFailed" in table, table
        events = kubectl("get", "events", "--field-selector", "involvedObject.kind=EtcdCluster")
        assert "VolumeAttachFailed" in events, events
    finally:
        stop.set()
        await attacher
        kubectl("delete", "etcdclusters", "--all", "--wait=false")
        cluster.kubectl("annotate", "nodes", *workers, f"{CONTROLLER_ATTACHES}-", check=False)
        cluster.kubectl("delete", "pv,storageclass", volume, "--wait=false", check=False)
        cluster.kubectl("delete", "csidriver", driver, "--wait=false", check=False)


async def evict(kubectl: Kubectl, pod: str, dry_run: bool = False) -> tuple[int, str]:
    """One call of the Eviction API, as the cluster-autoscaler or the descheduler makes it
    (no cordon): the exit code and what the API server said."""
    cluster = kubectl.cluster
    path = f"/api/v1/namespaces/{kubectl.namespace}/pods/{pod}/eviction" + ("?dryRun=All" if dry_run else "")
    metadata = {"name": pod, "namespace": kubectl.namespace}
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": metadata}
    process = await asyncio.create_subprocess_exec(
        str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig),
        "create", "--raw", path, "-f", "-",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await process.communicate(json.dumps(body).encode())
    return process.returncode or 0, out.decode()


async def evict_until_empty(kubectl: Kubectl, operator: OperatorProcess, name: str, node: str) -> int:
    """Evict the members on ``node`` every second until it holds none (the evictions refused);
    no member pod but those there at first may ever be on it."""
    deadline = time.monotonic() + 180
    refusals, leaving = 0, {p for p, n in member_nodes(kubectl, name).items() if n == node}
    while on_node := [p for p, n in member_nodes(kubectl, name).items() if n == node]:
        assert time.monotonic() < deadline, f"members still on {node}: {on_node}"
        assert set(on_node) <= leaving, f"a replacement landed on {node}, the node being emptied"
        for pod in on_node:
            code, output = await evict(kubectl, pod)
            # Refused by the budget, or the pod is already gone or going: the API server grants
            # the eviction of a pod with a deletion timestamp whatever the budget says, so a
            # granted one must be of a pod the operator had already deleted, its member removed.
            if code == 0:
                assert f"DeletePod(name='{pod}'" in operator.log(), f"{pod} evicted past its budget: {output}"
                continue
            assert "disruption budget" in output or "NotFound" in output, output
            refusals += "disruption budget" in output
        await asyncio.sleep(1)
    return refusals


# Four moves (the second node holds two members), each up to a minute or more on a loaded machine.
@pytest.mark.timeout(900)
async def test_members_asked_to_leave_by_evictions_alone_move(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """An autoscaler-style loop with no cordon and no taint: it calls the Eviction API for the
    member on the node it wants empty, every second, until that node holds none, then takes
    the next member node. For the first node there is no empty node (the spare worker is
    tainted), and no replacement ever lands on the node being emptied. The budget refuses
    every call (429); the operator sees the refused calls through its eviction webhook and
    moves each member (replacement first). A dry run moves nothing. No acknowledged write is
    lost and quorum is kept throughout."""
    # The default failure timeout: the suite's 5 s made a member slowed by a loaded machine
    # "dead", removed and replaced in the middle of the loop (seen at load average 20).
    kubectl.apply(etcd_cluster("ev", 3, memberFailureTimeout="60s"))
    status = await wait_healthy(kubectl, "ev", 3)

    async def no_eviction_allowed() -> bool:
        pdb = kubectl.get("pdb", "ev")
        return pdb["spec"]["minAvailable"] == 3 and (pdb.get("status") or {}).get("currentHealthy") == 3

    await wait_until(no_eviction_allowed, "a steady budget that allows no eviction", timeout=30)
    first = sorted(member_nodes(kubectl, "ev"))[0]
    code, output = await evict(kubectl, first, dry_run=True)
    assert code != 0 and "disruption budget" in output, output
    await asyncio.sleep(3)
    assert first in member_nodes(kubectl, "ev")
    assert "kustos.dev/eviction-requested" not in kubectl.get("pod", first)["metadata"].get("annotations", {})

    targets = sorted(set(member_nodes(kubectl, "ev").values()))
    # The first member has no empty node to go to (the spare worker is tainted, as a full
    # cluster's would be): its replacement shares a node with another member, never the one
    # being emptied (a replacement there would be evicted in turn, and again).
    spare = [n for n in worker_nodes(kubectl) if n not in targets]
    kubectl.cluster.kubectl("taint", "nodes", *spare, f"{FULL_TAINT}=true:NoSchedule")
    refusals, times = 0, []
    try:
        with operator_log_kept_on_failure(operator, "evictions_alone_move"):
            async with Watched(kubectl, "ev", status) as watched:
                for node in targets:
                    started = time.monotonic()
                    refusals += await evict_until_empty(kubectl, operator, "ev", node)
                    times.append(time.monotonic() - started)
                    print(f"member left {node} after {times[-1]:.1f} s: {member_nodes(kubectl, 'ev')}")
                    kubectl.cluster.kubectl("taint", "nodes", *spare, f"{FULL_TAINT}-", check=False)
                    status = await wait_healthy(kubectl, "ev", 3)
                    watched.writer.update(status)
            print(f"{len(watched.writer.acknowledged)} writes acknowledged, {refusals} evictions refused")
            assert refusals >= len(targets)
            await assert_moved_keeping_every_write(kubectl, "ev", watched, status)
    finally:
        kubectl.cluster.kubectl("taint", "nodes", *spare, f"{FULL_TAINT}-", check=False)


async def test_a_volume_too_small_for_the_data_is_said_with_the_size_needed(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """A 256 MiB volume (a 16 MiB quota derived from it) filled with live data, distinct keys
    that no compaction frees: NOSPACE is recovered as always, and the cluster says the volume
    is too small, naming the size that would hold the data."""
    kubectl.apply(etcd_cluster("tiny", 1, storage={"type": "pvc", "size": "256Mi"},
                               maintenance={"defragmentation": {"enabled": False}}))  # fmt: skip
    status = await wait_healthy(kubectl, "tiny", 1)
    value = b"x" * (64 * 1024)
    async with EtcdClient(status["members"][0]["clientUrl"], timeout=10.0) as client:
        for i in range(2000):
            try:
                await client.put(f"/live/{i:05d}", value)
            except NoSpace:
                break
        else:
            raise AssertionError("the 16 MiB quota was never reached")

    async def said() -> str | None:
        selector = "involvedObject.name=tiny,reason=VolumeTooSmall"
        events = kubectl("get", "events", "--field-selector", selector, "-o", "jsonpath={.items[*].message}")
        return events or None

    message = await wait_until(said, "the cluster to say its volume is too small", timeout=120,
                               cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert "derived from spec.storage.size 256Mi" in message and "at least 1Gi is needed" in message, message
    maintenance = status_of(kubectl, "tiny")["maintenance"]
    assert "the volume is too small" in maintenance["message"], maintenance
