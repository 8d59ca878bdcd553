"""The operator in the dev cluster, installed as its users install it: ``helm install`` of
deploy/helm/kustos into ``kustos-system``.

The chart's Deployment runs for real: its pods use the operator's image, which the pod
process runner maps to this checkout's ``kustos`` (``podspec.match_image``), inside the
pods' network namespaces with their resolv.conf and projected ServiceAccount token. So
the operator reaches the API server through the ``kubernetes`` Service's endpoint (the
gateway) with the chart's ServiceAccount and nothing more, and the API server calls its
webhooks through the chart's Service at the pods' IPs (``enable-aggregator-routing``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kustos.devcluster import binaries
from kustos.runtime.leader import holder_host

if TYPE_CHECKING:
    from kustos.devcluster.cluster import DevCluster

RELEASE = "kustos"
NAMESPACE = "kustos-system"
SELECTOR = "app.kubernetes.io/name=kustos"


class InstallError(RuntimeError):
    """helm failed, or the operator's pods did not become ready."""


def chart_dir() -> Path:
    """deploy/helm/kustos of the checkout this kustos runs from."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "deploy" / "helm" / "kustos"
        if (candidate / "Chart.yaml").is_file():
            return candidate
    raise InstallError(
        "the kustos chart (deploy/helm/kustos) was not found above "
        f"{Path(__file__).resolve().parent}: `kustos dev up` runs from a checkout"
    )


def helm(cluster: DevCluster, *args: str, check: bool = True) -> str:
    """The cached helm against the dev cluster, with its own home (no user config read)."""
    if not binaries.binary_path("helm").exists():
        binaries.build([b for b in binaries.missing_binaries() if b.name == "helm"])
    home = cluster.state_dir / "helm-home"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / "cache"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    result = subprocess.run(
        [str(binaries.binary_path("helm")), *args], capture_output=True, text=True, env=env, check=False
    )
    if check and result.returncode != 0:
        raise InstallError(f"helm {' '.join(args[:3])} failed:\n{result.stdout}{result.stderr}".rstrip())
    return result.stdout


def install(
    cluster: DevCluster,
    values: Sequence[str] = (),
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    chart: Path | None = None,
) -> None:
    """``helm upgrade --install`` of the chart (``values``: ``key=value`` for ``--set``)."""
    sets = [arg for value in values for arg in ("--set", value)]
    # --force-conflicts: with webhook.url, an operator outside the cluster wrote its own URL
    # into the chart's webhook configurations (the integration tests' processes, one port each);
    # the chart's values win again.
    helm(cluster, "upgrade", "--install", release, str(chart or chart_dir()), "--namespace", namespace,
         "--create-namespace", "--force-conflicts", *sets)  # fmt: skip


def uninstall(cluster: DevCluster, release: str = RELEASE, namespace: str = NAMESPACE) -> None:
    helm(cluster, "uninstall", release, "--namespace", namespace, "--ignore-not-found")


def operator_pods(cluster: DevCluster, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    found = cluster.kubectl("get", "pods", "-n", namespace, "-l", SELECTOR, "-o", "json", check=False)
    return list(json.loads(found or "{}").get("items", []))


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def wait_ready(
    cluster: DevCluster,
    replicas: int,
    namespace: str = NAMESPACE,
    timeout: float = 120,
    log: Callable[[str], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Until ``replicas`` operator pods are Ready (caches synced, webhook server serving)."""
    deadline = time.monotonic() + timeout
    reported = -1
    while True:
        ready = [p for p in operator_pods(cluster, namespace) if _ready(p)]
        if len(ready) >= replicas:
            return ready
        if len(ready) != reported:
            log(f"operator pods ready: {len(ready)}/{replicas}")
            reported = len(ready)
        if time.monotonic() > deadline:
            raise InstallError(
                f"{len(ready)}/{replicas} operator pods ready in {namespace} after {timeout:.0f}s; "
                f"see `kustos dev logs`{_name_flag(cluster)} and {cluster.agent_log}"
            )
        time.sleep(0.5)


def wait_gone(cluster: DevCluster, namespace: str = NAMESPACE, timeout: float = 120) -> None:
    """Until no operator pod is left (after scaling to zero), so nothing still writes."""
    deadline = time.monotonic() + timeout
    while operator_pods(cluster, namespace):
        if time.monotonic() > deadline:
            names = [p["metadata"]["name"] for p in operator_pods(cluster, namespace)]
            raise InstallError(f"operator pods {names} still in {namespace} after {timeout:.0f}s")
        time.sleep(0.5)


def leader_pod(cluster: DevCluster, lease: str = RELEASE, namespace: str = NAMESPACE) -> str | None:
    """The pod holding the leader election Lease: its holderIdentity is ``<hostname>_<id>``
    and a pod's hostname is its name."""
    found = cluster.kubectl("get", "lease", lease, "-n", namespace, "-o", "json", check=False)
    holder = json.loads(found).get("spec", {}).get("holderIdentity") if found else None
    return holder_pod(str(holder)) if holder else None


def holder_pod(holder: str) -> str:
    """``<hostname>_<random id>`` (runtime.manager's identity) -> the hostname, a pod's name."""
    return holder_host(holder)


def logs(cluster: DevCluster, namespace: str = NAMESPACE, tail: int = 200) -> str:
    """Every operator pod's log, each line prefixed with its pod."""
    return cluster.kubectl(
        "logs", "-n", namespace, "-l", SELECTOR, "--prefix", "--tail", str(tail), "--max-log-requests", "10",
        check=False,
    )  # fmt: skip


def _name_flag(cluster: DevCluster) -> str:
    from kustos.devcluster.cluster import DEFAULT_NAME

    return "" if cluster.config.name == DEFAULT_NAME else f" --name {cluster.config.name}"
