"""``kustos purge-node`` against a kubeadm-style stacked etcd: real etcd processes with
kubeadm's certificate layout, on the addresses their control-plane Nodes report.

Three control-plane Nodes (kwok-managed, tainted so nothing else lands there) each "run" a
member: an etcd process listening on the Node's InternalIP, its member named after the
node, as kubeadm sets it up. One node dies. The purge is refused below the minimum, for a
Ready node, and while removing the member would lose quorum (another member down, the dead
node's own etcd still running as a partitioned node's would); once the other member is
back it removes the member and the Node, and etcd keeps its data.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.binaries import binary_path
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.kwokconfig import MANAGED_LABEL, node_manifest
from kustos.etcd import tls
from kustos.etcd.client import EtcdClient, EtcdError, EtcdTLS
from kustos.etcd.kubeadm import APISERVER_ENDPOINT_ANNOTATION
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import running_operator
from tests.integration.kube import wait_until

KUSTOS = Path(sys.executable).parent / "kustos"
TEST_TAINT = {"key": "kustos.dev/purge-test", "effect": "NoSchedule"}
FIRST_INDEX = 201


@dataclass
class Member:
    node: str
    ip: str
    data: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def client_url(self) -> str:
        return f"https://{self.ip}:2379"


def kubeadm_pki(directory: Path, members: list[Member]) -> Path:
    """kubeadm's layout: etcd/ca.{crt,key}, etcd/server, etcd/peer, etcd/healthcheck-client."""
    now = datetime.now(UTC)
    etcd = directory / "etcd"
    etcd.mkdir(parents=True)
    ca = tls.new_ca("etcd-ca", now)
    (etcd / "ca.crt").write_bytes(ca.cert)
    (etcd / "ca.key").write_bytes(ca.key)
    ips = (*(m.ip for m in members), "127.0.0.1")
    for name, server, client in (
        ("server", True, True),
        ("peer", True, True),
        ("healthcheck-client", False, True),
    ):
        pair = tls.issue(ca, f"kube-etcd-{name}", now, timedelta(days=1), ("localhost",), ips, server, client)
        (etcd / f"{name}.crt").write_bytes(pair.cert)
        (etcd / f"{name}.key").write_bytes(pair.key)
    return directory


def start_etcd(member: Member, members: list[Member], pki: Path, log_dir: Path) -> None:
    etcd = pki / "etcd"
    cluster = ",".join(f"{m.node}=https://{m.ip}:2380" for m in members)
    argv = [
        str(binary_path("etcd")), f"--name={member.node}", f"--data-dir={member.data}",
        f"--listen-client-urls={member.client_url}", f"--advertise-client-urls={member.client_url}",
        f"--listen-peer-urls=https://{member.ip}:2380", f"--initial-advertise-peer-urls=https://{member.ip}:2380",
        f"--initial-cluster={cluster}", "--initial-cluster-state=new", "--initial-cluster-token=purge-test",
        "--client-cert-auth", f"--trusted-ca-file={etcd / 'ca.crt'}",
        f"--cert-file={etcd / 'server.crt'}", f"--key-file={etcd / 'server.key'}",
        "--peer-client-cert-auth", f"--peer-trusted-ca-file={etcd / 'ca.crt'}",
        f"--peer-cert-file={etcd / 'peer.crt'}", f"--peer-key-file={etcd / 'peer.key'}",
        "--listen-metrics-urls=", "--log-level=warn",
    ]  # fmt: skip
    with (log_dir / f"{member.node}.log").open("ab") as sink:
        member.process = subprocess.Popen(argv, stdout=sink, stderr=sink, stdin=subprocess.DEVNULL)


def stop_etcd(member: Member) -> None:
    if member.process is not None and member.process.poll() is None:
        member.process.kill()
        member.process.wait(10)
    member.process = None


def client_tls(pki: Path) -> EtcdTLS:
    etcd = pki / "etcd"
    return EtcdTLS(etcd / "ca.crt", etcd / "healthcheck-client.crt", etcd / "healthcheck-client.key")


async def member_names(member: Member, pki: Path) -> set[str]:
    async with EtcdClient(member.client_url, client_tls(pki), timeout=5) as client:
        return {m.name for m in (await client.member_list()).members}


async def two_members(b: Member, c: Member, pki: Path) -> None:
    """b and c are the members left (asked until a leader answers: removing the leader's
    member makes the others elect a new one)."""

    async def left() -> bool:
        try:
            return await member_names(c, pki) == {b.node, c.node}
        except EtcdError:
            return False

    await wait_until(left, f"etcd's members to be {b.node} and {c.node}", timeout=30)


