"""Real nodes (issue 20): node start, and pod start on a real node against the process runner.

    .venv/bin/python benchmarks/realnode_bench.py [--nodes 1] [--pods 5]

Node start: containerd started and the preloaded images imported, kubelet started, until
the Node is Ready. Pod start: a one-container etcd pod created (pinned to a node) until
its etcd answers on the pod IP; the same pod on a kwok node runs as a process of the
runner. Also the idle memory of one real node (kubelet, containerd, shims).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from pathlib import Path

from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig
from kustos.devcluster.nodeimages import etcd_image
from kustos.devcluster.realnode import RealNode, processes


def _serving(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.2):
            return True
    except OSError:
        return False


def pod_start(cluster: DevCluster, name: str, node: str) -> float:
    image = etcd_image(binaries.ETCD_VERSIONS[-1])
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "etcd", "image": image,
                 "command": ["etcd", "--data-dir=/tmp/data", "--listen-client-urls=http://0.0.0.0:2379",
                             "--advertise-client-urls=http://localhost:2379"],
                 "volumeMounts": [{"name": "data", "mountPath": "/tmp/data"}]}],
                 "volumes": [{"name": "data", "emptyDir": {}}]},
    }  # fmt: skip
    started = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(pod))
    ip = ""
    while not ip:
        ip = cluster.kubectl("get", "pod", name, "-o", "jsonpath={.status.podIP}", check=False).strip()
        time.sleep(0.02)
    while not _serving(ip, 2379):
        time.sleep(0.02)
    return time.monotonic() - started


def rss_mib(node: RealNode) -> dict[str, float]:
    sizes: dict[str, float] = {}
    for pid, argv in processes():
        if not argv or not any(str(node.directory) in a or str(node.containerd_socket) in a for a in argv):
            continue
        name = Path(argv[0]).name.split("-v")[0]
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes[name] = sizes.get(name, 0.0) + int(line.split()[1]) / 1024
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--pods", type=int, default=5)
    args = parser.parse_args()
    cluster = DevCluster(DevClusterConfig(name="bench-real", worker_nodes=3))
    cluster.stop()
    cluster.start()
    try:
        starts = []
        for index in range(1, args.nodes + 1):
            started = time.monotonic()
            cluster.start_real_node(index)
            starts.append(time.monotonic() - started)
        print(f"real node start until Ready ({args.nodes} nodes): "
              f"median {statistics.median(starts):.1f} s, max {max(starts):.1f} s")  # fmt: skip
        real = cluster.real_nodes()[0]
        for label, node in (("real node", real.name), ("process runner", "bench-real-worker-1")):
            seconds = [pod_start(cluster, f"{label.split()[0]}-{i}", node) for i in range(args.pods)]
            print(f"pod created until etcd answers on its IP, {label} ({args.pods} pods): "
                  f"median {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s")  # fmt: skip
        time.sleep(10)
        sizes = rss_mib(real)
        print("idle resident memory of a real node with 5 etcd pods: "
              + ", ".join(f"{k} {v:.0f} MiB" for k, v in sorted(sizes.items())))  # fmt: skip
    finally:
        started = time.monotonic()
        cluster.stop()
        print(f"teardown (kustos dev down) with a real node: {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
