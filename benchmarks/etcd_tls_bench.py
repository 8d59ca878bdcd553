"""What TLS (and etcd authentication) cost an EtcdCluster: creation time and write latency.

    .venv/bin/python -m benchmarks.etcd_tls_bench [--runs 3] [--writes 300] [--processes]

For each variant (plain, tls, tls+auth) and run: create a 3-member cluster and time it until
all members are healthy (the operator issues the CA and every certificate for tls), then time
``--writes`` sequential puts through one member's JSON gateway, once over one kept connection
(a client's steady state) and once with a new connection per put (a new TLS handshake each,
which is how the operator's short clients talk). Prints medians and 99th percentiles.

``--processes``: write latency only, against one bare etcd process per variant (no Kubernetes,
no operator; certificates from ``kustos.etcd.tls``), for a machine too loaded for the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import statistics
import subprocess
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.etcd_bench import ADDRESSING, bench_cluster, create, healthy, start_operator, status, wait
from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster
from kustos.etcd import tls
from kustos.etcd.client import EtcdClient, EtcdCredentials, EtcdError, EtcdTLS

VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "tls": {"tls": {}},
    "tls+auth": {"tls": {}, "auth": {"users": [], "roles": []}},
}


def client_tls(cluster: DevCluster, name: str, into: Path) -> EtcdTLS:
    secret = json.loads(cluster.kubectl("get", "secret", f"{name}-client-tls", "-o", "json"))
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (into / key).write_bytes(base64.b64decode(secret["data"][key]))
    return EtcdTLS(into / "ca.crt", into / "tls.crt", into / "tls.key")


def root(cluster: DevCluster, name: str) -> tuple[EtcdCredentials, ...]:
    out = cluster.kubectl("get", "secret", f"{name}-etcd-root", "-o", "json", check=False)
    if not out:
        return ()
    return (EtcdCredentials("root", base64.b64decode(json.loads(out)["data"]["password"]).decode()),)


async def put_latencies(
    url: str, tls: EtcdTLS | None, credentials: tuple[EtcdCredentials, ...], writes: int, reuse: bool
) -> list[float]:
    took = []
    async with EtcdClient(url, tls, 30.0, credentials) as kept:
        await kept.put("/bench/warm", "x")
        for i in range(writes):
            started = time.perf_counter()
            if reuse:
                await kept.put(f"/bench/{i:06d}", "v" * 64)
            else:
                async with EtcdClient(url, tls, 30.0, credentials) as fresh:
                    await fresh.put(f"/bench/{i:06d}", "v" * 64)
            took.append((time.perf_counter() - started) * 1000)
    return took


def bare_member(
    directory: Path, ip: str, tls_on: bool
) -> tuple[subprocess.Popen[bytes], str, EtcdTLS | None]:
    """One etcd process (the newest version the dev cluster builds), plain or with client TLS."""
    scheme = "https" if tls_on else "http"
    args = [str(binaries.binary_path("etcd")), "--data-dir", str(directory / "data"), "--name", "bench",
            "--listen-client-urls", f"{scheme}://{ip}:2379", "--advertise-client-urls", f"{scheme}://{ip}:2379",
            "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
            "--initial-cluster", f"bench=http://{ip}:2380"]  # fmt: skip
    client = None
    if tls_on:
        now = datetime.now(UTC)
        ca = tls.new_ca("bench CA", now)
        server = tls.issue(ca, "bench", now, timedelta(hours=1), ips=(ip,))
        user = tls.issue(ca, "", now, timedelta(hours=1), server=False)
        for name, data in (("ca.crt", ca.cert), ("server.crt", server.cert), ("server.key", server.key),
                           ("client.crt", user.cert), ("client.key", user.key)):  # fmt: skip
            (directory / name).write_bytes(data)
        args += ["--cert-file", str(directory / "server.crt"), "--key-file", str(directory / "server.key"),
                 "--trusted-ca-file", str(directory / "ca.crt"), "--client-cert-auth"]  # fmt: skip
        client = EtcdTLS(directory / "ca.crt", directory / "client.crt", directory / "client.key")
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, f"{scheme}://{ip}:2379", client


async def _ready(url: str, client: EtcdTLS | None) -> None:
    for _ in range(200):
        try:
            async with EtcdClient(url, client, 2.0) as probe:
                if (await probe.status()).is_leader:
                    return
        except EtcdError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def processes(runs: int, writes: int) -> None:
    kept: dict[str, list[float]] = {"plain": [], "tls": []}
    fresh: dict[str, list[float]] = {"plain": [], "tls": []}
    for run in range(runs):
        for n, variant in enumerate(kept):
            with tempfile.TemporaryDirectory() as directory:
                process, url, client = bare_member(
                    Path(directory), f"127.91.{run + 1}.{n + 1}", variant == "tls"
                )
                try:
                    asyncio.run(_ready(url, client))
                    kept[variant] += asyncio.run(put_latencies(url, client, (), writes, True))
                    fresh[variant] += asyncio.run(put_latencies(url, client, (), writes // 3, False))
                finally:
                    process.kill()
                    process.wait()
    for variant in kept:
        print(f"{variant} (bare etcd): put, one connection  {statistics.median(kept[variant]):.2f} ms, "
              f"p99 {p99(kept[variant]):.2f} ms; put with a new connection median "
              f"{statistics.median(fresh[variant]):.2f} ms, p99 {p99(fresh[variant]):.2f} ms")  # fmt: skip


def p99(values: list[float]) -> float:
    return sorted(values)[max(0, int(len(values) * 0.99) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--processes", action="store_true")
    args = parser.parse_args()
    if args.processes:
        processes(args.runs, args.writes)
        return
    ADDRESSING["value"] = "podIP"
    cluster = bench_cluster("bench-tls")
    operator = None
    creates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    kept: dict[str, list[float]] = {v: [] for v in VARIANTS}
    fresh: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        operator = start_operator(cluster)
        for run in range(args.runs):
            for variant, spec in VARIANTS.items():  # interleaved: the machine's load hits each alike
                name = f"{variant.replace('+', '-')}-{run}"
                create(cluster, name, **spec)
                creates[variant].append(wait(cluster, name, lambda st: healthy(st, 3), timeout=300))
                url = status(cluster, name)["members"][0]["clientUrl"]
                with tempfile.TemporaryDirectory() as files:
                    tls = client_tls(cluster, name, Path(files)) if "tls" in spec else None
                    credentials = root(cluster, name)
                    if "auth" in spec:  # authentication on: root's login is accepted
                        while not asyncio.run(_auth_on(url, tls, credentials)):
                            time.sleep(0.5)
                    kept[variant] += asyncio.run(put_latencies(url, tls, credentials, args.writes, True))
                    fresh[variant] += asyncio.run(
                        put_latencies(url, tls, credentials, args.writes // 3, False)
                    )
                print(f"{name}: created in {creates[variant][-1]:.1f} s", flush=True)
                cluster.kubectl("delete", "etcdcluster", name, "--wait=false")
                time.sleep(5)
        for variant in VARIANTS:
            print(f"{variant}: create median {statistics.median(creates[variant]):.1f} s "
                  f"({', '.join(f'{c:.1f}' for c in creates[variant])}); put over one connection "
                  f"median {statistics.median(kept[variant]):.2f} ms, p99 {p99(kept[variant]):.2f} ms; "
                  f"put with a new connection median {statistics.median(fresh[variant]):.2f} ms, "
                  f"p99 {p99(fresh[variant]):.2f} ms")  # fmt: skip
    finally:
        if operator is not None:
            operator.send_signal(signal.SIGTERM)
            operator.wait(60)
        cluster.stop()


async def _auth_on(url: str, tls: EtcdTLS | None, credentials: tuple[EtcdCredentials, ...]) -> bool:
    async with EtcdClient(url, tls, 5.0, credentials) as client:
        return (await client.auth_status()).enabled


if __name__ == "__main__":
    main()
