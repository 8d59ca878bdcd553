"""The domain metrics and the chart's alert rules against the dev cluster: a running operator's
/metrics says what its EtcdCluster's status says, and a real Prometheus scraping it with the
chart's rules sees "quorum at risk" fire while a member is down and clear once it is back.
The dashboard's picture in docs/metrics.md is drawn from this Prometheus's data
(KUSTOS_UPDATE_DOCS=1 writes it there; otherwise into the test's temporary directory)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.prometheus import render_dashboard, running_prometheus

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
        picture = PICTURE if os.environ.get("KUSTOS_UPDATE_DOCS") == "1" else tmp_path / PICTURE.name
        render_dashboard(prometheus, start, time.time(), picture)
    assert picture.stat().st_size > 10_000
    status = await wait_healthy(kubectl, "m", 3)
    assert victim in {m["name"] for m in status["members"]}  # it came back, it was not replaced
