"""The NetworkPolicy of an EtcdCluster: only members reach the peer port, only the cluster's
clients reach the client port (the members, the operator, kustos's backup pods, and the peers
``spec.networkPolicy.clients`` names). A restore's seed is a member pod, so it is let in too.

The operator learns where it runs from the chart (``KUSTOS_OPERATOR_NAMESPACE``, its pod's
namespace, and ``KUSTOS_OPERATOR_POD_LABELS``, its pods' selector labels as ``k=v,k=v``); an
operator outside the cluster (a developer's process) has no pod to name, and the policy then
lets in no operator rule of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd.backup import AGENT_CLUSTER_LABEL
from kustos.etcd.certs import METRICS_PORT
from kustos.etcd.pods import CLUSTER_LABEL, MEMBER_LABEL, owned_metadata

Obj = dict[str, Any]

OPERATOR_NAMESPACE_ENV = "KUSTOS_OPERATOR_NAMESPACE"
OPERATOR_POD_LABELS_ENV = "KUSTOS_OPERATOR_POD_LABELS"
CLIENT_PORT, PEER_PORT = 2379, 2380


def operator_peer(env: Mapping[str, str]) -> Obj | None:
    """The operator's pods as a NetworkPolicy peer, from the chart's environment (None outside)."""
    namespace, pod_labels = env.get(OPERATOR_NAMESPACE_ENV), env.get(OPERATOR_POD_LABELS_ENV)
    if not namespace or not pod_labels:
        return None
    selector = dict(item.split("=", 1) for item in pod_labels.split(",") if "=" in item)
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": selector},
    }


def member_selector(cluster: EtcdCluster) -> Obj:
    return {
        "matchLabels": {CLUSTER_LABEL: cluster.metadata["name"]},
        "matchExpressions": [{"key": MEMBER_LABEL, "operator": "Exists"}],
    }


def network_policy(cluster: EtcdCluster, operator: Obj | None) -> Obj:
    """The cluster's NetworkPolicy, named as the cluster and owned by it."""
    name = cluster.metadata["name"]
    members = {"podSelector": member_selector(cluster)}
    agents = {"podSelector": {"matchLabels": {AGENT_CLUSTER_LABEL: name}}}
    clients = [members, agents, *([operator] if operator else []), *cluster.spec.network_policy.clients]
    client_ports = [{"protocol": "TCP", "port": CLIENT_PORT}]
    if cluster.spec.tls is not None:  # its plain-http metrics listener (certs.secure_member_pod)
        client_ports.append({"protocol": "TCP", "port": METRICS_PORT})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": owned_metadata(cluster, name),
        "spec": {
            "podSelector": member_selector(cluster),
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [members], "ports": [{"protocol": "TCP", "port": PEER_PORT}]},
                {"from": clients, "ports": client_ports},
            ],
        },
    }
