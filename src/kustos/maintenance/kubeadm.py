"""What a purge reads of a kubeadm control plane: endpoints, the etcd layout, its certificates.

Pure parsing of what kubeadm writes: the ``kubeadm-config`` ConfigMap in kube-system
(``ClusterConfiguration``: local or external etcd; ``ClusterStatus``: each control-plane
node's API endpoint, before Kubernetes 1.22) and the annotation kubeadm puts on each
kube-apiserver static pod (``kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint``,
which replaced ClusterStatus). kubeadm's stacked etcd listens on the node's advertise
address, clients on 2379 and peers on 2380, and names each member after its node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kustos.maintenance.nodes import is_control_plane

KUBEADM_CONFIG = "kubeadm-config"
KUBE_SYSTEM = "kube-system"
CLUSTER_STATUS_KEY = "ClusterStatus"
CLUSTER_CONFIGURATION_KEY = "ClusterConfiguration"
APISERVER_ENDPOINT_ANNOTATION = "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"
APISERVER_SELECTOR = "component=kube-apiserver,tier=control-plane"
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
# kubeadm's certificate layout under its certificates directory (EKCO uses the same files).
ETCD_CA = "etcd/ca.crt"
ETCD_CLIENT_CERT = "etcd/healthcheck-client.crt"
ETCD_CLIENT_KEY = "etcd/healthcheck-client.key"
SECRET_KEYS = ("ca.crt", "healthcheck-client.crt", "healthcheck-client.key")


def host_of(endpoint: str) -> str:
    """``10.0.0.1:6443`` -> ``10.0.0.1``; ``[fd00::1]:6443`` -> ``fd00::1``."""
    if endpoint.startswith("["):
        return endpoint[1:].split("]", 1)[0]
    return endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 else endpoint


def url_host(url: str) -> str:
    """The host of ``https://10.0.0.1:2380``."""
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    return host_of(rest)


def _url(host: str, port: int) -> str:
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def client_url(host: str) -> str:
    return _url(host, ETCD_CLIENT_PORT)


def peer_url(host: str) -> str:
    return _url(host, ETCD_PEER_PORT)


def cluster_status_endpoints(config_map: Mapping[str, Any] | None) -> dict[str, str] | None:
    """node -> advertise address from the legacy ClusterStatus (None when there is none)."""
    data = (config_map or {}).get("data") or {}
    text = data.get(CLUSTER_STATUS_KEY)
    if not text:
        return None
    document = yaml.safe_load(text) or {}
    endpoints = document.get("apiEndpoints") or {}
    return {
        str(node): str(value.get("advertiseAddress"))
        for node, value in endpoints.items()
        if isinstance(value, Mapping) and value.get("advertiseAddress")
    }


def without_node(config_map: Mapping[str, Any], node: str) -> str | None:
    """The ClusterStatus text with ``node``'s endpoint removed (None: nothing to remove)."""
    text = ((config_map.get("data") or {}).get(CLUSTER_STATUS_KEY)) or ""
    document = yaml.safe_load(text) or {}
    endpoints = document.get("apiEndpoints") or {}
    if node not in endpoints:
        return None
    del endpoints[node]
    document["apiEndpoints"] = endpoints
    return str(yaml.safe_dump(document, sort_keys=False))


def external_etcd(config_map: Mapping[str, Any] | None) -> bool:
    """Whether kubeadm's ClusterConfiguration names an external etcd (nothing stacked to purge)."""
    data = (config_map or {}).get("data") or {}
    document = yaml.safe_load(data.get(CLUSTER_CONFIGURATION_KEY) or "") or {}
    return bool((document.get("etcd") or {}).get("external"))


def pod_endpoints(pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """node -> advertise address, from the kube-apiserver pods' kubeadm annotation."""
    result: dict[str, str] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        endpoint = (meta.get("annotations") or {}).get(APISERVER_ENDPOINT_ANNOTATION)
        node = (pod.get("spec") or {}).get("nodeName")
        if endpoint and node:
            result[str(node)] = host_of(str(endpoint))
    return result


def node_internal_ip(node: Mapping[str, Any] | None) -> str | None:
    for address in ((node or {}).get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address"))
    return None


@dataclass(frozen=True)
class ControlPlaneAddresses:
    dead: str | None
    """The dead node's advertise address (where its etcd member listened)."""
    remaining: tuple[str, ...]
    """The other control-plane nodes' addresses (where to reach etcd)."""
    source: str


def addresses(
    node: str, config_map: Mapping[str, Any] | None, apiserver_pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
) -> ControlPlaneAddresses:  # fmt: skip
    """Where the dead node's member was and where the others are, kubeadm's sources first:
    ClusterStatus, the apiserver pods' annotation, then the Nodes' InternalIPs (as EKCO)."""
    legacy = cluster_status_endpoints(config_map) or {}
    annotated = pod_endpoints(apiserver_pods)
    by_node: dict[str, str] = {}
    for found in (_node_ips(nodes), annotated, legacy):  # later sources win
        by_node.update(found)
    dead = by_node.get(node)
    remaining = tuple(sorted({ip for name, ip in by_node.items() if name != node and ip != dead}))
    source = "ClusterStatus" if node in legacy else "apiserver pod" if node in annotated else "Node"
    return ControlPlaneAddresses(dead, remaining, source)


def _node_ips(nodes: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    result: dict[str, str] = {}
    for n in nodes:
        ip = node_internal_ip(n)
        if ip and is_control_plane(n):
            result[str((n.get("metadata") or {}).get("name"))] = ip
    return result


def certificate_files(directory: Path) -> tuple[Path, Path, Path]:
    """kubeadm's etcd CA and health-check client pair under its certificates directory."""
    return directory / ETCD_CA, directory / ETCD_CLIENT_CERT, directory / ETCD_CLIENT_KEY


__all__ = [
    "APISERVER_ENDPOINT_ANNOTATION",
    "APISERVER_SELECTOR",
    "ControlPlaneAddresses",
    "addresses",
    "certificate_files",
    "client_url",
    "cluster_status_endpoints",
    "external_etcd",
    "peer_url",
    "pod_endpoints",
    "url_host",
    "without_node",
]
