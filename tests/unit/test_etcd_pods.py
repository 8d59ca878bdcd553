"""What an EtcdCluster's member pods, claims and Services look like."""

from __future__ import annotations

from typing import Any

import pytest

from kustos.api.etcd import EtcdCluster
from kustos.etcd.pods import member_claim, member_pod, services


def cluster(**spec: Any) -> EtcdCluster:
    return EtcdCluster.model_validate(
        {"metadata": {"name": "db", "namespace": "prod", "uid": "u-1"}, "spec": {"size": 3, **spec}}
    )


def args_of(pod: dict[str, Any]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in pod["spec"]["containers"][0]["args"] if "=" in a)


def test_a_joining_member_lists_every_member_and_itself() -> None:
    c = cluster()
    members = [("db-4", "http://db-4.db-peer.prod.svc:2380"), ("db-0", "http://db-0.db-peer.prod.svc:2380")]
    pod = member_pod(c, 4, "existing", members, "3.6.16")
    args = args_of(pod)
    assert pod["metadata"]["name"] == "db-4"
    assert (
        args["initial-cluster"]
        == "db-4=http://db-4.db-peer.prod.svc:2380,db-0=http://db-0.db-peer.prod.svc:2380"
    )
    assert args["initial-cluster-state"] == "existing"
    assert args["initial-advertise-peer-urls"] == "http://db-4.db-peer.prod.svc:2380"
    assert args["initial-cluster-token"] == "u-1"
    assert pod["spec"]["hostname"] == "db-4" and pod["spec"]["subdomain"] == "db-peer"
    assert pod["spec"]["containers"][0]["image"] == "gcr.io/etcd-development/etcd:v3.6.16"


def test_pod_ip_addressing_expands_the_pod_ip_in_the_container() -> None:
    args = args_of(
        member_pod(cluster(addressing="podIP"), 0, "new", [("db-0", "http://$(POD_IP):2380")], "3.6.16")
    )
    assert args["advertise-client-urls"] == "http://$(POD_IP):2379"
    assert args["initial-cluster"] == "db-0=http://$(POD_IP):2380"


def test_other_repositories_use_v_tags() -> None:
    pod = member_pod(cluster(repository="quay.io/coreos/etcd"), 0, "new", [], "3.5.35")
    assert pod["spec"]["containers"][0]["image"] == "quay.io/coreos/etcd:v3.5.35"


@pytest.mark.parametrize(("mode", "key"), [
    ("preferred", "preferredDuringSchedulingIgnoredDuringExecution"),
    ("required", "requiredDuringSchedulingIgnoredDuringExecution"),
])  # fmt: skip
def test_members_spread_over_nodes_by_default(mode: str, key: str) -> None:
    pod = member_pod(cluster(pod={"antiAffinity": mode}), 0, "new", [], "3.6.16")
    assert key in pod["spec"]["affinity"]["podAntiAffinity"]


def test_pod_policy_reaches_the_pod() -> None:
    policy = {
        "antiAffinity": "none", "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        "resources": {"requests": {"cpu": "100m"}}, "labels": {"team": "a"}, "annotations": {"note": "x"},
    }  # fmt: skip
    pod = member_pod(cluster(pod=policy, extraArgs=["--quota-backend-bytes=1"]), 0, "new", [], "3.6.16")
    spec = pod["spec"]
    assert "affinity" not in spec and spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert spec["containers"][0]["resources"] == {"requests": {"cpu": "100m"}}
    assert pod["metadata"]["labels"]["team"] == "a" and pod["metadata"]["annotations"]["note"] == "x"
    assert pod["metadata"]["labels"]["kustos.dev/cluster"] == "db"
    assert "--quota-backend-bytes=1" in spec["containers"][0]["args"]


def test_pvc_storage_mounts_a_claim_owned_by_the_cluster() -> None:
    c = cluster(storage={"type": "pvc", "size": "5Gi", "storageClassName": "fast"})
    pod = member_pod(c, 2, "new", [], "3.6.16")
    assert pod["spec"]["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "db-2-data"}}]
    claim = member_claim(c, "db-2", epoch=2)
    assert claim["metadata"]["labels"]["kustos.dev/epoch"] == "2", "volumes of a rebuilt cluster are kept"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_services_client_and_headless_peer() -> None:
    client, peer = services(cluster(clientService={"type": "NodePort"}))
    assert client["metadata"]["name"] == "db-client" and client["spec"]["type"] == "NodePort"
    assert peer["metadata"]["name"] == "db-peer" and peer["spec"]["clusterIP"] == "None"
    assert peer["spec"]["publishNotReadyAddresses"] is True
    assert {p["port"] for p in peer["spec"]["ports"]} == {2379, 2380}
