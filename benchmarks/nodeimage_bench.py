"""Figures of the NodeImage rollout (issue 15).

    .venv/bin/python benchmarks/nodeimage_bench.py [--planning 1000] [--nodes 100] [--surge 10]
        [--control-plane 3] [--ready-after 1]

``--planning N`` times one planning pass (plan + status, pure) over N nodes mid-rollout;
``--nodes 0`` skips the cluster part. The cluster part starts a dev cluster of its own,
creates ``--control-plane`` + ``--nodes`` kwok nodes through the kwok cloud provider, runs
``kustos run --cloud-provider kwok`` and changes the NodeImage: it prints the time until
every node is replaced, the operator's CPU seconds and its peak resident memory.

Constellation's node operator, for comparison, documents about 10 minutes per node with a
surge of 1 for the whole cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OLD, NEW = "kwok-os:v1", "kwok-os:v2"
LOG = Path(tempfile.gettempdir()) / "nodeimage-bench-operator.log"


def planning(count: int, repeat: int = 5) -> None:
    from kustos.api.nodeimage import NodeImageSpec
    from kustos.nodes.nodeimage import planner
    from kustos.nodes.nodeimage.planner import GroupView, NodeView, Observed, PendingView
    from kustos.runtime.cloud import Role

    spec = NodeImageSpec.model_validate(
        {"image": NEW, "workers": {"maxSurge": 10}, "etcd": {"enabled": False}}
    )
    nodes = []
    for i in range(count):
        group = "cp" if i < 3 else "w"
        image = NEW if i % 3 == 0 else OLD
        nodes.append(NodeView(f"n{i}", f"kwok://n{i}", group, image, labels={"team": str(i % 7)}))
    # Ten replacements in flight: heirs paired with donors.
    for k in range(10):
        heir = nodes[3 + 3 * k]
        nodes[3 + 3 * k] = replace(heir, donor=f"n{4 + 3 * k}", labels={"team": str((4 + 3 * k) % 7)})
    groups = (
        GroupView("cp", Role.CONTROL_PLANE, NEW, tuple(n.provider_id for n in nodes if n.group == "cp")),
        GroupView("w", Role.WORKER, NEW, tuple(n.provider_id for n in nodes if n.group == "w")),
    )
    pending = (PendingView("p1", "w", "Join", provider_id="kwok://none"),)
    observed = Observed("os", spec, tuple(nodes), groups, pending, now=datetime.now(UTC))
    timings = []
    for _ in range(repeat):
        started = time.perf_counter()
        step = planner.plan(observed)
        planner.status(observed, step, observed.now)
        timings.append(time.perf_counter() - started)
    best, median = min(timings) * 1000, sorted(timings)[len(timings) // 2] * 1000
    print(f"planning pass over {count} nodes: best {best:.1f} ms, median {median:.1f} ms "
          f"(step {type(step).__name__})")  # fmt: skip


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def rollout(workers: int, control_plane: int, surge: int, ready_after: float) -> None:
    from kustos.api.resources import RESOURCES
    from kustos.devcluster import binaries
    from kustos.devcluster.cluster import DevCluster, DevClusterConfig
    from kustos.devcluster.kwokconfig import Timings
    from kustos.nodes.cloud.kwok import GROUP_LABEL, IMAGE_ANNOTATION, KwokProvider
    from kustos.runtime import objects
    from kustos.runtime.api import Api
    from kustos.runtime.crd import render_crds
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics
    from kustos.runtime.resources import CONFIGMAPS

    binaries.build()
    cluster = DevCluster(DevClusterConfig(name="nodeimage-bench", worker_nodes=1, timings=Timings.fast()))
    cluster.start(timeout=300)
    operator: subprocess.Popen[bytes] | None = None
    try:
        cluster.kubectl("apply", "--server-side", "-f", "-", input_text=render_crds(RESOURCES))
        for resource in RESOURCES:
            cluster.wait_established(resource.crd.name)
        groups = [
            {"id": "cp", "role": "ControlPlane", "image": OLD, "max": 50, "readyAfterSeconds": ready_after},
            {"id": "w", "role": "Worker", "image": OLD, "max": 400, "readyAfterSeconds": ready_after},
        ]
        options = {"namespace": "kube-system", "configmap": "kwok-groups", "ip-prefix": "127.78"}

        async def populate() -> None:
            clients = connect(load_config(cluster.kubeconfig), Metrics())
            api = Api(clients.raw)
            await api.create(CONFIGMAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "kwok-groups", "namespace": "kube-system"},
                                          "data": {"groups.yaml": yaml.safe_dump(groups)}})  # fmt: skip
            provider = KwokProvider(api, configmap="kwok-groups", ip_prefix="127.78")
            for group, count in (("cp", control_plane), ("w", workers)):
                for _ in range(count):
                    await provider.create_instance(group)
            await clients.close()

        asyncio.run(populate())
        total = control_plane + workers
        selector = f"{GROUP_LABEL} in (cp,w)"

        def nodes() -> list[dict[str, object]]:
            return list(json.loads(cluster.kubectl("get", "nodes", "-l", selector, "-o", "json"))["items"])

        while not (len(ns := nodes()) == total and all(objects.node_ready(n) for n in ns)):  # type: ignore[arg-type]
            time.sleep(1)
        args = [sys.executable, "-m", "kustos", "run", "--kubeconfig", str(cluster.kubeconfig),
                "--no-leader-elect", "--metrics-address", "127.0.0.1:0", "--webhook-address", "127.0.0.1:0",
                "--controllers", "nodeimage,scalinggroup,pendingnode", "--cloud-provider", "kwok",
                *[a for k, v in options.items() for a in ("--cloud-option", f"{k}={v}")]]  # fmt: skip
        log = LOG.open("wb")
        operator = subprocess.Popen(args, stdout=log, stderr=log, cwd=REPO,
                                    env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
        time.sleep(5)
        image = {"apiVersion": "kustos.dev/v1alpha1", "kind": "NodeImage", "metadata": {"name": "os"},
                 "spec": {"image": NEW, "workers": {"maxSurge": surge}, "joinTimeout": "5m",
                          "etcd": {"enabled": False}}}  # fmt: skip
        cpu_before = cpu_seconds(operator.pid)
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(image))
        peak = 0.0
        while True:
            peak = max(peak, rss_mib(operator.pid))
            ns = nodes()
            done = len(ns) == total and all(
                objects.annotations(n).get(IMAGE_ANNOTATION) == NEW and objects.node_ready(n)  # type: ignore[arg-type]
                for n in ns
            )
            if done:
                break
            if operator.poll() is not None:
                raise RuntimeError(f"the operator exited; see {LOG}")
            time.sleep(1)
        elapsed = time.monotonic() - started
        cpu = cpu_seconds(operator.pid) - cpu_before
        print(f"{total} kwok nodes ({control_plane} control plane, {workers} workers) replaced, "
              f"worker maxSurge {surge}: {elapsed:.0f} s ({elapsed / total:.1f} s per node); "
              f"operator CPU {cpu:.1f} s, peak RSS {peak:.1f} MiB")  # fmt: skip
        print(
            "Constellation (documented): about 10 min per node, surge 1 -> about "
            f"{total * 10 / 60:.0f} h for {total} nodes"
        )
    finally:
        if operator is not None and operator.poll() is None:
            operator.send_signal(signal.SIGTERM)
            operator.wait(30)
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--planning", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--control-plane", type=int, default=3)
    parser.add_argument("--surge", type=int, default=10)
    parser.add_argument("--ready-after", type=float, default=1.0)
    args = parser.parse_args()
    if args.planning:
        planning(args.planning)
    if args.nodes:
        rollout(args.nodes, args.control_plane, args.surge, args.ready_after)


if __name__ == "__main__":
    main()
