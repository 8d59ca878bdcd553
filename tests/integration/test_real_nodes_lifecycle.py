"""An EtcdCluster's lifecycle on real nodes (issue 20, item 5): members are containers a kubelet
runs with containerd and runc, never the process runner's processes.

Four real nodes serve the module, started together: three for a cluster that spreads its
members with required anti-affinity and one spare its replacements land on. Members land
only there (``spec.pod``: the real nodes' label and taint); the operator is the suite's
(``running_operator``: the chart's ServiceAccount). One cluster, ``life``, is shared by the
scenarios that leave it whole (create, resize, member loss, backup); the others make their
own and delete it. Every scenario runs the ``Writer`` and ends with no acknowledged write lost.

The module's namespace enforces the restricted Pod Security level, and so does the chart's
namespace while its pods run here: every pod of these scenarios (members, backup and restore
agents, the operator's, the test's own StatefulSet) is admitted as restricted and runs so
under runc.
The last test runs the chart's pods from kustos's image, which real nodes import at their
start once `kustos dev image` has built it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import operator as dev_operator
from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.nodeimages import etcd_image
from kustos.devcluster.realnode import REAL_NODE_LABEL, RealNode
from kustos.devcluster.s3 import S3Server
from kustos.etcd.backup import AGENT_CONTAINER, BACKUP_LABEL, SAVE_CONTAINER
from kustos.etcd.client import EtcdClient, EtcdTLS, EtcdTLSError
from kustos.etcd.pods import restricted
from kustos.images import agent_image
from kustos.maintenance.planner import OUT_OF_SERVICE_TAINT
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    etcd_cluster,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import is_ready, wait_until
from tests.integration.operator import CHART_NAMESPACE, CHART_RELEASE, OperatorProcess, reset_chart_identity
from tests.integration.test_etcd_backup import s3, s3_secret, s3_storage  # noqa: F401  (fixture)
from tests.integration.test_etcd_recovery import wait_recovered
from tests.integration.test_etcd_tls import user_client_certificate
from tests.integration.test_maintenance import (
    FENCED,
    fence,
    policy,
    running,
    statefulset,
    taint_keys,
    unreachable,
)
from tests.integration.test_real_nodes import node_ready

pytestmark = [pytest.mark.integration, pytest.mark.real_nodes]

REAL_NODES = 4
OLD, NEW = (v.lstrip("v") for v in ETCD_VERSIONS[-2:])  # the newest minor and the one before
# Members run only on real nodes: their label, and the taint that keeps the session's other
# workloads off them.
ON_REAL_NODES: dict[str, Any] = {
    "nodeSelector": {REAL_NODE_LABEL: "true"},
    "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}
# The chart's nodeSelector value must be a string (helm --set makes "true" a boolean).
POOL_LABEL = "kustos.dev/pool"
# The chart's lease timings (values.yaml leaderElection), in place of the suite's fast ones.
LEASE = ("--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")
# A container the kubelet restarts is back within seconds; a node stopped is replaced after this.
FAILURE_TIMEOUT = "20s"
# The API server refuses any pod in the namespace that is not restricted.
ENFORCE_RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"


def on_real_nodes(name: str, size: int, anti_affinity: str = "preferred", **spec: Any) -> dict[str, Any]:
    return etcd_cluster(name, size, pod={**ON_REAL_NODES, "antiAffinity": anti_affinity},
                        memberFailureTimeout=FAILURE_TIMEOUT, **spec)  # fmt: skip


# ---- the module's nodes, namespace and operator ------------------------------------------


@pytest.fixture(scope="module")
def real_nodes(dev_cluster: DevCluster) -> Iterator[list[RealNode]]:
    """Four real nodes, started side by side, tainted for members only."""
    started = time.monotonic()
    nodes: list[RealNode] = []
    try:
        nodes = dev_cluster.start_real_nodes(range(1, REAL_NODES + 1))
        print(f"\n{REAL_NODES} real nodes Ready in {time.monotonic() - started:.1f} s")
        for node in nodes:
            dev_cluster.kubectl(
                "taint", "node", node.name, f"{REAL_NODE_LABEL}=true:NoSchedule", "--overwrite"
            )
        yield nodes
    finally:
        stopping = time.monotonic()
        with ThreadPoolExecutor(REAL_NODES) as pool:
            list(pool.map(dev_cluster.remove_real_node, nodes or dev_cluster.real_nodes()))
        print(f"\nreal nodes removed in {time.monotonic() - stopping:.1f} s")
        # The session cluster goes on without real nodes: no kube-proxy, no tables of it.
        dev_cluster.stop_kube_proxy()


@pytest.fixture(scope="module")
def kubectl(dev_cluster: DevCluster, real_nodes: list[RealNode]) -> Iterator[Kubectl]:
    """One namespace for the module (its clusters outlive a test), restricted enforced."""
    name = f"rn-{uuid.uuid4().hex[:8]}"
    dev_cluster.kubectl("create", "namespace", name)
    dev_cluster.kubectl("label", "namespace", name, ENFORCE_RESTRICTED)

    def default_service_account() -> bool:
        return bool(dev_cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).strip())

    deadline = time.monotonic() + 60
    while not default_service_account() and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        yield Kubectl(dev_cluster, name)
    finally:
        dev_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(
    crds: None, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The suite's operator (the chart's ServiceAccount), scoped to the module's namespace, with
    the chart's default lease timings: the suite's fast ones (a 3 s renew deadline) made it
    stand down, as it must, when this 2-core machine delayed a renewal, and no scenario here
    is about its failover (the chart's pods' is, last)."""
    with running_operator(kubectl, tmp_path_factory.mktemp("operator"), extra=LEASE) as process:
        yield process


