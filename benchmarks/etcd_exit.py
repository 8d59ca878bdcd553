"""How long an etcd member takes from SIGTERM to exit: the floor under one pod's replacement.

    .venv/bin/python -m benchmarks.etcd_exit [--runs 3] [--version 3.6.16]

Three etcd members on loopback ports (no dev cluster), asked for their status by kustos's etcd
client (whose connections stay pooled, as in the operator); a follower gets SIGTERM and the
time until its process exits is printed. A pod's replacement cannot start before its
predecessor's etcd has exited: the pod keeps its name and its volume (issue 28's "one pod"
step, docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from kustos.devcluster import binaries
from kustos.etcd.client import EtcdClient, EtcdError

MEMBERS = 3
BASE_PORT = 23000  # member i: client 23000 + 10 i, peer 23001 + 10 i


def _urls(i: int) -> tuple[str, str]:
    port = BASE_PORT + 10 * i
    return f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"


def _start(etcd: Path, i: int, data: Path) -> subprocess.Popen[bytes]:
    client, peer = _urls(i)
    cluster = ",".join(f"m{j}={_urls(j)[1]}" for j in range(MEMBERS))
    argv = [str(etcd), f"--name=m{i}", f"--data-dir={data / f'm{i}'}", f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}", f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}", f"--initial-cluster={cluster}",
            "--log-level=error"]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def one_exit(etcd: Path) -> float:
    """Seconds from SIGTERM to a follower's exit, in a fresh three-member cluster."""
    with tempfile.TemporaryDirectory(prefix="etcd-exit-") as tmp:
        processes = [_start(etcd, i, Path(tmp)) for i in range(MEMBERS)]
        clients = [EtcdClient(_urls(i)[0], timeout=2.0) for i in range(MEMBERS)]
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    statuses = [await c.status() for c in clients]
                    if all(s.leader_id for s in statuses):
                        break
                except EtcdError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("the three members did not elect a leader in 30 s")
                await asyncio.sleep(0.1)
            victim = next(i for i, s in enumerate(statuses) if s.member_id != s.leader_id)
            began = time.monotonic()
            processes[victim].terminate()
            await asyncio.to_thread(processes[victim].wait)
            return time.monotonic() - began
        finally:
            for process in processes:
                process.kill()
                process.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--version", default="3.6.16")
    args = parser.parse_args()
    binaries.build()
    etcd = binaries.binary_path("etcd", f"v{args.version}")
    seconds = [await one_exit(etcd) for _ in range(args.runs)]
    runs = ", ".join(f"{s:.2f}" for s in seconds)
    print(f"etcd {args.version}, a follower, SIGTERM to exit: {statistics.median(seconds):.2f} s ({runs})")


if __name__ == "__main__":
    asyncio.run(main())
