"""Figures of the operator runtime: resident memory idle and per cached object, and
event-to-reconcile latency, measured on a real ``kustos run`` against the dev cluster.

    .venv/bin/python benchmarks/runtime_bench.py [--configmaps 10000] [--nodes 1000] [--latency-objects 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node

from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig
from kustos.devcluster.ports import free_port

REPO = Path(__file__).resolve().parents[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Operator:
    """A ``kustos run`` process. By default the runtime alone (``--controllers none``): kustos's
    own controllers would wait for CRDs a cluster without them lacks (idle_rss.py applies them)."""

    def __init__(
        self, cluster: DevCluster, extra: str | None, env: dict[str, str] | None = None,
        controllers: str = "none", leader_elect: bool = False, source: Path = REPO,
    ):  # fmt: skip
        self.port, webhook_port = free_port(), free_port()
        # An older checkout (idle_rss.py --source) has no ``python -m kustos``: its CLI ran the operator.
        entry = "kustos" if (source / "src" / "kustos" / "__main__.py").exists() else "kustos.cli"
        args = [
            sys.executable, "-m", entry, "run", "--kubeconfig", str(cluster.kubeconfig),
            "--metrics-address", f"127.0.0.1:{self.port}", "--webhook-address", f"127.0.0.1:{webhook_port}",
            "--webhook-url", f"https://127.0.0.1:{webhook_port}", "--log-level", "warning",
            "--controllers", controllers,
        ]  # fmt: skip
        if not leader_elect:
            args.append("--no-leader-elect")
        if extra:
            args += ["--extra-controllers", extra]
        # env replaces the environment when given whole (idle_rss.py chooses how bytecode is found).
        base = env if env is not None and "PATH" in env else {**os.environ, **(env or {})}
        self.process = subprocess.Popen(
            args, env={**base, "PYTHONPATH": f"{source / 'src'}:{source}"}, cwd=source,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("operator not ready")

    def settled_rss(self, seconds: float = 5) -> float:
        time.sleep(seconds)
        self.check_alive()
        return rss_mib(self.process.pid)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            command = " ".join(str(a) for a in self.process.args)
            raise RuntimeError(f"operator exited with {self.process.returncode}: {command}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)


async def create_objects(client: AsyncClient, namespace: str, configmaps: int, nodes: int) -> None:
    semaphore = asyncio.Semaphore(32)

    async def create(obj: object) -> None:
        async with semaphore:
            await client.create(obj)  # type: ignore[call-overload]

    data = {"key": "x" * 64}
    await asyncio.gather(*(
        create(ConfigMap(metadata=ObjectMeta(name=f"cm-{i}", namespace=namespace), data=data))
        for i in range(configmaps)
    ))  # fmt: skip
    # Plain Node objects: kwok does not manage them (no label), they are just cached.
    await asyncio.gather(*(create(Node(metadata=ObjectMeta(name=f"bench-node-{i}"))) for i in range(nodes)))


def memory(cluster: DevCluster, configmaps: int, nodes: int, env: dict[str, str] | None = None) -> None:
    idle = Operator(cluster, None, env)
    idle.wait_ready()
    idle_rss = idle.settled_rss()
    idle.stop()
    print(f"kustos run, idle, no controllers: {idle_rss:.1f} MiB resident")

    async def populate() -> None:
        client = AsyncClient(config=KubeConfig.from_file(cluster.kubeconfig))
        await client.create(Namespace(metadata=ObjectMeta(name="bench-cache")))
        started = time.monotonic()
        await create_objects(client, "bench-cache", configmaps, nodes)
        print(f"created {configmaps} ConfigMaps and {nodes} Nodes in {time.monotonic() - started:.0f}s")
        await client.close()

    asyncio.run(populate())
    empty = Operator(cluster, None, env)
    empty.wait_ready()
    baseline = empty.settled_rss()
    empty.stop()
    cached = Operator(cluster, "benchmarks.bench_controllers:register_cache", env)
    cached.wait_ready()
    loaded = cached.settled_rss(10)
    cached.stop()
    objects = configmaps + nodes + 50  # plus the cluster's own ConfigMaps and nodes
    per_object = (loaded - baseline) * 1024 / objects
    print(f"kustos run caching {configmaps} ConfigMaps + {nodes} Nodes: {loaded:.1f} MiB resident, "
          f"{per_object:.1f} KiB per cached object")  # fmt: skip


def latency(cluster: DevCluster, count: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "latencies"
        out.touch()
        operator = Operator(
            cluster, "benchmarks.bench_controllers:register_latency", {"KUSTOS_BENCH_OUT": str(out)}
        )
        operator.wait_ready()

        async def stamp_all() -> None:
            client = AsyncClient(config=KubeConfig.from_file(cluster.kubeconfig))
            await client.create(Namespace(metadata=ObjectMeta(name="bench-latency")))
            for i in range(count):
                meta = ObjectMeta(
                    name=f"lat-{i}", namespace="bench-latency",
                    annotations={"bench.kustos.dev/sent": f"{time.time():.6f}"},
                )  # fmt: skip
                await client.create(ConfigMap(metadata=meta, data={"i": str(i)}))
                await asyncio.sleep(0.005)  # a steady stream, not one burst
            await client.close()

        asyncio.run(stamp_all())
        time.sleep(3)
        operator.stop()
        samples = sorted(float(x) * 1000 for x in out.read_text().split())
    p50 = statistics.median(samples)
    p99 = samples[int(len(samples) * 0.99) - 1]
    print(f"event-to-reconcile latency over {len(samples)} creates: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
          f"max {samples[-1]:.1f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--configmaps", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--latency-objects", type=int, default=1000)
    args = parser.parse_args()
    binaries.build()
    cluster = DevCluster(DevClusterConfig(name="bench-runtime", worker_nodes=2))
    cluster.stop()
    cluster.start()
    try:
        latency(cluster, args.latency_objects)
        memory(cluster, args.configmaps, args.nodes)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
