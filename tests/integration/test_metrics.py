"""The domain metrics and the chart's alert rules against the dev cluster: a running operator's
/metrics says what its EtcdCluster's status says, and a real Prometheus scraping it with the
chart's rules sees "quorum at risk" fire while a member is down and clear once it is back,
the leader changes counted when the leader is killed, and "backend near quota" fire on a real
member with a small quota and clear once compaction and the operator's defragmentation free it.
The dashboard's picture in docs/metrics.md is drawn from this Prometheus's data
(KUSTOS_UPDATE_DOCS=1 writes it there; otherwise into the test's temporary directory)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from kustos.etcd.client import EtcdClient, NoSpace
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.prometheus import render_dashboard, running_prometheus
from tests.integration.test_maintenance import fence, last_action, policy, restored, unreachable

pytestmark = pytest.mark.process_runner(
    "metrics and alert rules follow status; members are killed to fire alerts, nothing runc enforces"
)

PICTURE = Path(__file__).resolve().parents[2] / "docs" / "metrics-dashboard.png"


async def test_quorum_at_risk_fires_while_a_member_is_down_and_clears_when_it_is_back(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    # A long failure timeout: the stopped member must come back, not be replaced.
    kubectl.apply(etcd_cluster("m", 3, memberFailureTimeout="10m"))
    status = await wait_healthy(kubectl, "m", 3)
    leader = next(m["name"] for m in status["members"] if m["leader"])
    ns = kubectl.namespace
    nn = f'{{name="m",namespace="{ns}"}}'  # the exposition sorts labels by name

    scraped = operator.metrics()
    assert scraped[f"kustos_etcdcluster_healthy_voters{nn}"] == 3
    assert scraped[f"kustos_etcdcluster_quorum_margin{nn}"] == 1
    assert scraped[f"kustos_etcdcluster_leader_member_index{nn}"] == int(leader.rsplit("-", 1)[1])
    assert scraped[f'kustos_etcdcluster_phase{{name="m",namespace="{ns}",phase="Running"}}'] == 1

    start = time.time()
    with running_prometheus(f"127.0.0.1:{operator.metrics_port}", tmp_path / "prometheus") as prometheus:
        victim = next(m["name"] for m in status["members"] if not m["leader"])

        async def scraped_healthy() -> bool:
            return bool(prometheus.query(f"kustos_etcdcluster_quorum_margin{nn} == 1"))

        await wait_until(scraped_healthy, "Prometheus scraped the healthy cluster", timeout=30)
        assert prometheus.state("KustosEtcdQuorumAtRisk", namespace=ns, name="m") is None
        kubectl.cluster.crash_container(ns, victim, "etcd", stay_down=True)
        try:

            async def firing() -> bool:
                return prometheus.state("KustosEtcdQuorumAtRisk", namespace=ns, name="m") == "firing"

            await wait_until(firing, "KustosEtcdQuorumAtRisk firing", timeout=90, cluster=kubectl.cluster,
                             namespace=ns)  # fmt: skip
            assert prometheus.state("KustosEtcdQuorumLost", namespace=ns, name="m") is None
        finally:
            kubectl.cluster.release_container(ns, victim, "etcd")

        async def cleared() -> bool:
            return prometheus.state("KustosEtcdQuorumAtRisk", namespace=ns, name="m") is None

        await wait_until(cleared, "KustosEtcdQuorumAtRisk cleared", timeout=90, cluster=kubectl.cluster,
                         namespace=ns)  # fmt: skip

        # The leader killed and kept down: another member leads, and the change is counted.
        changes = f"kustos_etcdcluster_leader_changes_total{nn}"
        before = operator.metrics()[changes]
        kubectl.cluster.crash_container(ns, leader, "etcd", stay_down=True)
        try:

            async def counted() -> list[dict[str, object]]:
                return prometheus.query(f"{changes} > {before}")

            await wait_until(counted, "Prometheus saw the leader change", timeout=60, cluster=kubectl.cluster,
                             namespace=ns)  # fmt: skip
            old_index = int(leader.rsplit("-", 1)[1])

            async def new_leader() -> list[dict[str, object]]:
                return prometheus.query(f"kustos_etcdcluster_leader_member_index{nn} != {old_index}")

            await wait_until(new_leader, "another member leads", timeout=30)
        finally:
            kubectl.cluster.release_container(ns, leader, "etcd")
        picture = PICTURE if os.environ.get("KUSTOS_UPDATE_DOCS") == "1" else tmp_path / PICTURE.name
        render_dashboard(prometheus, start, time.time(), picture)
    assert picture.stat().st_size > 10_000
    status = await wait_healthy(kubectl, "m", 3)
    assert {victim, leader} <= {m["name"] for m in status["members"]}  # back, not replaced


MiB = 2**20


async def grown_past(client: EtcdClient, size: int) -> int:
    """The member's backend size once it is above ``size`` (the write just made is committed),
    or after about 5 s."""
    for _ in range(100):
        now: int = (await client.status()).db_size
        if now > size:
            break
        await asyncio.sleep(0.05)
    return now


async def test_backend_near_quota_fires_on_a_real_member_and_clears_after_compaction_and_defrag(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    """A member with a 16 MiB quota, filled just past 80% by overwriting one key: the alert fires
    from the size etcd reports; a compaction (the runbook's first step) frees the history and
    the operator's defragmentation gives the space back, and the alert clears."""
    quota = 16 * MiB
    defrag = {"enabled": True, "threshold": 0.5, "minDbSize": "1Mi", "checkInterval": "2s"}
    kubectl.apply(etcd_cluster("q", 1, extraArgs=[f"--quota-backend-bytes={quota}"],
                               maintenance={"defragmentation": defrag}))  # fmt: skip
    status = await wait_healthy(kubectl, "q", 1)
    ns = kubectl.namespace
    member = {"namespace": ns, "name": "q", "member": "q-0"}
    labels = f'{{member="q-0",name="q",namespace="{ns}"}}'
    with running_prometheus(f"127.0.0.1:{operator.metrics_port}", tmp_path / "prometheus") as prometheus:
        async with EtcdClient(status["members"][0]["clientUrl"], timeout=10.0) as client:
            value, revision = b"x" * (512 * 1024), 0
            # Stop just past the alert's 80%: NOSPACE (the operator recovers from it at once,
            # before the alert could fire) is a few writes further on. etcd reports the size of
            # its last backend commit, made every 100 ms, so each write is waited for until the
            # size counts it: fast writes once ran past the stop on sizes that lagged behind.
            size = (await client.status()).db_size
            for i in range(200):  # the history of one key: all of it is freed by a compaction
                if size > 0.81 * quota:
                    break
                try:
                    revision = await client.put("/big", value + str(i).encode())
                except NoSpace:
                    raise AssertionError(f"NOSPACE after {i} writes: the fill overshot the quota") from None
                size = await grown_past(client, size)
            else:
                raise AssertionError("the backend never grew past 81% of its quota")

            async def near() -> bool:
                return prometheus.state("KustosEtcdBackendNearQuota", **member) == "firing"

            await wait_until(near, "KustosEtcdBackendNearQuota firing", timeout=60, cluster=kubectl.cluster,
                             namespace=ns)  # fmt: skip
            assert prometheus.query(f"kustos_etcd_member_backend_quota_bytes{labels} == {quota}")
            await client.compact(revision, physical=True)

            async def cleared() -> bool:
                # etcd counts the space in use when it commits: a live cluster's writes go on.
                with contextlib.suppress(NoSpace):  # reached: the operator's recovery frees it
                    await client.put("/tick", "t")
                return prometheus.state("KustosEtcdBackendNearQuota", **member) is None

            await wait_until(cleared, "KustosEtcdBackendNearQuota cleared by the defragmentation", timeout=90,
                             cluster=kubectl.cluster, namespace=ns)  # fmt: skip
        used = prometheus.query(f"kustos_etcd_member_backend_bytes{labels} < {0.5 * quota}")
        assert used, "the defragmentation gave the space back"
    records = (kubectl.get("etcdcluster", "q")["status"].get("maintenance") or {}).get("defragmentations")
    assert records and records[0]["member"] == "q-0"


async def test_a_cleared_node_is_counted_by_its_maintenance_policy(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """A dead node fenced and cleared, then back: the policy's action counters move (Clear,
    then Uncordon), from what its controller recorded, without any status field for them."""
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy()))
    try:
        await _clear_and_count(kubectl, operator)
    finally:
        kubectl.cluster.kubectl("delete", "maintenancepolicy", "default", "--wait=false", check=False)


