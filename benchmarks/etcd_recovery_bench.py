"""Backups and disaster recovery with real etcd members, a real S3 server and real claims.

    .venv/bin/python -m benchmarks.etcd_recovery_bench [--mib 100] [--large-mib 1024]

Prints: snapshot throughput (MB/s, as the EtcdBackup records it: from the attempt's start,
agent pod start, ``etcdctl snapshot save``, verify and store) to a PVC and to S3 for a
database of ``--mib`` (and ``--large-mib``, 0 to skip), and how long etcdctl's save alone
took (from the timestamps of its own log lines); the recovery
time objective from losing a majority (2 of 3 members killed, processes and pods) to all
members healthy again, from the survivor and, with every member killed, from the newest
backup. Recovery is automatic with no extra delay, so the figure includes the 5 s for which
quorum loss must last before it is confirmed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.etcd_bench import bench_cluster, create, healthy, start_operator, status, wait
from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.s3 import S3Server, S3ServerConfig
from kustos.etcd.client import EtcdClient

VALUE = 32 * 1024  # bytes per key: big values fill a database fast through the JSON gateway
BUCKET = "bench"


async def fill(endpoint: str, mib: int, prefix: str) -> None:
    """About ``mib`` MiB of keys, 16 writes in flight."""
    count = mib * 1024 * 1024 // VALUE
    value = "x" * VALUE
    async with EtcdClient(endpoint, timeout=60.0) as client:
        for start in range(0, count, 16):
            batch = range(start, min(count, start + 16))
            await asyncio.gather(*(client.put(f"{prefix}{i:07d}", value) for i in batch))


def backup(
    cluster: DevCluster, name: str, source: str, storage: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"clusterName": source, **({"storage": storage} if storage else {})}
    body = {
        "apiVersion": "kustos.dev/v1alpha1",
        "kind": "EtcdBackup",
        "metadata": {"name": name},
        "spec": spec,
    }
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        out = cluster.kubectl("get", "etcdbackup", name, "-o", "json", check=False)
        st = dict(json.loads(out).get("status") or {}) if out else {}
        if st.get("phase") in ("Succeeded", "Failed"):
            return st
        time.sleep(0.5)
    raise TimeoutError(f"backup {name}")


def throughput(st: dict[str, Any], save: float | None = None) -> str:
    seconds = float(str(st["duration"]).rstrip("s"))
    text = f"{st['size'] / 1e6:.0f} MB in {seconds:.1f} s = {st['size'] / 1e6 / seconds:.0f} MB/s"
    if save is not None:
        text += f" (etcdctl's save alone {save:.1f} s = {st['size'] / 1e6 / save:.0f} MB/s)"
    return text


def save_seconds(cluster: DevCluster, backup: str, attempt: int = 1) -> float | None:
    """From etcdctl's log in the agent pod: its temporary file created until the snapshot saved."""
    log = cluster.kubectl("logs", f"{backup}-snapshot-{attempt}", "-c", "etcdctl", check=False) or ""
    stamps: dict[str, datetime] = {}
    for line in log.splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            stamps[entry.get("msg", "")] = datetime.fromisoformat(entry["ts"])
    if "created temporary db file" not in stamps or "saved" not in stamps:
        return None
    return (stamps["saved"] - stamps["created temporary db file"]).total_seconds()


def measured(cluster: DevCluster, name: str, source: str, storage: dict[str, Any] | None = None) -> str:
    st = backup(cluster, name, source, storage)
    return throughput(st, save_seconds(cluster, name))


def kill(cluster: DevCluster, members: list[str]) -> None:
    for member in members:
        cluster.crash_container("default", member, "etcd", stay_down=True)
    cluster.kubectl("delete", "pod", *members, "--wait=false")


def rto(cluster: DevCluster, name: str, victims: list[str]) -> float:
    epoch = int(status(cluster, name).get("epoch") or 0)
    kill(cluster, victims)
    return wait(cluster, name, lambda st: healthy(st, 3) and int(st.get("epoch") or 0) > epoch, timeout=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--large-mib", type=int, default=1024)
    args = parser.parse_args()
    cluster = bench_cluster("bench-dr")
    binaries.build([b for b in binaries.missing_binaries() if b.name == "versitygw"])
    # Not 127.0.0.1: to an agent pod that is the pod itself.
    s3 = S3Server(S3ServerConfig(data_dir=Path(tempfile.mkdtemp()), buckets=(BUCKET,), host="127.0.0.2"))
    s3.start()
    operator = None
    try:
        operator = start_operator(cluster, 18081)
        keys = {"accessKeyId": s3.config.access_key, "secretAccessKey": s3.config.secret_key}
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"}, "stringData": keys}
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(secret))
        s3_storage = {"s3": {"endpoint": s3.endpoint, "bucket": BUCKET, "credentialsSecret": "s3"}}
        quota = ["--quota-backend-bytes=8589934592"]
        for size in [m for m in (args.mib, args.large_mib) if m]:
            name = f"snap-{size}"
            create(cluster, name, 3, extraArgs=quota)
            wait(cluster, name, lambda st: healthy(st, 3))
            asyncio.run(fill(status(cluster, name)["members"][0]["clientUrl"], size, "/fill/"))
            print(f"{size} MiB database, snapshot to a PVC: {measured(cluster, f'{name}-pvc', name)}")
            print(f"{size} MiB database, snapshot to S3: {measured(cluster, f'{name}-s3', name, s3_storage)}")
            cluster.kubectl("delete", "etcdcluster", name, "--wait=false")
        recovery = {"automatic": True, "delay": "0s"}
        create(cluster, "rto", 3, recovery=recovery, extraArgs=quota)
        wait(cluster, "rto", lambda st: healthy(st, 3))
        asyncio.run(fill(status(cluster, "rto")["members"][0]["clientUrl"], args.mib, "/rto/"))
        time.sleep(8)  # settled: etcd refuses reconfiguration for 5 s after a change
        members = [m["name"] for m in status(cluster, "rto")["members"]]
        took = rto(cluster, "rto", members[:2])
        print(f"recovery from the survivor, {args.mib} MiB: 2 of 3 killed until 3 healthy in {took:.1f} s")
        backup(cluster, "rto-backup", "rto")
        time.sleep(8)
        members = [m["name"] for m in status(cluster, "rto")["members"]]
        took = rto(cluster, "rto", members)
        print(
            f"recovery from the newest backup, {args.mib} MiB: 3 of 3 killed until 3 healthy in {took:.1f} s"
        )
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            operator.wait(60)
        s3.stop()
        cluster.stop()


if __name__ == "__main__":
    main()
