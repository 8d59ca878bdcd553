"""High availability (SPEC F-OPS-3): the operator installed by its chart, two replicas as
pods of the chart's Deployment (the checkout's kustos in the pods' network namespaces, as the
chart's ServiceAccount). The leader's process is killed while a 3 -> 5 resize is in flight:
the standby takes the Lease once it expires, finishes the resize, and no acknowledged write
is lost. The failover time is measured by benchmarks/operator_failover_bench.py, not here.
The same pods serve `kubectl kustos status NAME` the figures only the leader keeps in memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kustos.devcluster import operator as dev_operator
from kustos.devcluster.cluster import DevCluster
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import Writer, assert_consistent, etcd_cluster, status_of, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import CHART_NAMESPACE, CHART_RELEASE, reset_chart_identity
from tests.integration.test_kubectl_plugin import kubectl_kustos

pytestmark = pytest.mark.process_runner(
    "failover of this checkout's kustos, unbuilt; the chart's image failing over: test_real_nodes_lifecycle"
)

REPLICAS = 2


@pytest.fixture(scope="module")
def chart_operator(dev_cluster: DevCluster, crds: None) -> Iterator[None]:
    """The chart with its defaults (two replicas, the whole cluster, webhooks through its
    Service) in kustos-system, in place of the session's release (``chart_identity``), which is
    installed again on next use. CRDs come from the session (``crds``): the chart leaves them."""
    reset_chart_identity(dev_cluster)
    dev_operator.install(dev_cluster, ["crds.install=false"], CHART_RELEASE, CHART_NAMESPACE)
    try:
        dev_operator.wait_ready(dev_cluster, REPLICAS, timeout=180)
        yield
    finally:
        # The pods first: uninstalling removes the RBAC while they may still be writing, and
        # the audit check would see those refusals.
        dev_operator.install(
            dev_cluster, ["crds.install=false", "replicas=0"], CHART_RELEASE, CHART_NAMESPACE
        )
        dev_operator.wait_gone(dev_cluster, timeout=120)
        reset_chart_identity(dev_cluster)


def _ready_pods(cluster: DevCluster) -> set[str]:
    """Operator pods Ready and not being deleted (the session release's, if any, are going)."""
    return {p["metadata"]["name"] for p in dev_operator.wait_ready(cluster, REPLICAS, timeout=60)}


def _pod_log(cluster: DevCluster, pod: str) -> str:
    return cluster.kubectl("logs", "-n", dev_operator.NAMESPACE, pod, check=False)


async def test_kubectl_kustos_status_shows_each_members_backend_from_the_leading_pod(
    chart_operator: None, dev_cluster: DevCluster, kubectl: Kubectl
) -> None:
    """The figures the operator keeps only in memory reach the plugin through the API server's
    proxy to the leading pod's /metrics: a real backend size, in-use size and quota per member."""
    kubectl.apply(etcd_cluster("seen", 1))
    await wait_healthy(kubectl, "seen", 1, timeout=60)

    async def backends_shown() -> dict[str, list[str]] | None:
        result = kubectl_kustos(kubectl, "status", "seen", "-n", kubectl.namespace)
        assert result.returncode == 0, result.stderr
        cells = [line.split("│")[1:-1] for line in result.stdout.splitlines() if line.startswith("│ seen-")]
        members = {c[0].strip(): [v.strip() for v in c[4:7]] for c in cells}
        if not members or any("-" in v for v in members.values()):
            return None
        assert "show as -" not in result.stdout, result.stdout  # no footnote: nothing missing
        return members

    members = await wait_until(backends_shown, "the plugin to show the members' backends", timeout=30)
    assert list(members) == ["seen-0"], members
    size, in_use, quota = members["seen-0"]
    assert size.endswith(("KiB", "MiB")) and in_use.endswith(("B", "KiB", "MiB")), members
    assert quota == "2.0 GiB", members  # etcd's default: the test cluster sets no quota
    kubectl("delete", "etcdcluster", "seen", "--wait=false")


async def test_the_standby_finishes_a_resize_when_the_leader_is_killed(
    chart_operator: None, dev_cluster: DevCluster, kubectl: Kubectl
) -> None:
    assert len(_ready_pods(dev_cluster)) == REPLICAS
    kubectl.apply(etcd_cluster("ha", 3))
    status = await wait_healthy(kubectl, "ha", 3, timeout=180)
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    leader = dev_operator.leader_pod(dev_cluster)
    assert leader in _ready_pods(dev_cluster), f"the Lease names {leader}, not a ready operator pod"
    try:
        kubectl("patch", "etcdcluster", "ha", "--type=merge", "-p", '{"spec":{"size":5}}')

        async def in_flight() -> bool:
            current = status_of(kubectl, "ha")
            writer.update(current)
            # A fourth member added (a learner or its pod), the fifth not yet.
            return 3 < len(current.get("members") or []) < 5 or current.get("ready") == "3/4"

        await wait_until(in_flight, "the resize to be under way", timeout=120, cluster=dev_cluster,
                         namespace=kubectl.namespace)  # fmt: skip
        # SIGKILL, and no restart: the Lease is not released, the standby must wait it out.
        dev_cluster.crash_container(dev_operator.NAMESPACE, leader, "operator", stay_down=True)

        async def taken_over() -> str | None:
            holder = dev_operator.leader_pod(dev_cluster)
            return holder if holder and holder != leader else None

        successor = await wait_until(taken_over, "the standby to take the Lease", timeout=120)

        async def resized() -> bool:
            current = status_of(kubectl, "ha")
            writer.update(current)
            return current.get("ready") == "5/5" and len(current.get("members") or []) == 5

        await wait_until(resized, "the new leader to finish the resize", timeout=180, cluster=dev_cluster,
                         namespace=kubectl.namespace)  # fmt: skip
        status = await wait_healthy(kubectl, "ha", 5)
        writer.update(status)
    finally:
        await writer.stop()
        dev_cluster.release_container(dev_operator.NAMESPACE, leader, "operator")
    assert_consistent(kubectl, "ha", 5, status)
    assert writer.acknowledged, "the writer never got a write through"
    assert await writer.missing(status["members"][0]["clientUrl"]) == []
    log = _pod_log(dev_cluster, successor)
    assert "became the leader" in log, log[-3000:]
    assert "AddMember" in log or "PromoteMember" in log, log[-3000:]
    kubectl("delete", "etcdcluster", "ha", "--wait=false")
