"""Operator CPU seconds per EtcdCluster operation, with what the operator did for them (issue 28).

    .venv/bin/python -m benchmarks.operator_cpu_bench [--runs 3] [--profile DIR] [--compare CHECKOUT]
        [--volumes SIZE]

Starts a dev cluster (4 workers, the test timings) and ``kustos run`` with every controller
registered and leader election on, as ``kustos dev up`` runs it. For each operation (create a
3-member cluster until all healthy, delete one member pod until 3 healthy again, resize 3 -> 5
until all healthy; on emptyDir, or with ``--volumes 64Mi`` on PVCs of that size, as
``peer_bench`` does) it prints the operator's CPU seconds (utime + stime of /proc/<pid>/stat, so
threads included) and, counted inside the operator: reconciles per controller, API requests by
verb and kind, status writes, and etcd requests by endpoint. Idle CPU per 10 s and idle RSS come
first (no cluster, over 60 s), then idle CPU per 30 s with one 3-member cluster running.

``--profile DIR`` writes a cProfile of each operation's main thread (``DIR/<operation>.prof``;
read with ``python -m pstats``). The operator runs under a small wrapper
(``benchmarks/operator_probe.py``) that patches its HTTP transport and etcd client to count, and
toggles the profiler on SIGUSR1 / SIGUSR2; nothing in kustos knows.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.etcd_bench import bench_cluster, healthy, rss_mib, status
from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.network import operator_argv
from kustos.devcluster.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


# ---- outside ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


class Operator:
    def __init__(
        self, cluster: DevCluster, out: Path, profile: bool, source: Path = REPO, log_level: str = "warning"
    ) -> None:
        """``source``: the checkout to run (its own .venv), this one by default; ``log_level``:
        info shows each step the operator takes, with its time (``operator.log``)."""
        self.out = out
        self.port = free_port()
        python = sys.executable if source == REPO else str(source / ".venv" / "bin" / "python")
        # An older checkout (--compare) has no operator_probe: its wrapper lived in this module.
        probe = ["-m", "benchmarks.operator_probe"]
        if not (source / "benchmarks" / "operator_probe.py").exists():
            probe = ["-m", "benchmarks.operator_cpu_bench", "--child", "--"]
        args = [
            python, *probe,
            "run", "--kubeconfig", str(cluster.kubeconfig),
            "--metrics-address", f"127.0.0.1:{self.port}", "--webhook-address", "127.0.0.1:0",
            "--log-level", log_level,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(source), "KUSTOS_CPU_BENCH_OUT": str(out)}
        if profile:
            env["KUSTOS_CPU_BENCH_PROFILE"] = "1"
        self.log = (out / "operator.log").open("ab")
        self.process = subprocess.Popen(
            operator_argv(cluster.resolv_conf, args), env=env, cwd=source, stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError("the operator did not become ready")
        # The leader: elected within a retry period of becoming ready.
        time.sleep(5)

    @property
    def pid(self) -> int:
        """The Python process: unshare and sh exec it, keeping the pid."""
        return self.process.pid

    def reconciles(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for line in httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text.splitlines():
            if line.startswith("controller_runtime_reconcile_total{"):
                labels, _, value = line.rpartition(" ")
                controller = labels.split('controller="')[1].split('"')[0]
                values[controller] = values.get(controller, 0) + float(value)
        return values

    def measure(self, name: str, action: Any) -> tuple[float, float, dict[str, int], dict[str, float]]:
        """(CPU seconds, wall seconds, counts, reconciles per controller) of ``action()``."""
        (self.out / "current").write_text(name)
        before_reconciles = self.reconciles()
        os.kill(self.pid, signal.SIGUSR1)
        time.sleep(0.1)
        cpu, started = cpu_seconds(self.pid), time.monotonic()
        action()
        wall, cpu = time.monotonic() - started, cpu_seconds(self.pid) - cpu
        os.kill(self.pid, signal.SIGUSR2)
        result = self.out / f"{name}.json"
        while not result.exists():
            time.sleep(0.05)
        time.sleep(0.1)
        counts = json.loads(result.read_text())
        print(f"  {name}: {cpu:.3f} CPU s in {wall:.1f} s", flush=True)  # kept if a later step fails
        after = self.reconciles()
        reconciles = {
            c: after[c] - before_reconciles.get(c, 0) for c in after if after[c] > before_reconciles.get(c, 0)
        }
        return cpu, wall, counts, reconciles

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.log.close()


def create(cluster: DevCluster, name: str, size: int, volume: str | None = None) -> None:
    body: dict[str, Any] = {
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster", "metadata": {"name": name},
        "spec": {"size": size, "memberFailureTimeout": "5s"},
    }  # fmt: skip
    if volume is not None:
        body["spec"]["storage"] = {"type": "pvc", "size": volume}
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps(body))


def until(cluster: DevCluster, name: str, check: Any, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check(status(cluster, name)):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not converge in {timeout}s")


def show(name: str, figures: list[tuple[float, float, dict[str, int], dict[str, float]]]) -> None:
    cpus = [f[0] for f in figures]
    walls = [f[1] for f in figures]
    runs = ", ".join(f"{c:.2f}" for c in cpus)
    print(f"\n{name}: CPU median {statistics.median(cpus):.3f} s (runs {runs}), "
          f"wall median {statistics.median(walls):.1f} s")  # fmt: skip
    _, _, counts, reconciles = figures[len(figures) // 2]
    print("  reconciles: " + ", ".join(f"{c} {int(n)}" for c, n in sorted(reconciles.items())))
    status_writes = sum(n for k, n in counts.items() if k.startswith("api PUT") and k.endswith("/status"))
    status_writes += sum(n for k, n in counts.items() if k.startswith("api PATCH") and k.endswith("/status"))
    print(f"  status writes: {status_writes}")
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d}  {key}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, help="write cProfiles to this directory")
    parser.add_argument(
        "--compare", type=Path, default=None,
        help="another checkout (with its .venv) run in turn on the same cluster, run by run, "
        "alternating which goes first: an A/B at equal load",
    )  # fmt: skip
    parser.add_argument("--volumes", metavar="SIZE", default=None, help="members on PVCs of this size")
    args = parser.parse_args()
    out = args.profile or Path(os.environ.get("TMPDIR", "/tmp")) / f"operator-cpu-{os.getpid()}"
    print(f"load average at start: {os.getloadavg()}")
    trees = [REPO] + ([args.compare.resolve()] if args.compare else [])
    label = {tree: "this" if tree == REPO else f"compare ({tree})" for tree in trees}
    results: dict[Path, dict[str, list[Figures]]] = {tree: {} for tree in trees}
    cluster = bench_cluster("bench-cpu")
    try:
        for run in range(args.runs):
            for tree in trees if run % 2 == 0 else trees[::-1]:
                print(f"run {run}, {label[tree]}", flush=True)
                tree_out = out / str(trees.index(tree))
                tree_out.mkdir(parents=True, exist_ok=True)
                operator = Operator(cluster, tree_out, profile=args.profile is not None, source=tree)
                try:
                    one_run(cluster, operator, run, results[tree], idle=run < 2, volume=args.volumes)
                finally:
                    operator.stop()
        for tree in trees:
            print(f"\n==== {label[tree]}")
            figures = results[tree]
            idle = figures["idle"]
            print(f"idle (no cluster): {statistics.median(f[0] for f in idle) / 6:.3f} CPU s per 10 s "
                  f"(runs {', '.join(f'{f[0] / 6:.3f}' for f in idle)}), "
                  f"RSS {statistics.median(f[0] for f in figures['rss']):.1f} MiB")  # fmt: skip
            show("create 3 members until all healthy", figures["create"])
            show("idle with one 3-member cluster, per 30 s", figures["steady"])
            show("delete 1 member pod until 3 healthy", figures["replace"])
            show("resize 3 -> 5 until all healthy", figures["resize"])
        print(f"\nload average at end: {os.getloadavg()}")
    finally:
        cluster.stop()


Figures = tuple[float, float, dict[str, int], dict[str, float]]


def one_run(
    cluster: DevCluster,
    operator: Operator,
    run: int,
    figures: dict[str, list[Figures]],
    idle: bool,
    volume: str | None = None,
) -> None:
    """Idle (60 s, no cluster: the kernel counts CPU time in 10 ms ticks), then create, steady,
    replace and resize one cluster, which is deleted (and gone) before the operator stops."""
    if idle:
        figures.setdefault("idle", []).append(operator.measure(f"idle-{run}", lambda: time.sleep(60)))
        figures.setdefault("rss", []).append((rss_mib(operator.pid), 0.0, {}, {}))
    name = f"cpu-{run}"

    def create_one() -> None:
        create(cluster, name, 3, volume)
        until(cluster, name, lambda s: healthy(s, 3))

    figures.setdefault("create", []).append(operator.measure(f"create-{run}", create_one))
    time.sleep(8)  # etcd refuses membership changes for 5 s after one
    figures.setdefault("steady", []).append(operator.measure(f"steady-{run}", lambda: time.sleep(30)))
    victim = f"{name}-1"

    def uid() -> str:
        return cluster.kubectl("get", "pod", victim, "-o", "jsonpath={.metadata.uid}", check=False)

    def replaced(s: dict[str, Any], before: str) -> bool:
        """Healthy with the victim replaced: by a new member (emptyDir), or by a new pod of the
        same member on its volume."""
        if not healthy(s, 3):
            return False
        if volume is None:
            return victim not in {m["name"] for m in s.get("members", [])}
        return uid() not in ("", before)

    def replace() -> None:
        before = uid()
        cluster.kubectl("delete", "pod", victim, "--wait=false")
        until(cluster, name, lambda s: replaced(s, before))

    figures.setdefault("replace", []).append(operator.measure(f"replace-{run}", replace))
    time.sleep(8)

    def resize() -> None:
        cluster.kubectl("patch", "etcdcluster", name, "--type=merge", "-p", '{"spec":{"size":5}}')
        until(cluster, name, lambda s: healthy(s, 5))

    figures.setdefault("resize", []).append(operator.measure(f"resize-{run}", resize))
    cluster.kubectl("delete", "etcdcluster", name, "--timeout=120s")


if __name__ == "__main__":
    main()
