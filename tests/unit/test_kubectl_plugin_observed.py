"""``kubectl kustos status NAME`` reads the figures only the operator observed (backend sizes,
quotas, alarms by member, leader changes) back from the leading replica's exposition, and says
once why they are missing when it cannot."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from kustos import kubectl_plugin
from kustos.api.etcd import EtcdCluster, EtcdClusterSpec, EtcdClusterStatus, MemberStatus
from kustos.kubectl_plugin import Scrape, cluster_rows, member_rows, observed, show_cluster
from kustos.metrics.collector import DomainCollector, Sources
from kustos.metrics.facts import etcd_cluster_facts
from kustos.runtime.clock import FixedClock
from kustos.runtime.observations import EtcdObservation, MemberBackend, Observations

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
MiB = 1024 * 1024


def _cluster(name: str = "a", namespace: str = "db") -> dict[str, Any]:
    members = [MemberStatus(name=f"{name}-{i}", healthy=True, leader=i == 0) for i in range(3)]
    status = EtcdClusterStatus(phase="Running", members=members, current_version="3.6.16")
    obj: dict[str, Any] = EtcdCluster(spec=EtcdClusterSpec(), status=status).model_dump(
        mode="json", exclude_none=True
    )
    obj["metadata"] = {"name": name, "namespace": namespace}
    return obj


def _exposition(*clusters: dict[str, Any], seen: Observations) -> str:
    """What the leading replica serves on /metrics for these clusters."""
    registry = CollectorRegistry()
    registry.register(
        DomainCollector(Sources(etcd_clusters=lambda: clusters, observations=seen), FixedClock(NOW))
    )
    return generate_latest(registry).decode()


def test_backend_sizes_quota_alarms_and_leader_changes_come_back_from_the_exposition() -> None:
    ours, other = _cluster("a"), _cluster("b")
    seen = Observations()
    backends = tuple(MemberBackend(f"a-{i}", (10 + i) * MiB, 4 * MiB, 2048 * MiB) for i in range(3))
    seen.publish_etcd("db", "a", EtcdObservation(backends, 7, 9, 3, (("a-2", "NOSPACE"),)))
    seen.publish_etcd("db", "b", EtcdObservation((MemberBackend("b-0", 1, 1, 1),), 1, 1, 99))

    got, footnote = observed(ours, Scrape(_exposition(ours, other, seen=seen)))

    assert footnote == ""
    facts = etcd_cluster_facts(ours, {}, NOW, got)
    rows = dict(cluster_rows(facts, NOW))
    assert rows["leader changes"] == "3"
    assert rows["alarms"] == "NOSPACE on a-2"
    members = {row[0]: row[4:] for row in member_rows(facts)}
    assert members == {
        "a-0": ["10.0 MiB", "4.0 MiB", "2.0 GiB"],
        "a-1": ["11.0 MiB", "4.0 MiB", "2.0 GiB"],
        "a-2": ["12.0 MiB", "4.0 MiB", "2.0 GiB"],
    }


@pytest.mark.parametrize(
    ("scrape", "why"),
    [
        (
            Scrape(None, "Lease kustos-system/kustos: no such Lease"),
            "not reachable (Lease kustos-system/kustos",
        ),
        (Scrape("# HELP x\n# TYPE x gauge\nx 1\n"), "has not observed this cluster yet"),
        (Scrape("not { an exposition"), "did not parse"),
    ],
)
def test_without_the_operators_figures_the_cells_stay_dashes_and_a_footnote_says_why(
    scrape: Scrape, why: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(kubectl_plugin, "console", Console(soft_wrap=True))
    cluster = _cluster()

    show_cluster(cluster, [], NOW, scrape)

    out = capsys.readouterr().out
    member_lines = [line for line in out.splitlines() if line.lstrip("│ ").startswith("a-")]
    assert len(member_lines) == 3 and all(line.count(" - ") >= 3 for line in member_lines), out
    footnotes = [line for line in out.splitlines() if why in line]
    assert len(footnotes) == 1 and "show as -" in footnotes[0], out
    assert "Traceback" not in out