async def _clear_and_count(kubectl: Kubectl, operator: OperatorProcess) -> None:
    pods = json.loads(kubectl.cluster.kubectl("get", "pods", "-A", "-o", "json"))["items"]
    busy = {p["spec"].get("nodeName") for p in pods}
    nodes = json.loads(kubectl.cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    victim = next(
        n["metadata"]["name"] for n in nodes
        if "node-role.kubernetes.io/control-plane" not in n["metadata"].get("labels", {})
        and n["metadata"]["name"] not in busy
    )  # fmt: skip

    def count(action: str) -> float:
        key = f'kustos_maintenance_actions_total{{action="{action}",name="default",outcome="Done"}}'
        return operator.metrics().get(key, 0.0)

    cleared, uncordoned = count("Clear"), count("Uncordon")
    kubectl.cluster.take_node_down(victim)
    try:
        await unreachable(kubectl, victim)
        fence(kubectl, victim)

        async def recorded() -> bool:
            return last_action(kubectl).get("action") == "Clear"

        await wait_until(recorded, "the Clear recorded", timeout=120)

        async def counted() -> bool:
            return count("Clear") == cleared + 1

        await wait_until(counted, "the Clear counted", timeout=10)
    finally:
        await restored(kubectl, victim)

    async def back() -> bool:
        return count("Uncordon") == uncordoned + 1

    await wait_until(back, "the Uncordon counted", timeout=30)
    assert count("Clear") == cleared + 1  # one node, cleared once
