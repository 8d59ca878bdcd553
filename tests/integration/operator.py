"""Run ``kustos run`` as a real process against the dev cluster, and read its metrics."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.network import operator_argv

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str) -> dict[str, float]:
    """``name{labels}`` -> value, for the lines of the Prometheus text format."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@dataclass
class OperatorProcess:
    process: subprocess.Popen[bytes]
    metrics_port: int
    webhook_port: int
    log_file: Path
    args: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(f"{self.base_url}/metrics", timeout=5).text)

    def metric(self, name: str, default: float = 0.0) -> float:
        return self.metrics().get(name, default)

    def readyz(self) -> tuple[int, str]:
        response = httpx.get(f"{self.base_url}/readyz", timeout=5)
        return response.status_code, response.text

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.alive():
            self.process.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, and SIGKILL if it has not exited within ``timeout`` (then fail loudly)."""
        self.kill(signal.SIGTERM)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            self.wait(10)
            tail = self.log()[-3000:]
            raise AssertionError(f"operator ignored SIGTERM for {timeout:.0f}s:\n{tail}") from None

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


def start_operator(
    cluster: DevCluster,
    log_dir: Path,
    *extra: str,
    controllers: str | None = "tests.example.controller:register",
    env: dict[str, str] | None = None,
    resolv_conf: Path | None = None,
) -> OperatorProcess:
    metrics_port, webhook_port = free_port(), free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"operator-{metrics_port}.log"
    args = [
        sys.executable, "-m", "kustos.cli", "run",
        "--kubeconfig", str(cluster.kubeconfig),
        "--metrics-address", f"127.0.0.1:{metrics_port}",
        "--webhook-address", f"127.0.0.1:{webhook_port}",
        "--webhook-url", f"https://127.0.0.1:{webhook_port}",
        # The runtime's tests run only the example controller; kustos's own need their CRDs.
        *(["--controllers", "none", "--extra-controllers", controllers] if controllers else []),
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    # In the host network (it reaches the API server there) but resolving through the
    # cluster DNS (members' DNS names), as it would in a pod.
    with log_file.open("ab") as sink:
        argv = operator_argv(resolv_conf or cluster.resolv_conf, args)
        process = subprocess.Popen(argv, stdout=sink, stderr=sink, env=env, cwd=REPO)
    operator = OperatorProcess(process, metrics_port, webhook_port, log_file, args)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not operator.alive():
            raise AssertionError(f"operator exited with {process.returncode}:\n{operator.log()[-3000:]}")
        try:
            httpx.get(f"{operator.base_url}/healthz", timeout=1)
            return operator
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError(f"operator did not serve /healthz within 30s:\n{operator.log()[-3000:]}")
