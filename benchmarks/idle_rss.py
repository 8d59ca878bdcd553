"""Where an idle ``kustos run`` spends its resident memory, measured, not guessed.

    .venv/bin/python -m benchmarks.idle_rss [--objects] [--configmaps 10000] [--nodes 1000]
    .venv/bin/python -m benchmarks.idle_rss --breakdown-only

Three figures on a real ``kustos run`` against a dev cluster with kustos's CRDs applied:
idle RSS with every controller registered (the default ``--controllers all``, leader
election on, webhook server up, as ``kustos dev up`` starts it; the cluster has no object of
the families that load on their first one), idle RSS with
``--controllers none`` (the runtime alone), and, with ``--objects``, the cost of one
cached object (``runtime_bench``'s method: ConfigMaps and Nodes cached by a bench
controller).

Each figure is taken twice: with the operator compiling its sources at start (Python run
with ``PYTHONDONTWRITEBYTECODE``, as on this machine and in an image built without
compiled bytecode) and with bytecode cached (as in an image built with
``--compile-bytecode``; the cache lives in a scratch ``PYTHONPYCACHEPREFIX``, never in the
checkout). The breakdown then imports the operator's dependencies one group at a time in a
fresh interpreter and prints the RSS each group adds: the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.runtime_bench import REPO, Operator, memory
from kustos.devcluster import binaries
from kustos.devcluster.cluster import DevCluster, DevClusterConfig


def _families(loaded_at_start: bool) -> str:
    """The statement importing the controller families ``kustos run`` loads at start, or the
    others (each on the first object of its kind): kustos.controllers imports none itself."""
    return (
        "import importlib, kustos.controllers as c\n"
        "for f in c.CONTROLLERS.values():\n"
        f"    if (f.loads_on is None) == {loaded_at_start}:\n"
        "        importlib.import_module(f.module)"
    )


# What ``kustos run`` loads, in the order it needs it; each step adds to the one before.
BREAKDOWN: list[tuple[str, str]] = [
    ("Python interpreter", ""),
    ("asyncio + ssl (OpenSSL)", "import asyncio, ssl"),
    ("pydantic (+ pydantic-core)", "import pydantic"),
    ("httpx2 (API client transport)", "import httpx2"),
    ("kubeconfig and service account (kustos.runtime.kubeconfig)", "import kustos.runtime.kubeconfig"),
    ("prometheus_client, h11, yaml", "import prometheus_client, h11, yaml"),
    ("kustos.runtime (manager, informers, server)", "import kustos.runtime.manager"),
    # The package imports no kind: each family imports its own kinds' models (kustos.api.refs).
    (
        "the start families' models (EtcdCluster, EtcdBackup, MaintenancePolicy)",
        "import kustos.api.etcd, kustos.api.backup, kustos.api.maintenance",
    ),
    ("the families loaded at start (etcd's, Envoy restarts, image overrides)", _families(True)),
    # kustos run parses its options with argparse: typer's CLI is not on the operator's path.
    ("kustos run's entry (kustos.entry, kustos.run: argparse)", "import kustos.entry, kustos.run"),
    ("the first API request (kustos.runtime.transport: h11 over asyncio)", "import kustos.runtime.transport"),
    # Each of the others loads on the first object of its kind (kustos.controllers).
    (
        "every other family, once each has an object (storage, node jobs, maintenance, node images)",
        _families(False),
    ),
    (
        "a self-signed webhook certificate (cryptography)",
        "from kustos.runtime.webhook import ServingCertificate as S\nS.self_signed(['localhost'], [])",
    ),
    # Only with their --cloud-provider (nodes/cloud/__init__.py imports each when chosen);
    # each adds to all of the above, and to the providers before it.
    ("--cloud-provider aws (boto3)", "import kustos.nodes.cloud.aws"),
    # The gcp and azure modules import their SDK at the provider's first call: these rows
    # import what that call loads.
    (
        "--cloud-provider gcp (google-cloud-compute)",
        "import kustos.nodes.cloud.gcp, google.auth, google.cloud.compute_v1",
    ),
    (
        "--cloud-provider azure (azure-mgmt-compute, azure-identity)",
        "import kustos.nodes.cloud.azure, azure.identity, azure.mgmt.compute.models",
    ),
]

RSS_PROBE = """
import sys
{imports}
fields = dict(line.split(':', 1) for line in open('/proc/self/smaps_rollup') if ':' in line)
kib = lambda k: int(fields[k].split()[0])
print(kib('Rss'), kib('Anonymous'), len(sys.modules))
"""


def smaps(pid: int) -> tuple[float, float]:
    """(RSS, anonymous) in MiB; the rest of RSS is file-backed: the interpreter and shared libraries."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        key, _, value = line.partition(":")
        fields[key] = int(value.split()[0])
    return fields["Rss"] / 1024, fields["Anonymous"] / 1024