@pytest.fixture(scope="module")
async def life(kubectl: Kubectl, operator: OperatorProcess, real_nodes: list[RealNode]) -> str:
    """The shared cluster: three members, one per real node (required anti-affinity)."""
    started = time.monotonic()
    kubectl.apply(on_real_nodes("life", 3, anti_affinity="required"))
    status = await wait_healthy(kubectl, "life", 3, timeout=180)
    print(f"\nlife: 3 members healthy on real nodes {time.monotonic() - started:.1f} s after create")
    assert_on_real_nodes(kubectl, "life", real_nodes, status)
    return "life"


# ---- what every scenario checks -----------------------------------------------------------


def member_pods(kubectl: Kubectl, cluster: str) -> list[dict[str, Any]]:
    pods = kubectl.get("pods", None, "-l", f"kustos.dev/cluster={cluster}")["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def assert_on_real_nodes(
    kubectl: Kubectl, cluster: str, nodes: list[RealNode], status: dict[str, Any]
) -> None:
    """Every member's pod is on a real node and its etcd is a container of that node's runtime."""
    by_name = {n.name: n for n in nodes}
    pods = {p["metadata"]["name"]: p for p in member_pods(kubectl, cluster)}
    for member in status["members"]:
        pod = pods[member["name"]]
        node = by_name.get(pod["spec"]["nodeName"])
        assert node is not None, f"{member['name']} runs on {pod['spec']['nodeName']}, not a real node"
        running = node.crictl(
            "ps", "--name", "etcd", "--label", f"io.kubernetes.pod.name={member['name']}", "-q"
        )
        assert running.split(), f"no etcd container of {member['name']} on {node.name}"


@dataclass
class Writes:
    """A writer started on a cluster; ``check`` stops it and finds every acknowledged key."""

    kubectl: Kubectl
    cluster: str
    writer: Writer

    def follow(self) -> dict[str, Any]:
        status = status_of(self.kubectl, self.cluster)
        self.writer.update(status)
        return status

    async def check(self) -> None:
        """Writes still go through after what the scenario did (10 more acknowledged), then
        every acknowledged key is on every member."""
        after = len(self.writer.acknowledged) + 10

        async def writing() -> bool:
            self.follow()
            return len(self.writer.acknowledged) >= after

        try:
            await until(self.kubectl, writing, f"writes to {self.cluster} going through", timeout=60)
        finally:
            await self.writer.stop()
        size = len(status_of(self.kubectl, self.cluster)["members"])
        status = await wait_healthy(self.kubectl, self.cluster, size)
        for member in status["members"]:
            assert await self.writer.missing(member["clientUrl"]) == [], f"{member['name']} lost writes"


