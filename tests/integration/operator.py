"""Run ``kustos run`` as a real process against the dev cluster, and read its metrics."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.network import operator_argv
from kustos.devcluster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
# What an operator's log says when the API server refused it: the refusal's reason is "Forbidden"
# and its message "... is forbidden". A bare "403" matched a log line's milliseconds (",403").
REFUSED = re.compile(r"forbidden", re.IGNORECASE)
# How long a started operator has to answer /healthz. At a load of 15 (four sessions and a crash
# chain) one answered none of 30 s of one-second probes; a Deployment's probes wait longer.
HEALTHZ_TIMEOUT = 60.0


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
    kubeconfig: Path | None = None,
) -> OperatorProcess:
    """``kustos run`` as a process: as the cluster's administrator unless ``kubeconfig`` names
    another identity (``chart_identity``: the chart's ServiceAccount)."""
    metrics_port, webhook_port = free_port(), free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_file = log_dir / f"operator-{metrics_port}.log"
    args = [
        sys.executable, "-m", "kustos", "run",
        "--kubeconfig", str(kubeconfig or cluster.kubeconfig),
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
    deadline = time.monotonic() + HEALTHZ_TIMEOUT
    while time.monotonic() < deadline:
        if not operator.alive():
            raise AssertionError(f"operator exited with {process.returncode}:\n{operator.log()[-3000:]}")
        try:
            httpx.get(f"{operator.base_url}/healthz", timeout=5)
            return operator
        except httpx.HTTPError:
            time.sleep(0.1)
    # Killed: left running, a slow starter would lead later and hold the chart's Lease, and
    # every operator after it would wait to lead while this one acts on a test now gone.
    operator.kill()
    operator.wait(10)
    raise AssertionError(
        f"operator did not serve /healthz within {HEALTHZ_TIMEOUT:.0f}s:\n{operator.log()[-3000:]}"
    )


# The session's chart install (``chart_identity``): replicas 0, the operators are the tests'
# processes, with the token of its ServiceAccount and nothing else.
CHART_RELEASE = "kustos"
CHART_NAMESPACE = "kustos-system"
# webhook.url: the tests' operators serve webhooks on the host, each test at its own port; the
# operator rewrites the URL in the chart's configurations (patch, by name) when it starts.
# Rook's namespace of the session's release: the chart grants exec in pods there (the Ceph
# toolbox of a purge, test_purge_rook.py); it must exist before the chart is installed.
ROOK_NAMESPACE = "kustos-rook"
SESSION_VALUES = (
    "replicas=0", "crds.install=false", "webhook.url=https://127.0.0.1:9443",
    "rook.enabled=true", f"rook.namespace={ROOK_NAMESPACE}",
)  # fmt: skip
# What the chart's Deployment tells the operator (its storage roles, storage-roles.yaml).
CHART_ENV = {
    "KUSTOS_STORAGE_NODE_ROLE": f"{CHART_RELEASE}-storage-node",
    "KUSTOS_STORAGE_CSI_HELPER_ROLE": f"{CHART_RELEASE}-storage-csi-helper",
}
_identities: dict[Path, Path] = {}


def chart_identity(cluster: DevCluster) -> Path:
    """A kubeconfig that is the chart's ServiceAccount (system:serviceaccount:kustos-system:
    kustos): the chart installed once per session (helm), a token from the TokenRequest API."""
    if cluster.state_dir in _identities:
        return _identities[cluster.state_dir]
    from kustos.devcluster import operator as dev_operator

    if not cluster.kubectl("get", "namespace", ROOK_NAMESPACE, "-o", "name", check=False).strip():
        cluster.kubectl("create", "namespace", ROOK_NAMESPACE)
    dev_operator.install(cluster, SESSION_VALUES, CHART_RELEASE, CHART_NAMESPACE)
    path = cluster.state_dir / "chart-identity.kubeconfig"
    _identities[cluster.state_dir] = service_account_kubeconfig(cluster, CHART_NAMESPACE, CHART_RELEASE, path)
    return path


def start_chart_operator(
    cluster: DevCluster,
    log_dir: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    resolv_conf: Path | None = None,
) -> OperatorProcess:
    """``kustos run`` with every controller as the chart installs it: the chart's ServiceAccount
    and nothing more, its leader election Lease and webhook configurations (in kustos-system),
    fast lease timings (a renewal may take up to 5 s: under load, a 3 s deadline made operators
    stand down mid-test). What it is refused shows in the audit log check at the session's end."""
    return start_operator(
        cluster, log_dir,
        "--lease-name", CHART_RELEASE, "--lease-namespace", CHART_NAMESPACE,
        "--lease-duration", "6", "--renew-deadline", "5", "--retry-period", "0.5",
        "--webhook-configuration-name", CHART_RELEASE, *extra,
        controllers=None, env={**CHART_ENV, **(env or {})}, resolv_conf=resolv_conf,
        kubeconfig=chart_identity(cluster),
    )  # fmt: skip


@contextmanager
def chart_maintenance_operator(cluster: DevCluster, log_dir: Path) -> Iterator[OperatorProcess]:
    """The maintenance controller alone, as the chart runs it; the cluster's MaintenancePolicy
    (one per cluster, ``default``) goes with it."""
    process = start_chart_operator(cluster, log_dir, "--controllers", "maintenance")
    try:
        yield process
    finally:
        process.stop()
        cluster.kubectl("delete", "maintenancepolicy", "default", "--ignore-not-found", check=False)


def reset_chart_identity(cluster: DevCluster) -> None:
    """Uninstall the session's release; the next ``chart_identity`` installs it afresh (a new
    ServiceAccount, a new token). For tests that install the chart otherwise: switching a
    release between webhook.url and the Service in place fails, since the operators' own
    writes of the other field stay in the webhook configurations."""
    from kustos.devcluster import operator as dev_operator

    dev_operator.uninstall(cluster, CHART_RELEASE, CHART_NAMESPACE)
    _identities.pop(cluster.state_dir, None)


def service_account_kubeconfig(cluster: DevCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that is ``account``: a token from the TokenRequest API, checked with whoami."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration", "3h").strip()
    view = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json"))
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": view["clusters"][0]["cluster"]}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}],
    }  # fmt: skip
    path.write_text(json.dumps(config))
    whoami = subprocess.run(
        [str(cluster.kubectl_path), "--kubeconfig", str(path), "auth", "whoami",
         "-o", "jsonpath={.status.userInfo.username}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert whoami.stdout.strip() == f"system:serviceaccount:{namespace}:{account}", whoami.stdout
    return path