def bytecode_env(cached: bool, cache_dir: Path) -> dict[str, str]:
    """Environment for one of the two ways the operator may find its code (see the module doc)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    if cached:
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def warm_bytecode(env: dict[str, str], source: Path) -> None:
    """Compile the operator's code and every installed package into the scratch cache (~10 s)."""
    site_packages = Path(httpx.__file__).parents[1]
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(site_packages), str(source / "src")],
        env=env, stdout=subprocess.DEVNULL, check=True,
    )  # fmt: skip


def settled(operator: Operator, settle: float = 10, samples: int = 5) -> tuple[float, float]:
    """Median (RSS, anonymous) over a few seconds, once the operator has been idle for ``settle``."""
    time.sleep(settle)
    taken = []
    for _ in range(samples):
        operator.check_alive()
        taken.append(smaps(operator.process.pid))
        time.sleep(1)
    return statistics.median(t[0] for t in taken), statistics.median(t[1] for t in taken)


def idle(cluster: DevCluster, controllers: str, env: dict[str, str], source: Path) -> tuple[float, float]:
    operator = Operator(cluster, None, env, controllers=controllers, leader_elect=True, source=source)
    try:
        operator.wait_ready()
        return settled(operator)
    finally:
        operator.stop()


def apply_crds(cluster: DevCluster) -> None:
    from kustos.api.resources import RESOURCES
    from kustos.runtime.crd import render_crds

    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=render_crds(RESOURCES))
    for resource in RESOURCES:
        cluster.wait_established(resource.crd.name)


def breakdown(env: dict[str, str], source: Path) -> None:
    print("\nresident memory by component (fresh interpreter, cumulative imports):")
    print(f"  {'component':48s} {'adds MiB':>8s} {'RSS MiB':>8s} {'anon MiB':>8s} {'modules':>7s}")
    previous = 0.0
    imports: list[str] = []
    for label, statement in BREAKDOWN:
        if statement:
            imports.append(statement)
        # Median of three runs: a single interpreter's figure moves by a few hundred KiB.
        runs = []
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-c", RSS_PROBE.format(imports="\n".join(imports))],
                env={**env, "PYTHONPATH": f"{source / 'src'}:{source}"}, capture_output=True, text=True,
                check=True,
            )  # fmt: skip
            runs.append([int(x) for x in out.stdout.split()])
        rss, anon, modules = sorted(runs)[1]
        print(f"  {label:48s} {rss / 1024 - previous:8.1f} {rss / 1024:8.1f} {anon / 1024:8.1f} {modules:7d}")
        previous = rss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objects", action="store_true", help="Also measure the cost of a cached object.")
    parser.add_argument("--configmaps", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--breakdown-only", action="store_true", help="No dev cluster: the import table.")
    parser.add_argument(
        "--source", type=Path, default=REPO,
        help="Run the operator from this checkout (e.g. an older revision, to compare on one cluster).",
    )  # fmt: skip
    parser.add_argument("--keep-cluster", action="store_true", help="Reuse a running bench cluster; keep it.")
    args = parser.parse_args()
    source = args.source.resolve()
    with tempfile.TemporaryDirectory() as scratch:
        cached_env = bytecode_env(True, Path(scratch))
        warm_bytecode(cached_env, source)
        modes = [("compiled at start", bytecode_env(False, Path(scratch))), ("bytecode cached", cached_env)]
        if not args.breakdown_only:
            binaries.build()
            cluster = DevCluster(DevClusterConfig(name="bench-idle", worker_nodes=2))
            if not args.keep_cluster:
                cluster.stop()
            cluster.start()
            try:
                apply_crds(cluster)
                for mode, env in modes:
                    for controllers in ("all", "none"):
                        rss, anon = idle(cluster, controllers, env, source)
                        print(f"kustos run --controllers {controllers}, idle, {mode}: {rss:.1f} MiB resident "
                              f"({anon:.1f} MiB anonymous)")  # fmt: skip
                if args.objects:
                    memory(cluster, args.configmaps, args.nodes, cached_env)
            finally:
                if not args.keep_cluster:
                    cluster.stop()
        for mode, env in modes:
            print(f"\n[{mode}]", end="")
            breakdown(env, source)


if __name__ == "__main__":
    main()
