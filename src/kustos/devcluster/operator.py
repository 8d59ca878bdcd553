"""The operator in the dev cluster, installed as its users install it: ``helm install`` of
deploy/helm/kustos into ``kustos-system``.

The chart's Deployment runs for real. With real nodes (``kustos dev up``'s default) its
pods run the image built from deploy/Dockerfile (``kustosimage``) under containerd, held to
the real nodes by a nodeSelector (``dev_values``); without them the pod process runner
maps the image to this checkout's ``kustos`` (``podspec.match_image``). Either way the
operator reaches the API server through the ``kubernetes`` Service with the chart's
ServiceAccount and nothing more, and the API server calls its webhooks through the chart's
Service at the pods' IPs (``enable-aggregator-routing``).

The chart runs with the kwok cloud provider and a kwok node group (``KWOK_GROUP``), so the
node families (NodeImage rollouts, node maintenance's fencing) can be tried on the dev
cluster as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from kustos.devcluster import binaries
from kustos.devcluster.realnode import REAL_NODE_LABEL
from kustos.runtime.leader import holder_host

if TYPE_CHECKING:
    from kustos.devcluster.cluster import DevCluster

RELEASE = "kustos"
NAMESPACE = "kustos-system"
SELECTOR = "app.kubernetes.io/name=kustos"
# The kwok cloud provider's groups (kustos.nodes.cloud.kwok) and the one dev up starts.
KWOK_NAMESPACE = "kube-system"
KWOK_CONFIGMAP = "kustos-kwok-groups"
KWOK_GROUP = "workers"
KWOK_IMAGE = "kwok-os:v1"
# Pod ranges <range>.100.0/24 and up: above the cluster's own kwok nodes, below real ones (200+).
KWOK_FIRST_INDEX = 100


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
    values_file: Path | None = None,
) -> None:
    """``helm upgrade --install`` of the chart (``values``: ``key=value`` for ``--set``;
    ``values_file`` for ``--values``)."""
    sets = [arg for value in values for arg in ("--set", value)]
    if values_file is not None:
        sets = ["--values", str(values_file), *sets]
    # --force-conflicts: with webhook.url, an operator outside the cluster wrote its own URL
    # into the chart's webhook configurations (the integration tests' processes, one port each);
    # the chart's values win again.
    helm(cluster, "upgrade", "--install", release, str(chart or chart_dir()), "--namespace", namespace,
         "--create-namespace", "--force-conflicts", *sets)  # fmt: skip


def kwok_provider_options(cluster: DevCluster) -> dict[str, str]:
    """``--cloud-option``s of the kwok provider: its nodes get pod ranges of the cluster's network."""
    octets = str(cluster.network.cidr.network_address).split(".")
    return {"namespace": KWOK_NAMESPACE, "configmap": KWOK_CONFIGMAP,
            "pod-cidr-prefix": f"{octets[0]}.{octets[1]}", "first-index": str(KWOK_FIRST_INDEX)}  # fmt: skip


def dev_values(cluster: DevCluster, real_nodes: bool) -> dict[str, Any]:
    """The chart's values in the dev cluster: the kwok provider; with ``real_nodes`` the
    operator's pods only there, running the built image (the chart's own default)."""
    values: dict[str, Any] = {"cloudProvider": {"name": "kwok", "options": kwok_provider_options(cluster)}}
    if real_nodes:
        values["nodeSelector"] = {REAL_NODE_LABEL: "true"}
    return values


def write_dev_values(cluster: DevCluster, real_nodes: bool) -> Path:
    path = cluster.state_dir / "chart-values.yaml"
    path.write_text(yaml.safe_dump(dev_values(cluster, real_nodes), sort_keys=False))
    return path


def kwok_groups_manifest() -> dict[str, Any]:
    """The kwok provider's one group: workers of image ``KWOK_IMAGE``, Ready 2 s after creation."""
    group = {"id": KWOK_GROUP, "role": "Worker", "image": KWOK_IMAGE, "min": 0, "max": 10,
             "readyAfterSeconds": 2}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": KWOK_CONFIGMAP, "namespace": KWOK_NAMESPACE},
        "data": {"groups.yaml": yaml.safe_dump([group], sort_keys=False)},
    }


def start_kwok_group(cluster: DevCluster, nodes: int = 2) -> list[str]:
    """The kwok group with ``nodes`` nodes, created by the provider as a cloud would; a group
    that has them (a second ``dev up``, or after a rollout replaced them) gets none. Returns
    their names."""
    import asyncio

    from kustos.nodes.cloud.kwok import GROUP_LABEL, KwokProvider
    from kustos.runtime.api import Api
    from kustos.runtime.kube import connect, load_config
    from kustos.runtime.metrics import Metrics

    if not cluster.kubectl("get", "configmap", KWOK_CONFIGMAP, "-n", KWOK_NAMESPACE, "--ignore-not-found",
                           "-o", "name"):  # fmt: skip
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(kwok_groups_manifest()))

    async def create() -> list[str]:
        clients = connect(load_config(cluster.kubeconfig), Metrics())
        try:
            provider = KwokProvider.from_options(kwok_provider_options(cluster))
            provider.bind(Api(clients.raw))
            while len(await provider.instances(KWOK_GROUP)) < nodes:
                await provider.create_instance(KWOK_GROUP)
            return sorted(i.node_name or "" for i in await provider.instances(KWOK_GROUP))
        finally:
            await clients.close()

    names = asyncio.run(create())
    selector = f"{GROUP_LABEL}={KWOK_GROUP}"
    cluster.kubectl("wait", "node", "-l", selector, "--for=condition=Ready", "--timeout=60s")
    return names


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