async def start_writes(kubectl: Kubectl, cluster: str, tls: EtcdTLS | None = None) -> Writes:
    status = status_of(kubectl, cluster)
    writes = Writes(kubectl, cluster, Writer([m["clientUrl"] for m in status["members"]], tls))
    writes.writer.start()

    async def going() -> bool:
        return len(writes.writer.acknowledged) >= 10

    await wait_until(going, f"the writer to get going on {cluster}", timeout=30)
    return writes


async def until(kubectl: Kubectl, check: Any, what: str, timeout: float = 120) -> Any:
    return await wait_until(
        check, what, timeout=timeout, cluster=kubectl.cluster, namespace=kubectl.namespace
    )


async def backed_up(kubectl: Kubectl, name: str, cluster: str, **spec: Any) -> dict[str, Any]:
    """An EtcdBackup that succeeds; its first failed agent pod fails the test with its logs
    (kustos retries it with backoff, which would only wait longer)."""
    kubectl.apply({"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup", "metadata": {"name": name},
                   "spec": {"clusterName": cluster, **spec}})  # fmt: skip

    async def done() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        status = dict(kubectl.get("etcdbackup", name).get("status") or {})
        agents = kubectl.get("pods", None, "-l", f"{BACKUP_LABEL}={name}")["items"]
        failed = [p for p in agents if (p.get("status") or {}).get("phase") == "Failed"]
        return (status, failed) if failed or status.get("phase") == "Succeeded" else None

    status, failed = await until(kubectl, done, f"backup {name}", timeout=90)
    assert not failed, f"backup {name}'s agent failed on a real node:\n{agent_logs(kubectl, failed)}"
    return status


def agent_logs(kubectl: Kubectl, pods: list[dict[str, Any]]) -> str:
    """What the backup agents' containers said (a failed backup's reason is in them)."""
    return "\n".join(
        f"--- {p['metadata']['name']}/{c}:\n{kubectl('logs', p['metadata']['name'], '-c', c, check=False)}"
        for p in pods
        for c in (SAVE_CONTAINER, AGENT_CONTAINER)
    )


def delete_cluster(kubectl: Kubectl, name: str) -> None:
    """Free the nodes for the next scenario (the namespace goes at the module's end)."""
    kubectl("delete", "etcdcluster", name, "--wait=false", check=False)


# ---- the scenarios ------------------------------------------------------------------------


async def test_a_cluster_created_on_real_nodes_resizes_keeping_every_write(
    kubectl: Kubectl, life: str, real_nodes: list[RealNode]
) -> None:
    writes = await start_writes(kubectl, life)
    for size in (4, 3):  # the fourth member on the spare node, then back
        kubectl("patch", "etcdcluster", life, "--type=merge", "-p", json.dumps({"spec": {"size": size}}))

        async def resized(size: int = size) -> bool:
            current = writes.follow()
            members = current.get("members") or []
            return current.get("ready") == f"{size}/{size}" and len(members) == size

        await until(kubectl, resized, f"{life} resized to {size}")
        status = await wait_healthy(kubectl, life, size)
        writes.writer.update(status)
        assert_on_real_nodes(kubectl, life, real_nodes, status)
    await writes.check()
    assert_consistent(kubectl, life, 3, status)