def purge(cluster: DevCluster, pki: Path, *args: str) -> subprocess.CompletedProcess[str]:
    flags = ["--kubeconfig", str(cluster.kubeconfig), "--certificates_dir", str(pki)]
    return subprocess.run(
        [str(KUSTOS), "purge-node", *args, *flags], capture_output=True, text=True, timeout=120
    )


def node_ready(cluster: DevCluster, name: str) -> bool:
    found = json.loads(cluster.kubectl("get", "node", name, "-o", "json", check=False) or "null")
    conditions = (found or {}).get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def apiserver_pod(node: str, ip: str) -> dict[str, Any]:
    """The static pod kubeadm runs, with the annotation kubeadm writes on it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"kube-apiserver-{node}",
            "namespace": "kube-system",
            "labels": {"component": "kube-apiserver", "tier": "control-plane"},
            "annotations": {APISERVER_ENDPOINT_ANNOTATION: f"{ip}:6443"},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.36.3"}],
            "tolerations": [{"operator": "Exists"}],
        },
    }


@contextmanager
def stacked_control_plane(
    dev_cluster: DevCluster, directory: Path, prefix: str = "purge", first_index: int = FIRST_INDEX
) -> Iterator[tuple[list[Member], Path]]:
    """Three control-plane Nodes, each with its kubeadm-style etcd member on its InternalIP
    (``<cluster>-<prefix>-<i>``, node indices from ``first_index``); all gone at the end."""
    slot = dev_cluster.slot
    names = [f"{dev_cluster.config.name}-{prefix}-{i}" for i in range(3)]
    manifests = []
    for i, name in enumerate(names):
        node = node_manifest(name, slot, first_index + i, control_plane=True)
        node["spec"]["taints"].append(TEST_TAINT)
        manifests.append(node)
    members = [
        Member(n["metadata"]["name"], n["status"]["addresses"][0]["address"], directory / f"data-{i}")
        for i, n in enumerate(manifests)
    ]
    pki = kubeadm_pki(directory / "pki", members)
    logs = directory / "logs"
    logs.mkdir()
    for member in members:
        start_etcd(member, members, pki, logs)
    dev_cluster.kubectl(
        "create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    )
    pods = [apiserver_pod(m.node, m.ip) for m in members]
    dev_cluster.kubectl(
        "apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    )
    try:
        yield members, pki
    finally:
        for member in members:
            stop_etcd(member)
        for name in names:
            dev_cluster.kubectl("delete", "node", name, "--wait=false", check=False)
            pod = f"kube-apiserver-{name}"
            dev_cluster.kubectl(
                "delete", "pod", "-n", "kube-system", pod, "--grace-period=0", "--force", check=False
            )


@pytest.fixture
def stacked(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[tuple[list[Member], Path]]:
    with stacked_control_plane(dev_cluster, tmp_path) as control_plane:
        yield control_plane


async def test_purge_of_a_stacked_etcd_control_plane_node_keeps_quorum(
    dev_cluster: DevCluster, stacked: tuple[list[Member], Path]
) -> None:
    members, pki = stacked
    a, b, c = members

    async def healthy() -> bool:
        try:
            return len(await member_names(c, pki)) == 3 and all(
                node_ready(dev_cluster, m.node) for m in members
            )
        except (OSError, Exception):
            return False

    await wait_until(healthy, "three etcd members and three Ready control-plane Nodes", timeout=90)
    async with EtcdClient(b.client_url, client_tls(pki)) as client:
        await client.put("/kept", "before the purge")

    # A Ready node is refused unless forced.
    refused = purge(dev_cluster, pki, a.node, "--yes")
    assert refused.returncode == 2 and f"node {a.node} is Ready" in refused.stderr, refused

    # Node a stops reporting; its etcd keeps running, as on a node that is only cut off.
    dev_cluster.kubectl("label", "node", a.node, f"{MANAGED_LABEL}-")

    async def a_not_ready() -> bool:
        return not node_ready(dev_cluster, a.node)

    await wait_until(a_not_ready, f"{a.node} NotReady", timeout=60)

    # Below the minimum: b, c and the cluster's own control-plane node stay Ready (3 < 4).
    refused = purge(dev_cluster, pki, a.node, "--yes", "--min_ready_master_nodes", "4")
    assert refused.returncode == 2, refused
    assert "would leave 3 ready control-plane node(s); minReadyMasterNodeCount is 4" in refused.stderr

    # b's member down too: removing a's would leave c alone of {b, c}, no quorum. Refused,
    # and a's member is still there.
    stop_etcd(b)
    # c lists the members (a linearizable read) once a and c have a leader, if b was it.
    await wait_until(lambda: member_names(c, pki), "a leader among a and c", timeout=30)
    refused = purge(dev_cluster, pki, a.node, "--yes")
    assert refused.returncode == 2, refused
    assert "EtcdMember: refused" in refused.stdout and "needed for quorum" in refused.stdout, refused.stdout
    assert a.node in await member_names(c, pki)
    assert node_ready(dev_cluster, b.node)  # the guard is about etcd, not the Node

    # b back: the purge goes on from where it stopped, removes a's member, then the Node.
    start_etcd(b, members, pki, pki.parent / "logs")

    async def b_back() -> bool:
        try:
            async with EtcdClient(b.client_url, client_tls(pki), timeout=3) as client:
                await client.put("/b", "back")
            return True
        except Exception:
            return False

    await wait_until(b_back, "b's member serving again", timeout=60)
    # etcd's strict reconfiguration check counts a member as active only once it has been
    # connected for 5 s (etcdserver: unhealthy cluster before that): the purge would be
    # refused, and say so, until then.
    await asyncio.sleep(6)
    done = purge(dev_cluster, pki, a.node, "--yes")
    assert done.returncode == 0, done
    assert "EtcdMember: done: removed etcd member" in done.stdout, done.stdout
    assert f"Node: done: deleted Node {a.node}" in done.stdout
    await two_members(b, c, pki)
    assert dev_cluster.kubectl("get", "node", a.node, check=False).strip() == ""
    async with EtcdClient(c.client_url, client_tls(pki)) as client:
        kept = await client.range("/kept")
    assert [kv.value for kv in kept.kvs] == [b"before the purge"]


async def test_the_controller_purges_a_dead_control_plane_node_and_resumes_after_a_crash(
    dev_cluster: DevCluster, stacked: tuple[list[Member], Path], kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """shouldEnablePurgeNodes with fencing.afterToleration: past the toleration, the operator
    purges on its own; killed right after removing the etcd member (before recording it), a
    restarted operator goes on."""
    members, pki = stacked
    a, b, c = members

    async def healthy() -> bool:
        try:
            return len(await member_names(c, pki)) == 3 and all(
                node_ready(dev_cluster, m.node) for m in members
            )
        except Exception:
            return False

    await wait_until(healthy, "three etcd members and three Ready control-plane Nodes", timeout=90)
    policy = purge_policy(pki)
    dev_cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy))
    marker = tmp_path / "fault-marker"
    env = {"KUSTOS_FAULT_EXIT_AFTER": "PurgeEtcdMember", "KUSTOS_FAULT_MARKER": str(marker)}
    try:
        with running_operator(kubectl, tmp_path / "first", env=env) as first:
            # The node dies: heartbeat and its etcd gone.
            dev_cluster.kubectl("label", "node", a.node, f"{MANAGED_LABEL}-")
            stop_etcd(a)

            async def crashed() -> bool:
                return not first.alive()

            await wait_until(crashed, "the operator to exit after removing the member", timeout=120)
        assert marker.read_text() == "PurgeEtcdMember"
        await two_members(b, c, pki)
        assert dev_cluster.kubectl("get", "node", a.node, "-o", "name", check=False).strip(), (
            "deleted too early"
        )
        with running_operator(kubectl, tmp_path / "second", env=env):

            async def purged() -> bool:
                return dev_cluster.kubectl("get", "node", a.node, "-o", "name", check=False).strip() == ""

            await wait_until(purged, f"Node {a.node} purged by the restarted operator", timeout=90)

            async def recorded() -> dict[str, Any] | None:
                found = json.loads(dev_cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json"))
                last = (found.get("status") or {}).get("lastAction") or {}
                return last if last.get("message") == f"deleted Node {a.node}" else None

            last = await wait_until(recorded, "the purge recorded in the policy's status", timeout=30)
            assert last["action"] == "Purge" and last["outcome"] == "Done" and last["node"] == a.node
        await two_members(b, c, pki)
        async with EtcdClient(b.client_url, client_tls(pki)) as client:
            await client.put("/after", "the purge")
    finally:
        dev_cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)


def purge_policy(pki: Path | None = None, **spec: Any) -> dict[str, Any]:
    """Purges on, a node fenced once unreachable past 5 s, kubeadm's etcd certificates in ``pki``
    (then no certificate rotation: its kube-apiserver pods are kubeadm's in name only, with no
    /etc/kubernetes behind them), and ``spec``."""
    certificates = {} if pki is None else {"certificatesDir": str(pki), "rotateCerts": False}
    return {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "MaintenancePolicy",
        "metadata": {"name": "default"},
        "spec": {
            "shouldEnablePurgeNodes": True,
            "nodeUnreachableToleration": "5s",
            "fencing": {"afterToleration": True},  # EKCO's: past the toleration is fenced
            **certificates,
            **spec,
        },
    }
