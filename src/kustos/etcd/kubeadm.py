"""kubeadm's control plane and its stacked etcd: the one home of what kustos knows of them.

Node maintenance (purging a dead control-plane node) and node image rollouts (removing a
control-plane donor) both remove a kubeadm stacked etcd member through ``remove_member``,
with the client certificates from ``client_tls``: one copy, so the two cannot drift (they
had: only one checked that the certificate files exist and kept its copies private).

What kubeadm writes is parsed purely here: the ``kubeadm-config`` ConfigMap in kube-system
(``ClusterConfiguration``: local or external etcd; ``ClusterStatus``: each control-plane
node's API endpoint, before Kubernetes 1.22) and the annotation kubeadm puts on each
kube-apiserver static pod (``kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint``,
which replaced ClusterStatus). kubeadm's stacked etcd listens on the node's advertise
address, clients on 2379 and peers on 2380, and names each member after its node.
"""

from __future__ import annotations

import base64
import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kustos.etcd import membership
from kustos.etcd.client import EtcdTLS
from kustos.runtime.api import Api
from kustos.runtime.errors import ReconcileError
from kustos.runtime.objects import internal_ip, is_control_plane
from kustos.runtime.resources import SECRETS

KUBEADM_CONFIG = "kubeadm-config"
KUBE_SYSTEM = "kube-system"
CLUSTER_STATUS_KEY = "ClusterStatus"
CLUSTER_CONFIGURATION_KEY = "ClusterConfiguration"
APISERVER_ENDPOINT_ANNOTATION = "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint"
APISERVER_LABELS = {"component": "kube-apiserver", "tier": "control-plane"}
APISERVER_SELECTOR = ",".join(f"{key}={value}" for key, value in APISERVER_LABELS.items())
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


def _url(host: str, port: int, scheme: str = "https") -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def client_url(host: str, scheme: str = "https", port: int = ETCD_CLIENT_PORT) -> str:
    return _url(host, port, scheme)


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


def apiserver_endpoint(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """host:port of kubeadm's kube-apiserver static pod among a node's ``pods``, from the
    annotation kubeadm writes on it (None: the node runs none)."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        endpoint = (meta.get("annotations") or {}).get(APISERVER_ENDPOINT_ANNOTATION)
        if (
            meta.get("namespace") == KUBE_SYSTEM
            and endpoint
            and all(labels.get(k) == v for k, v in APISERVER_LABELS.items())
        ):
            return str(endpoint)
    return None


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
        ip = internal_ip(n)
        if ip and is_control_plane(n):
            result[str((n.get("metadata") or {}).get("name"))] = ip
    return result


def certificate_files(directory: Path) -> tuple[Path, Path, Path]:
    """kubeadm's etcd CA and health-check client pair under its certificates directory."""
    return directory / ETCD_CA, directory / ETCD_CLIENT_CERT, directory / ETCD_CLIENT_KEY


# ---- the stacked etcd member ------------------------------------------------------------------


@contextlib.asynccontextmanager
async def client_tls(
    api: Api, certificates_dir: Path, secret_name: str | None = None, scheme: str = "https"
) -> AsyncIterator[EtcdTLS | None]:
    """The etcd client certificates: from the Secret ``namespace/name`` (ca.crt,
    healthcheck-client.crt and .key, written to a private directory, each file 0600, for as long
    as the context lasts) or from kubeadm's certificates directory, every file checked to exist.
    None over plain http. A missing file or key is an ``EtcdCertificatesMissing`` failure."""
    if scheme == "http":
        yield None
        return
    if not secret_name:
        ca, cert, key = certificate_files(certificates_dir)
        missing = [str(p) for p in (ca, cert, key) if not p.is_file()]
        if missing:
            raise ReconcileError(f"kubeadm's etcd certificates are missing: {', '.join(missing)}",
                                 reason="EtcdCertificatesMissing")  # fmt: skip
        yield EtcdTLS(ca, cert, key)
        return
    namespace, _, secret = secret_name.partition("/")
    found = await api.get(SECRETS, namespace, secret)
    data = (found or {}).get("data") or {}
    missing = [k for k in SECRET_KEYS if k not in data]
    if found is None or missing:
        what = "does not exist" if found is None else f"lacks {', '.join(missing)}"
        raise ReconcileError(
            f"etcd certificates Secret {secret_name} {what}", reason="EtcdCertificatesMissing"
        )
    with tempfile.TemporaryDirectory(prefix="kustos-etcd-") as directory:
        paths = []
        for item in SECRET_KEYS:
            path = Path(directory) / item
            path.touch(mode=0o600)  # private before the key is in it
            path.write_bytes(base64.b64decode(data[item]))
            paths.append(path)
        yield EtcdTLS(paths[0], paths[1], paths[2])


@dataclass(frozen=True)
class Removal:
    """What ``remove_member`` did: ``refused`` when the member stays (quorum, no answer, the heir
    not yet a healthy voter); otherwise it is out, or was never in."""

    message: str
    refused: bool = False


async def remove_member(
    endpoints: Sequence[str],
    tls: EtcdTLS | None,
    *,
    name: str = "",
    address: str = "",
    heir_address: str = "",
) -> Removal:
    """Remove the stacked member named ``name`` (kubeadm names it after its node) or listening at
    ``address``, through ``membership.remove_keeping_quorum``: refused when the members left
    would lose quorum. With ``heir_address``, only once a healthy voting member listens there:
    quorum arithmetic alone would let three members shrink to one while heirs that never joined
    etcd replace their donors. ``endpoints`` are the other members' client URLs."""
    reachable = [e for e in endpoints if not address or url_host(e) != address] or list(endpoints)
    if not reachable:
        who = name or address
        return Removal(f"no other control-plane address to reach etcd through; {who}'s member is left", True)
    statuses = await membership.statuses_of(reachable, tls)
    members = await membership.member_list(statuses, tls)
    if members is None:
        return Removal(membership.why_no_member_list(reachable, statuses), refused=True)
    victim = members.by_name(name) if name else None
    if victim is None and address:
        victim = next(
            (
                m
                for m in members.members
                if any(url_host(u) == address for u in (*m.peer_urls, *m.client_urls))
            ),
            None,
        )
    if victim is None:
        return Removal(f"etcd has no member named {name or '-'} or at {address or '-'}: nothing to remove")
    if heir_address:
        heir = next(
            (m for m in members.members if any(url_host(u) == heir_address for u in m.peer_urls)), None
        )
        answered = [u for u, st in statuses.items() if url_host(u) == heir_address and not st.errors]
        if heir is None or heir.is_learner or not answered:
            return Removal(f"the heir's etcd member at {heir_address} has not joined, or is not healthy yet",
                           refused=True)  # fmt: skip
    refusal = await membership.remove_keeping_quorum(reachable, tls, victim.id)
    who = victim.name or hex(victim.id)
    if refusal is not None:
        return Removal(f"etcd member {who} kept: {refusal}", refused=True)
    return Removal(f"removed etcd member {who} ({', '.join(victim.peer_urls)})")


__all__ = [
    "APISERVER_ENDPOINT_ANNOTATION",
    "APISERVER_LABELS",
    "APISERVER_SELECTOR",
    "ControlPlaneAddresses",
    "Removal",
    "addresses",
    "apiserver_endpoint",
    "certificate_files",
    "client_tls",
    "client_url",
    "cluster_status_endpoints",
    "external_etcd",
    "peer_url",
    "pod_endpoints",
    "remove_member",
    "url_host",
    "without_node",
]