async def test_a_deleted_member_pod_is_replaced_on_a_real_node(
    kubectl: Kubectl, life: str, real_nodes: list[RealNode]
) -> None:
    writes = await start_writes(kubectl, life)
    victim = next(m["name"] for m in status_of(kubectl, life)["members"] if m["leader"])
    kubectl("delete", "pod", victim, "--wait=false")

    async def replaced() -> bool:
        names = {m["name"] for m in writes.follow().get("members") or []}
        return victim not in names and len(names) == 3

    await until(kubectl, replaced, f"{victim} (the leader) replaced")
    status = await wait_healthy(kubectl, life, 3)
    writes.writer.update(status)
    assert_on_real_nodes(kubectl, life, real_nodes, status)
    await writes.check()
    assert_consistent(kubectl, life, 3, status)


async def test_a_killed_member_container_is_restarted_by_the_kubelet_as_the_same_member(
    kubectl: Kubectl, life: str, real_nodes: list[RealNode]
) -> None:
    status = status_of(kubectl, life)
    writes = await start_writes(kubectl, life)
    victim = next(m for m in status["members"] if m["leader"])
    pod = kubectl.get("pod", victim["name"])
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    # SIGKILL, as the OOM killer or a crash would end it; the kubelet restarts it.
    kubectl.cluster.crash_container(kubectl.namespace, victim["name"], "etcd", stay_down=False)

    async def restarted() -> bool:
        current = kubectl.get("pod", victim["name"])["status"]["containerStatuses"][0]
        writes.follow()
        return current["restartCount"] > restarts and bool(current.get("ready"))

    await until(kubectl, restarted, f"{victim['name']}'s etcd restarted by the kubelet")
    status = await wait_healthy(kubectl, life, 3)
    # Its data survived in the pod's emptyDir: the same member, not a replacement.
    assert {m["name"]: m["id"] for m in status["members"]}[victim["name"]] == victim["id"]
    assert kubectl.get("pod", victim["name"])["metadata"]["uid"] == pod["metadata"]["uid"]
    await writes.check()
    assert_consistent(kubectl, life, 3, status)


async def test_a_stopped_real_node_loses_its_member_then_is_cleared_out_of_service_once_fenced(
    kubectl: Kubectl, life: str, real_nodes: list[RealNode]
) -> None:
    """The node's kubelet and containers stop. The EtcdCluster replaces its member on the spare
    by itself; a StatefulSet pod pinned there by its claim moves only once a fencing agent says
    the node is off: kustos taints it out of service, releases the claim, the pod runs elsewhere.
    The node's return removes the taint."""
    cluster = kubectl.cluster
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy()))
    pinned = statefulset("pinned", beside=life)
    pinned["spec"]["template"]["spec"].update(ON_REAL_NODES)
    restricted(pinned["spec"]["template"])  # the namespace admits nothing else
    kubectl.apply(pinned)
    first = await running(kubectl, "pinned-0")
    node = first["spec"]["nodeName"]
    old_claim = kubectl.get("pvc", "data-pinned-0")["metadata"]["uid"]
    victim = next(p["metadata"]["name"] for p in member_pods(kubectl, life) if p["spec"]["nodeName"] == node)
    writes = await start_writes(kubectl, life)
    started = time.monotonic()
    cluster.take_node_down(node)
    try:

        async def replaced() -> bool:
            names = {m["name"] for m in writes.follow().get("members") or []}
            return victim not in names and len(names) == 3

        await until(kubectl, replaced, f"{victim} on stopped node {node} replaced", timeout=150)
        status = await wait_healthy(kubectl, life, 3)
        print(f"\nnode stopped -> member replaced and healthy: {time.monotonic() - started:.1f} s")
        writes.writer.update(status)
        nodes = {kubectl.get("pod", m["name"])["spec"]["nodeName"] for m in status["members"]}
        assert node not in nodes and len(nodes) == 3
        assert_on_real_nodes(kubectl, life, real_nodes, status)
        assert kubectl.get("pod", "pinned-0")["spec"]["nodeName"] == node, "moved before fencing"

        await unreachable(kubectl, node)
        fence(kubectl, node)
        fenced = time.monotonic()

        async def moved() -> dict[str, Any] | None:
            found = json.loads(kubectl("get", "pod", "pinned-0", "-o", "json", check=False) or "null")
            ok = found and found["spec"].get("nodeName") not in (None, node) and is_ready(found)
            return found if ok else None

        await until(kubectl, moved, "pinned-0 Running on another real node", timeout=150)
        print(f"\nfenced -> pinned pod Running elsewhere: {time.monotonic() - fenced:.1f} s")
        assert OUT_OF_SERVICE_TAINT in taint_keys(kubectl, node)
        assert kubectl.get("pvc", "data-pinned-0")["metadata"]["uid"] != old_claim, (
            "the claim was not released"
        )
        await writes.check()
    finally:
        cluster.bring_node_up(node)
        cluster.kubectl("annotate", "node", node, f"{FENCED}-")

    async def back() -> bool:
        return node_ready(cluster, node) == "True" and OUT_OF_SERVICE_TAINT not in taint_keys(kubectl, node)

    try:
        await until(kubectl, back, f"{node} Ready without the out-of-service taint", timeout=90)
    finally:
        kubectl("delete", "statefulset", "pinned", "--wait=false", check=False)
        cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)
    assert_consistent(kubectl, life, 3, status)


