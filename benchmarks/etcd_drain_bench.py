"""EtcdClusters through `kubectl drain` of every node that holds a member, one node after
another, with a writer that checks every acknowledged write (issue 21).

    .venv/bin/python -m benchmarks.etcd_drain_bench [--runs 1]

For each mode (members migrate, the default; and `disruption.migrate: false`, where the
budget lets one member be evicted and it is replaced afterwards) prints: how long each
drain took until `kubectl drain` returned (the member has left the node: moved, or evicted
and replaced), acknowledged writes lost, and the longest time between two acknowledged
writes (the write outage a client sees; one write in flight at a time, a 2 s timeout per
attempt, every member tried in turn).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

from benchmarks.etcd_bench import bench_cluster, create, healthy, start_operator, status, wait
from kustos.devcluster.cluster import DevCluster
from kustos.etcd.client import EtcdClient, EtcdError


@dataclass
class Writer:
    endpoints: list[str]
    acknowledged: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    stop: bool = False

    async def run(self) -> None:
        i = 0
        while not self.stop:
            key = f"/drain/{i:07d}"
            if not self.acknowledged and i == 0 and not self.endpoints:
                raise RuntimeError("no endpoint to write to")
            for endpoint in list(self.endpoints):
                try:
                    async with EtcdClient(endpoint, timeout=2.0) as client:
                        await client.put(key, str(i))
                except (EtcdError, OSError):
                    continue
                self.acknowledged.append(key)
                self.times.append(time.monotonic())
                i += 1
                break
            await asyncio.sleep(0.01)

    def longest_outage(self) -> float:
        return max((b - a for a, b in zip(self.times, self.times[1:], strict=False)), default=0.0)

    async def lost(self, endpoint: str) -> int:
        async with EtcdClient(endpoint, timeout=30.0) as client:
            found = await client.range("/drain/", prefix=True, keys_only=True)
        present = {kv.key.decode() for kv in found.kvs}
        return sum(1 for k in self.acknowledged if k not in present)


def member_nodes(cluster: DevCluster, name: str) -> list[str]:
    out = cluster.kubectl("get", "pods", "-l", f"kustos.dev/cluster={name},kustos.dev/member", "-o", "json")
    pods = json.loads(out)["items"]
    return sorted({p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")})


async def drain(cluster: DevCluster, node: str, name: str) -> float:
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "drain", node,
        "--ignore-daemonsets", "--delete-emptydir-data", f"--pod-selector=kustos.dev/cluster={name}",
        "--timeout=300s", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    if await process.wait() != 0:
        raise RuntimeError(f"kubectl drain {node} failed")
    return time.monotonic() - started


async def one_run(cluster: DevCluster, name: str, migrate: bool) -> str:
    # Pod IPs: this process (the writer) does not resolve through the cluster DNS.
    create(cluster, name, 3, addressing="podIP", disruption={"migrate": migrate})
    await asyncio.to_thread(wait, cluster, name, lambda st: healthy(st, 3), 180)
    writer = Writer([m["clientUrl"] for m in status(cluster, name)["members"]])
    task = asyncio.create_task(writer.run())

    async def follow() -> None:
        while not writer.stop:
            st = await asyncio.to_thread(status, cluster, name)
            writer.endpoints = [m["clientUrl"] for m in st.get("members") or [] if m.get("clientUrl")]
            await asyncio.sleep(0.5)

    follower = asyncio.create_task(follow())
    drains: list[float] = []
    nodes = member_nodes(cluster, name)
    try:
        for node in nodes:
            drains.append(await drain(cluster, node, name))
            await asyncio.to_thread(wait, cluster, name, lambda st: healthy(st, 3), 180)
    finally:
        for node in nodes:
            cluster.kubectl("uncordon", node, check=False)
        writer.stop = True
        await task
        await follower
    st = status(cluster, name)
    lost = await writer.lost(st["members"][0]["clientUrl"])
    cluster.kubectl("delete", "etcdcluster", name, "--wait=false")
    return (
        f"migrate={migrate}: drains {', '.join(f'{d:.1f}' for d in drains)} s; "
        f"{len(writer.acknowledged)} writes acknowledged, {lost} lost; "
        f"longest write outage {writer.longest_outage():.2f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    cluster = bench_cluster("bench-drain")
    operator = None
    try:
        operator = start_operator(cluster, 18082)
        for run in range(args.runs):
            for migrate in (True, False):
                print(asyncio.run(one_run(cluster, f"d{run}-{'m' if migrate else 'e'}", migrate)), flush=True)
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait()
        cluster.stop()


if __name__ == "__main__":
    main()
