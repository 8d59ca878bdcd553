"""Operator failover (SPEC F-OPS-3): the chart's two replicas as pods, the leader killed.

    .venv/bin/python -m benchmarks.operator_failover_bench [--runs 3] [--lease-duration 15]

A dev cluster of its own (``bench-failover``), the chart installed as ``kustos dev up`` does
(two replicas, leader election with the chart's timings unless overridden) and one
three-member EtcdCluster. Each run SIGKILLs the leader's process (it stays down: the Lease
is not released, as when a node dies) and prints, from the kill:

- lease acquired: until the standby holds the Lease (polled every 0.1 s);
- controllers started: until the new leader logs ``controller etcdcluster started`` (its
  caches were warm; this is when it reconciles again), from its own log timestamps.

Then the killed pod's container is released (it restarts as the new standby) and the next
run kills the new leader. The figure is bounded by the Lease duration plus one retry period.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime

from benchmarks.etcd_bench import bench_cluster
from kustos.devcluster import operator as dev_operator
from kustos.devcluster.cluster import DevCluster

SAMPLE = {
    "apiVersion": "kustos.dev/v1alpha1",
    "kind": "EtcdCluster",
    "metadata": {"name": "failover", "namespace": "default"},
    "spec": {"size": 3},
}


def _started_at(cluster: DevCluster, pod: str, after: float) -> float | None:
    """Wall time of the first 'controller etcdcluster started' line the pod logged after ``after``."""
    log = cluster.kubectl("logs", "-n", dev_operator.NAMESPACE, pod, check=False)
    for line in log.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("msg") == "controller etcdcluster started":
            at = datetime.fromisoformat(entry["ts"]).timestamp()
            if at > after:
                return at
    return None


def one_failover(cluster: DevCluster) -> tuple[float, float]:
    leader = dev_operator.leader_pod(cluster)
    assert leader, "no leader"
    killed_at = time.time()
    cluster.crash_container(dev_operator.NAMESPACE, leader, "operator", stay_down=True)
    try:
        while (holder := dev_operator.leader_pod(cluster)) in (None, leader):
            if time.time() - killed_at > 120:
                raise RuntimeError("the standby did not take the Lease within 120 s")
            time.sleep(0.1)
        acquired = time.time() - killed_at
        assert holder is not None
        while (started := _started_at(cluster, holder, killed_at)) is None:
            if time.time() - killed_at > 180:
                raise RuntimeError(f"{holder} did not start its controllers within 180 s")
            time.sleep(0.5)
        return acquired, started - killed_at
    finally:
        cluster.release_container(dev_operator.NAMESPACE, leader, "operator")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lease-duration", type=int, default=15, help="seconds (chart default: 15)")
    parser.add_argument("--keep", action="store_true", help="leave the dev cluster running")
    args = parser.parse_args()
    renew = max(1, args.lease_duration * 2 // 3)
    cluster = bench_cluster("bench-failover")
    try:
        values = ["crds.install=false", f"leaderElection.leaseDuration={args.lease_duration}"]
        dev_operator.install(cluster, [*values, f"leaderElection.renewDeadline={renew}"])
        dev_operator.wait_ready(cluster, 2, timeout=180)
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(SAMPLE))
        print(f"lease duration {args.lease_duration}s, renew deadline {renew}s, retry period 2s")
        acquired, started = [], []
        for run in range(args.runs):
            dev_operator.wait_ready(cluster, 2, timeout=180)
            time.sleep(3)  # the restarted standby is polling the Lease again
            lease, controllers = one_failover(cluster)
            acquired.append(lease)
            started.append(controllers)
            what = f"lease acquired {lease:.1f}s after the kill, controllers started {controllers:.1f}s"
            print(f"run {run + 1}: {what}")
        print(f"median: lease acquired {statistics.median(acquired):.1f}s, "
              f"controllers started {statistics.median(started):.1f}s (max {max(started):.1f}s)")  # fmt: skip
    finally:
        if not args.keep:
            cluster.stop()


if __name__ == "__main__":
    main()