async def test_backups_to_a_claim_and_to_s3_restore_every_acknowledged_write(
    kubectl: Kubectl,
    life: str,
    s3: S3Server,  # noqa: F811
    real_nodes: list[RealNode],
) -> None:
    writes = await start_writes(kubectl, life)
    await asyncio.sleep(1)
    await writes.check()  # stopped: every key it saw acknowledged is in the backups below
    s3_secret(kubectl, s3)
    # The agent pods run the kustos image on the real nodes (they go where members may).
    on_claim, on_s3 = await asyncio.gather(
        backed_up(kubectl, "life-pvc", life), backed_up(kubectl, "life-s3", life, storage=s3_storage(s3))
    )
    assert on_claim["location"].startswith("pvc://") and on_s3["location"].startswith("s3://")
    agents = kubectl.get("pods", None, "-l", "kustos.dev/cluster-backup=life")["items"]
    real = {n.name for n in real_nodes}
    assert agents and all(p["spec"]["nodeName"] in real for p in agents)

    kubectl.apply(on_real_nodes("from-pvc", 1, restore={"backup": "life-pvc"}),
                  on_real_nodes("from-s3", 3, restore={"backup": "life-s3"}))  # fmt: skip
    try:
        for name, size in (("from-pvc", 1), ("from-s3", 3)):
            status = await wait_healthy(kubectl, name, size, timeout=180)
            assert status["recovery"]["sourceKind"] == "backup" and status["recovery"]["phase"] == "Succeeded"
            assert_on_real_nodes(kubectl, name, real_nodes, status)
            for member in status["members"]:
                assert await writes.writer.missing(member["clientUrl"]) == [], f"{member['name']} misses keys"
    finally:
        for name in ("from-pvc", "from-s3"):
            delete_cluster(kubectl, name)


@pytest.mark.timeout(480)
async def test_upgrade_to_the_new_minor_and_rollback_keep_every_write(
    kubectl: Kubectl, operator: OperatorProcess, real_nodes: list[RealNode]
) -> None:
    kubectl.apply(on_real_nodes("roll", 3, version=OLD))
    await wait_healthy(kubectl, "roll", 3, timeout=180)
    writes = await start_writes(kubectl, "roll")
    try:
        for version in (NEW, OLD):
            started = time.monotonic()
            kubectl("patch", "etcdcluster", "roll", "--type=merge", "-p",
                    json.dumps({"spec": {"version": version}}))  # fmt: skip

            async def rolled(version: str = version) -> bool:
                current = writes.follow()
                members = current.get("members") or []
                return (current.get("currentVersion") == version and current.get("phase") == "Running"
                        and len(members) == 3 and all(m["healthy"] for m in members))  # fmt: skip

            try:
                await until(kubectl, rolled, f"roll on etcd {version}", timeout=150)
            except AssertionError as err:
                status = status_of(kubectl, "roll")
                raise AssertionError(f"{err}\nstatus: {json.dumps(status)[:4000]}") from None
            print(f"\nroll to {version}: {time.monotonic() - started:.1f} s")
            status = await wait_healthy(kubectl, "roll", 3)
            writes.writer.update(status)
            images = {p["spec"]["containers"][0]["image"] for p in member_pods(kubectl, "roll")}
            assert images == {etcd_image(version)}, images
            assert_on_real_nodes(kubectl, "roll", real_nodes, status)
        await writes.check()
        assert_consistent(kubectl, "roll", 3, status)
    finally:
        delete_cluster(kubectl, "roll")


