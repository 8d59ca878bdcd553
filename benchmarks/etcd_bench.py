"""Figures of the EtcdCluster controller with real etcd members on the dev cluster.

    .venv/bin/python benchmarks/etcd_bench.py [--runs 3] [--clusters 10 50] [--upgrade-sizes 3 5]
        [--addressing dns|podIP]

``--clusters`` and ``--upgrade-sizes`` with no value skip those parts; ``--addressing``
(default ``dns``, the EtcdCluster default) is how members are addressed.

Prints: time from creating a 3-member cluster to all members healthy; time from a
member's pod deletion to full healthy size again; rolling upgrade and rollback time
per size and storage type; operator resident memory with 0
and N three-member clusters (N real etcd processes times three: 50 clusters are 150
etcd processes, about 6 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from kustos.api.resources import RESOURCES
from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig
from kustos.devcluster.kwokconfig import Timings
from kustos.devcluster.network import operator_argv
from kustos.runtime.crd import render_crds

REPO = Path(__file__).resolve().parents[1]
ADDRESSING = {"value": "dns"}  # set from --addressing


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def status(cluster: DevCluster, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "etcdcluster", name, "-o", "json", check=False)
    return dict(json.loads(out).get("status") or {}) if out else {}


def healthy(st: dict[str, Any], size: int) -> bool:
    members = st.get("members") or []
    return st.get("ready") == f"{size}/{size}" and st.get("phase") == "Running" and len(members) == size


def create(cluster: DevCluster, name: str, size: int = 3, **spec: Any) -> None:
    body = {"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster", "metadata": {"name": name},
            "spec": {"size": size, "addressing": ADDRESSING["value"], "memberFailureTimeout": "5s",
                     **spec}}  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))


def wait(cluster: DevCluster, name: str, check: Any, timeout: float = 180) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check(status(cluster, name)):
            return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not converge in {timeout}s")


def timed_roll(
    cluster: DevCluster, name: str, size: int, version: str, timeout: float = 300
) -> tuple[float, float]:
    """Change spec.version and wait until every member runs it: (seconds, seconds idle).

    Idle is the time during which the status showed every member healthy and yet the roll
    unfinished: the operator's own share (its passes, its status writes), plus any wait
    etcd imposes (5 s after a membership change) - the rest is etcd stopping, starting
    and catching up.
    """
    cluster.kubectl("patch", "etcdcluster", name, "--type=merge", "-p",
                    json.dumps({"spec": {"version": version}}))  # fmt: skip
    started = last = time.monotonic()
    idle = 0.0
    while time.monotonic() - started < timeout:
        st = status(cluster, name)
        now = time.monotonic()
        if healthy(st, size) and st.get("currentVersion") == version:
            return now - started, idle
        members = st.get("members") or []
        if len(members) == size and all(m.get("healthy") for m in members):
            idle += now - last
        last = now
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not reach etcd {version} in {timeout}s")


def start_operator(cluster: DevCluster, port: int = 18080) -> subprocess.Popen[bytes]:
    """``kustos run`` with every controller against ``cluster``, once it reports ready; it
    resolves members' DNS names through the cluster DNS."""
    operator = subprocess.Popen(
        operator_argv(cluster.resolv_conf, [
            sys.executable, "-m", "kustos", "run", "--kubeconfig", str(cluster.kubeconfig),
            "--no-leader-elect", "--metrics-address", f"127.0.0.1:{port}",
            "--webhook-address", "127.0.0.1:0",
            "--log-level", "warning"]),
        env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return operator
        except httpx.HTTPError:
            pass
        time.sleep(0.2)


def bench_cluster(name: str, kind: type[DevCluster] = DevCluster) -> DevCluster:
    """A fresh dev cluster with 4 workers and the test timings, CRDs installed (``kind``: a
    subclass, such as the tests' ``ReadingCluster``)."""
    binaries.build()
    cluster = kind(DevClusterConfig(name=name, worker_nodes=4, timings=Timings.fast(),
                                    restart_backoff=(0.5, 4.0)))  # fmt: skip
    cluster.stop()
    cluster.start()
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=render_crds(RESOURCES))
    for resource in RESOURCES:
        cluster.wait_established(resource.crd.name)
    return cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clusters", type=int, nargs="*", default=[10])
    parser.add_argument("--upgrade-sizes", type=int, nargs="*", default=[3, 5])
    parser.add_argument("--addressing", choices=("dns", "podIP"), default="dns")
    args = parser.parse_args()
    ADDRESSING["value"] = args.addressing
    print(f"addressing: {args.addressing}")
    cluster = bench_cluster("bench-etcd")
    operator = None
    try:
        operator = start_operator(cluster)
        time.sleep(3)
        print(f"operator resident memory with 0 clusters: {rss_mib(operator.pid):.1f} MiB")

        creates, replacements = [], []
        for run in range(args.runs):
            name = f"speed-{run}"
            create(cluster, name)
            creates.append(wait(cluster, name, lambda st: healthy(st, 3)))
            # etcd refuses membership changes until its leader has been connected to the
            # new members for 5 s: measure recovery of a settled cluster, not of a new one.
            time.sleep(8)
            victim = f"{name}-1"
            cluster.kubectl("delete", "pod", victim, "--wait=false")
            replacements.append(wait(
                cluster, name,
                lambda st, v=victim: healthy(st, 3) and v not in {m["name"] for m in st.get("members", [])},
            ))  # fmt: skip
            cluster.kubectl("delete", "etcdcluster", name, "--wait=false")
        print(f"create 3 members until all healthy: median {statistics.median(creates):.1f} s, "
              f"runs {', '.join(f'{c:.1f}' for c in creates)}")  # fmt: skip
        print(f"pod deleted until back to 3 healthy members: median {statistics.median(replacements):.1f} s, "
              f"runs {', '.join(f'{r:.1f}' for r in replacements)}")  # fmt: skip
        # The newest minor step the dev cluster builds (3.6 -> 3.7 and back).
        old, new = (v.lstrip("v") for v in binaries.ETCD_VERSIONS[-2:])
        for size in args.upgrade_sizes:
            for storage in ("emptyDir", "pvc"):
                name = f"up-{size}-{storage.lower()}"
                create(cluster, name, size, version=old, storage={"type": storage})
                wait(cluster, name, lambda st, n=size: healthy(st, n))
                time.sleep(8)  # a settled cluster: etcd refuses reconfiguration for 5 s after one
                # Up, then back down: a rollback through etcd's downgrade protocol, in place.
                for what, start, to in (("rolling upgrade", old, new), ("rollback", new, old)):
                    took, idle = timed_roll(cluster, name, size, to)
                    print(f"{what} {start} -> {to}, {size} members, {storage}: {took:.1f} s "
                          f"({took / size:.1f} s per member; all healthy yet unfinished "
                          f"{idle / size:.1f} s per member)")  # fmt: skip
                    time.sleep(8)
                cluster.kubectl("delete", "etcdcluster", name, "--wait=false")
        time.sleep(10)  # let the deleted clusters' pods go
        made = 0
        for target in sorted(args.clusters):
            for i in range(made, target):
                create(cluster, f"load-{i}")
            for i in range(made, target):
                wait(cluster, f"load-{i}", lambda st: healthy(st, 3), timeout=600)
            made = target
            time.sleep(10)
            rss = rss_mib(operator.pid)
            print(f"operator resident memory with {target} three-member clusters: {rss:.1f} MiB")
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            operator.wait(60)
        cluster.stop()


if __name__ == "__main__":
    main()
