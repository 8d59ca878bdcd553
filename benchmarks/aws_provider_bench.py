"""AWS provider: API calls and time per observe pass, against moto's server on loopback.

What a NodeImage pass asks of AWS is ``groups()`` and then ``instances(g)`` for each group.
This prints how many AWS calls one such pass makes (cold, and warm within cache-seconds),
how long it takes against moto (a latency floor: moto answers from memory on loopback,
AWS over the network), and how many calls ten passes in a row make with and without the
read cache. Calls are counted with botocore's own ``before-call`` event.

    .venv/bin/python benchmarks/aws_provider_bench.py --groups 2 --size 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.aws_support import aws_environment, make_group, moto_server

from kustos.nodes.cloud.aws import AwsProvider


def counter(provider: AwsProvider) -> list[str]:
    calls: list[str] = []

    def record(model: Any, **_: Any) -> None:
        calls.append(model.name)

    for client in (provider._ec2, provider._autoscaling):
        client.meta.events.register("before-call", record)
    return calls


async def one_pass(provider: AwsProvider) -> None:
    for group in await provider.groups():
        await provider.instances(group.group_id)


async def measure(endpoint: str, cache: str, passes: int) -> tuple[int, int, list[float]]:
    provider = AwsProvider.from_options(
        {"region": "us-east-1", "endpoint-url": endpoint, "cache-seconds": cache}
    )
    calls = counter(provider)
    times = []
    for _ in range(passes):
        start = time.perf_counter()
        await one_pass(provider)
        times.append(time.perf_counter() - start)
    return len(calls), passes, times


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--size", type=int, default=50, help="instances per group")
    parser.add_argument("--passes", type=int, default=10)
    args = parser.parse_args()
    os.environ.update(aws_environment())
    with tempfile.TemporaryDirectory() as tmp, moto_server(Path(tmp)) as server:
        for g in range(args.groups):
            role = "ControlPlane" if g == 0 else "Worker"
            make_group(server, f"group-{g}", role, size=args.size, max_size=args.size + 10)
        cold = AwsProvider.from_options({"region": "us-east-1", "endpoint-url": server.endpoint})
        cold_calls = counter(cold)
        start = time.perf_counter()
        await one_pass(cold)
        cold_seconds = time.perf_counter() - start
        print(f"{args.groups} groups x {args.size} instances, moto on loopback")
        print(f"one cold pass: {len(cold_calls)} AWS calls ({', '.join(sorted(set(cold_calls)))}), "
              f"{cold_seconds * 1000:.0f} ms")  # fmt: skip
        for cache in ("0", "2"):
            calls, passes, times = await measure(server.endpoint, cache, args.passes)
            print(
                f"{passes} passes in a row, cache-seconds={cache}: {calls} AWS calls, "
                f"median pass {statistics.median(times) * 1000:.1f} ms, total {sum(times):.2f} s"
            )


if __name__ == "__main__":
    asyncio.run(main())