async def test_a_tls_cluster_serves_and_replaces_a_member_keeping_every_write(
    kubectl: Kubectl, operator: OperatorProcess, real_nodes: list[RealNode], tmp_path: Path
) -> None:
    kubectl.apply(on_real_nodes("sec", 3, tls={"lifetime": "24h"}))
    try:
        status = await wait_healthy(kubectl, "sec", 3, timeout=180)
        assert all(m["clientUrl"].startswith("https://") for m in status["members"])
        assert_on_real_nodes(kubectl, "sec", real_nodes, status)
        user = user_client_certificate(kubectl, "sec", tmp_path / "user")
        writes = await start_writes(kubectl, "sec", tls=user)
        victim = next(m["name"] for m in status["members"] if not m["leader"])
        kubectl("delete", "pod", victim, "--wait=false")

        async def replaced() -> bool:
            names = {m["name"] for m in writes.follow().get("members") or []}
            return victim not in names and len(names) == 3

        await until(kubectl, replaced, f"{victim} replaced over TLS", timeout=180)
        status = await wait_healthy(kubectl, "sec", 3, timeout=120)
        writes.writer.update(status)
        await writes.check()
        # A client without a certificate is refused by every member.
        async with EtcdClient(
            status["members"][0]["clientUrl"], EtcdTLS(user.ca_file), timeout=3.0
        ) as anonymous:
            with pytest.raises(EtcdTLSError):
                await anonymous.status()
    finally:
        delete_cluster(kubectl, "sec")


async def test_quorum_loss_is_recovered_from_the_survivor_with_every_acknowledged_write(
    kubectl: Kubectl, operator: OperatorProcess, real_nodes: list[RealNode]
) -> None:
    kubectl.apply(on_real_nodes("dr", 3, recovery={"automatic": True, "delay": "3s"}))
    try:
        status = await wait_healthy(kubectl, "dr", 3, timeout=180)
        writes = await start_writes(kubectl, "dr")
        await asyncio.sleep(2)
        await writes.writer.stop()
        survivor = next(m for m in status["members"] if not m["leader"])

        async def caught_up() -> bool:  # the survivor has applied every acknowledged write
            return await writes.writer.missing(survivor["clientUrl"]) == []

        await until(kubectl, caught_up, f"{survivor['name']} caught up")
        lost = [m["name"] for m in status["members"] if m["name"] != survivor["name"]]
        started = time.monotonic()
        kubectl("delete", "pod", *lost, "--grace-period=0", "--force", "--wait=false")

        status = await wait_recovered(kubectl, "dr", 3)
        print(f"\nquorum lost -> rebuilt and healthy: {time.monotonic() - started:.1f} s")
        recovery = status["recovery"]
        assert recovery["sourceKind"] == "member" and recovery["source"] == survivor["name"], recovery
        assert_on_real_nodes(kubectl, "dr", real_nodes, status)
        for member in status["members"]:
            assert await writes.writer.missing(member["clientUrl"]) == [], f"{member['name']} lost writes"
    finally:
        delete_cluster(kubectl, "dr")


