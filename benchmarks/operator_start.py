"""What an operator start costs the test suite: seconds from spawning ``kustos run`` to its
first ``/healthz`` answer, and the CPU seconds spent by then, with the sources compiled at
start (``PYTHONDONTWRITEBYTECODE``, as on this machine) and with bytecode cached (a scratch
``PYTHONPYCACHEPREFIX``, as tests/integration/conftest.py sets for its sessions).

    .venv/bin/python -m benchmarks.operator_start [--runs 5]

The operator is pointed at an API server that does not answer: ``/healthz`` is served
before it reaches one, so no control plane is needed, and what is measured is the start
alone (imports, the webhook certificate's child process, the servers). Runs alternate
between the two modes, so a change in the machine's load falls on both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.runtime_bench import REPO
from kustos.devcluster.ports import free_port

TIMEOUT = 120.0


def kubeconfig(path: Path) -> Path:
    """A kubeconfig whose API server refuses every connection."""
    server = {"server": "https://127.0.0.1:1"}
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": server}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
    }))  # fmt: skip
    return path


def start(config: Path, env: dict[str, str], log: Path) -> tuple[float, float]:
    """(seconds to the first /healthz answer, CPU seconds of the process and its children)."""
    metrics, webhook = free_port(), free_port()
    began = time.monotonic()
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kustos", "run", "--kubeconfig", str(config),
             "--metrics-address", f"127.0.0.1:{metrics}", "--webhook-address", f"127.0.0.1:{webhook}",
             "--webhook-url", f"https://127.0.0.1:{webhook}"],
            env=env, cwd=REPO, stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        while time.monotonic() - began < TIMEOUT:
            if process.poll() is not None:
                raise RuntimeError(f"kustos run exited with {process.returncode}: see {log}")
            try:
                httpx.get(f"http://127.0.0.1:{metrics}/healthz", timeout=1)
                return time.monotonic() - began, cpu_seconds(process)
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError(f"no /healthz within {TIMEOUT:.0f}s: see {log}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def cpu_seconds(process: subprocess.Popen[bytes]) -> float:
    """User and system time of a live process, its reaped children (the certificate tool)
    included; killed and reaped here."""
    process.kill()
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = -9
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    unset = ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    base["PYTHONPATH"] = str(REPO)
    with tempfile.TemporaryDirectory(prefix="kustos-start-") as scratch:
        root = Path(scratch)
        config, log = kubeconfig(root / "kubeconfig"), root / "operator.log"
        modes = {
            # An empty prefix: Python would read the checkout's __pycache__ otherwise (the
            # process runner's pods leave them), even with PYTHONDONTWRITEBYTECODE.
            "compiled at start": {
                **base,
                "PYTHONDONTWRITEBYTECODE": "1",
                "PYTHONPYCACHEPREFIX": str(root / "none"),
            },
            "bytecode cached": {**base, "PYTHONPYCACHEPREFIX": str(root / "pycache")},
        }
        start(config, modes["bytecode cached"], log)  # fills the cache
        figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
        for _ in range(args.runs):
            for mode, env in modes.items():
                figures[mode].append(start(config, env, log))
    load = os.getloadavg()[0]
    print(f"| `kustos run` ({args.runs} runs, load {load:.1f}) | spawn to /healthz, median | CPU, median |")
    print("|---|---|---|")
    for mode, runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"| {mode} | {wall:.2f} s | {cpu:.2f} s |")


if __name__ == "__main__":
    main()
