"""Figures of the local control plane (F-DEV): build time, cache size, start time, memory.

    .venv/bin/python benchmarks/devcluster_bench.py [--starts 3] [--nodes 10] [--pods 5] [--cold-build]

Pod start is the time from creating a one-container etcd pod to its process answering on
the pod IP (network namespace, veth, mount namespace, process start).

``--cold-build`` rebuilds every binary into a scratch cache with an empty Go build
cache (Go's module cache is reused: downloads are not part of the figure), which
takes many minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cold_build() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        env = {**os.environ, "KUSTOS_CACHE": f"{scratch}/cache", "GOCACHE": f"{scratch}/gocache"}
        started = time.monotonic()
        subprocess.run(
            [sys.executable, "-c", "from kustos.devcluster.binaries import build; build()"],
            env=env,
            check=True,
        )
        print(f"cold build of all binaries: {time.monotonic() - started:.0f} s")


def start_times(runs: int) -> None:
    seconds = []
    for run in range(runs):
        cluster = DevCluster(DevClusterConfig(name=f"bench-start-{run}", worker_nodes=3))
        cluster.stop()
        started = time.monotonic()
        cluster.start()
        seconds.append(time.monotonic() - started)
        cluster.stop()
    print(
        f"dev cluster start (pod network, control plane, CoreDNS) until the API answers and 4 nodes "
        f"are Ready (cached binaries, {runs} runs): "
        f"median {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s"
    )


def _serving(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


def pod_starts(pods: int) -> None:
    cluster = DevCluster(DevClusterConfig(name="bench-pods", worker_nodes=3))
    cluster.stop()
    cluster.start()
    try:
        seconds = []
        for i in range(pods):
            name = f"solo-{i}"
            image = f"registry.k8s.io/etcd:{binaries.ETCD_VERSIONS[-1][1:]}-0"
            pod = {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                "spec": {"containers": [{"name": "etcd", "image": image,
                         "command": ["etcd", "--data-dir=/tmp/data", "--listen-client-urls=http://0.0.0.0:2379",
                                     "--advertise-client-urls=http://localhost:2379"],
                         "volumeMounts": [{"name": "data", "mountPath": "/tmp/data"}]}],
                         "volumes": [{"name": "data", "emptyDir": {}}]},
            }  # fmt: skip
            started = time.monotonic()
            cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))
            ip = ""
            while not ip:
                ip = cluster.kubectl(
                    "get", "pod", name, "-o", "jsonpath={.status.podIP}", check=False
                ).strip()
                time.sleep(0.02)
            while not _serving(ip, 2379):
                time.sleep(0.02)
            seconds.append(time.monotonic() - started)
        print(
            f"pod created until its etcd answers on the pod IP ({pods} pods): "
            f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s"
        )
    finally:
        cluster.stop()


def idle_memory(nodes: int, settle: float) -> None:
    cluster = DevCluster(DevClusterConfig(name="bench-memory", worker_nodes=nodes - 1))
    cluster.stop()
    cluster.start()
    try:
        time.sleep(settle)
        total = 0
        for component in cluster.status()["components"]:
            kib = rss_kib(component["pid"]) if component["running"] else 0
            total += kib
            print(f"  {component['name']:<26} {kib / 1024:7.1f} MiB")
        print(f"resident memory of the control plane with {nodes} idle nodes: {total / 1024:.0f} MiB")
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--settle", type=float, default=30.0, help="idle seconds before measuring memory")
    parser.add_argument("--pods", type=int, default=5)
    parser.add_argument("--cold-build", action="store_true")
    args = parser.parse_args()
    binaries.build()
    if args.cold_build:
        cold_build()
    size = directory_size(binaries.bin_dir())
    print(
        f"binary cache {binaries.bin_dir()}: {size / 2**20:.0f} MiB in {len(binaries.all_binaries())} files"
    )
    start_times(args.starts)
    pod_starts(args.pods)
    idle_memory(args.nodes, args.settle)


if __name__ == "__main__":
    main()
