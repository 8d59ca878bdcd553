"""The domain metrics' cost per scrape: time to collect and render /metrics from caches of N
EtcdClusters (three members each, a backup schedule) with K succeeded EtcdBackups each, and what
the controllers observed of each (three members' backends, leader changes), and the exposition's
size. A scrape reads only these caches and that memory, so this is all it costs.

    .venv/bin/python benchmarks/metrics_scrape_bench.py --clusters 100 --backups 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest

from kustos.api.backup import BackupSchedule, EtcdBackup, EtcdBackupSpec, EtcdBackupStatus
from kustos.api.etcd import EtcdCluster, EtcdClusterSpec, EtcdClusterStatus, MemberStatus
from kustos.metrics.collector import DomainCollector, Sources
from kustos.runtime.clock import FixedClock
from kustos.runtime.observations import EtcdObservation, MemberBackend, Observations
from kustos.runtime.times import rfc3339

NOW = datetime(2026, 11, 25, tzinfo=UTC)


def _objects(
    clusters: int, backups: int, seen: Observations
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    found, taken = [], []
    for c in range(clusters):
        name = f"c{c}"
        backends = tuple(MemberBackend(f"{name}-{i}", 40 << 20, 30 << 20, 2 << 30) for i in range(3))
        seen.publish_etcd(f"ns{c % 10}", name, EtcdObservation(backends, 1, 7, 3))
        members = [MemberStatus(name=f"{name}-{i}", healthy=True, leader=i == 0) for i in range(3)]
        status = EtcdClusterStatus(phase="Running", members=members, current_version="3.6.16")
        cluster = EtcdCluster(spec=EtcdClusterSpec(backup=BackupSchedule(interval="1h")), status=status)
        found.append({**cluster.model_dump(mode="json", exclude_none=True),
                      "metadata": {"name": name, "namespace": f"ns{c % 10}"}})  # fmt: skip
        for b in range(backups):
            done = rfc3339(NOW - timedelta(hours=b))
            succeeded = EtcdBackupStatus(phase="Succeeded", completion_time=done, size=1 << 20)
            backup = EtcdBackup(spec=EtcdBackupSpec(cluster_name=name), status=succeeded)
            taken.append({**backup.model_dump(mode="json", exclude_none=True),
                          "metadata": {"name": f"{name}-{b}", "namespace": f"ns{c % 10}"}})  # fmt: skip
    return found, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clusters", type=int, default=100)
    parser.add_argument("--backups", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    seen = Observations()
    clusters, backups = _objects(args.clusters, args.backups, seen)
    registry = CollectorRegistry()
    sources = Sources(lambda: clusters, lambda: backups, observations=seen)
    registry.register(DomainCollector(sources, FixedClock(NOW)))
    times, size = [], 0
    for _ in range(args.repeat):
        started = time.perf_counter()
        size = len(generate_latest(registry))
        times.append(time.perf_counter() - started)
    print(f"{args.clusters} EtcdClusters x 3 members, {len(backups)} EtcdBackups: "
          f"scrape median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms, "
          f"{size / 1024:.0f} KiB of exposition")  # fmt: skip


if __name__ == "__main__":
    main()
