"""An EtcdCluster's NetworkPolicy: who reaches the peer port and who the client port."""

from __future__ import annotations

from typing import Any

from kustos.api.etcd import EtcdCluster
from kustos.etcd.network import network_policy, operator_peer

CHART_ENV = {
    "KUSTOS_OPERATOR_NAMESPACE": "kustos-system",
    "KUSTOS_OPERATOR_POD_LABELS": "app.kubernetes.io/name=kustos,app.kubernetes.io/instance=kustos",
}


def cluster(**spec: Any) -> EtcdCluster:
    return EtcdCluster.model_validate(
        {"metadata": {"name": "db", "namespace": "prod", "uid": "u-1"}, "spec": {"size": 3, **spec}}
    )


def rules(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """port -> the peers let in there."""
    return {p["port"]: rule["from"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}


MEMBERS = {
    "podSelector": {
        "matchLabels": {"kustos.dev/cluster": "db"},
        "matchExpressions": [{"key": "kustos.dev/member", "operator": "Exists"}],
    }
}
AGENTS = {"podSelector": {"matchLabels": {"kustos.dev/cluster-backup": "db"}}}
OPERATOR = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kustos-system"}},
    "podSelector": {
        "matchLabels": {"app.kubernetes.io/name": "kustos", "app.kubernetes.io/instance": "kustos"}
    },
}


def test_only_members_reach_the_peer_port_and_only_clients_the_client_port() -> None:
    app = {
        "namespaceSelector": {"matchLabels": {"team": "app"}},
        "podSelector": {"matchLabels": {"app": "api"}},
    }
    policy = network_policy(cluster(networkPolicy={"clients": [app]}), operator_peer(CHART_ENV))
    assert policy["metadata"]["name"] == "db" and policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert policy["spec"]["podSelector"] == MEMBERS["podSelector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert rules(policy) == {2380: [MEMBERS], 2379: [MEMBERS, AGENTS, OPERATOR, app]}


def test_a_tls_cluster_lets_its_clients_reach_the_metrics_listener_too() -> None:
    assert set(rules(network_policy(cluster(tls={}), None))) == {2379, 2380, 2381}


def test_an_operator_outside_the_cluster_names_no_pod() -> None:
    assert operator_peer({}) is None
    assert rules(network_policy(cluster(), None))[2379] == [MEMBERS, AGENTS]


def test_it_is_on_by_default() -> None:
    assert cluster().spec.network_policy.enabled