async def test_the_charts_operator_pods_on_real_nodes_fail_over_when_the_leader_pod_is_killed(
    kubectl: Kubectl, operator: OperatorProcess, real_nodes: list[RealNode]
) -> None:
    """Last: the chart's two pods (the kustos image, the chart's security context) on the real
    nodes take over from the module's operator; the leader's pod is killed mid-resize and the
    other pod finishes it."""
    cluster = kubectl.cluster
    image = agent_image()
    for node in real_nodes:  # imported at the node's start from `kustos dev image`'s archive
        assert node.crictl("inspecti", image, check=False).strip(), (
            f"{node.name} has no {image}: run `kustos dev image`"
        )
    operator.stop()  # one operator at a time: the chart's pods manage this namespace now
    for node in real_nodes:
        cluster.kubectl("label", "node", node.name, f"{POOL_LABEL}=real", "--overwrite")
    reset_chart_identity(cluster)
    # The chart's namespace enforces restricted while its pods run here (the suite's other
    # modules share it, so the label goes again at the end).
    cluster.kubectl("create", "namespace", CHART_NAMESPACE, check=False)
    cluster.kubectl("label", "namespace", CHART_NAMESPACE, ENFORCE_RESTRICTED, "--overwrite")
    on_real = [
        f"nodeSelector.{POOL_LABEL.replace('.', chr(92) + '.')}=real",
        f"tolerations[0].key={REAL_NODE_LABEL}",
        "tolerations[0].operator=Exists",
        "tolerations[0].effect=NoSchedule",
    ]
    started = time.monotonic()
    dev_operator.install(cluster, ["crds.install=false", *on_real], CHART_RELEASE, CHART_NAMESPACE)
    try:
        pods = dev_operator.wait_ready(cluster, 2, timeout=180)
        print(f"\nthe chart's 2 operator pods Ready on real nodes in {time.monotonic() - started:.1f} s")
        real = {n.name for n in real_nodes}
        assert {p["spec"]["nodeName"] for p in pods} <= real
        kubectl.apply(on_real_nodes("ha", 3))
        status = await wait_healthy(kubectl, "ha", 3, timeout=180)
        writes = await start_writes(kubectl, "ha")
        leader = dev_operator.leader_pod(cluster)
        assert leader in {p["metadata"]["name"] for p in pods}, f"the Lease names {leader}"
        kubectl("patch", "etcdcluster", "ha", "--type=merge", "-p", '{"spec":{"size":4}}')

        async def in_flight() -> bool:
            current = writes.follow()
            return len(current.get("members") or []) > 3 or current.get("ready") == "3/4"

        await until(kubectl, in_flight, "the resize to be under way")
        killed = time.monotonic()
        cluster.kubectl("delete", "pod", "-n", CHART_NAMESPACE, leader, "--grace-period=0", "--force")

        async def taken_over() -> str | None:
            holder = dev_operator.leader_pod(cluster)
            return holder if holder and holder != leader else None

        successor = await until(kubectl, taken_over, "another operator pod to take the Lease")
        print(f"\nleader pod killed -> {successor} leads: {time.monotonic() - killed:.1f} s")

        async def resized() -> bool:
            current = writes.follow()
            return current.get("ready") == "4/4" and len(current.get("members") or []) == 4

        await until(kubectl, resized, "the new leader to finish the resize", timeout=180)
        status = await wait_healthy(kubectl, "ha", 4)
        writes.writer.update(status)
        assert_on_real_nodes(kubectl, "ha", real_nodes, status)
        await writes.check()
        assert_consistent(kubectl, "ha", 4, status)
    finally:
        delete_cluster(kubectl, "ha")
        # The pods first: uninstalling removes the RBAC while they may still be writing.
        dev_operator.install(cluster, ["crds.install=false", "replicas=0", *on_real], CHART_RELEASE,
                             CHART_NAMESPACE)  # fmt: skip
        dev_operator.wait_gone(cluster, timeout=120)
        reset_chart_identity(cluster)
        cluster.kubectl("label", "namespace", CHART_NAMESPACE, "pod-security.kubernetes.io/enforce-")
