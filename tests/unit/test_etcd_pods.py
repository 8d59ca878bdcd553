"""What an EtcdCluster's member pods, claims and Services look like."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kustos.api.backup import BackupStorage, EtcdBackup, PVCStorage, S3Storage
from kustos.api.etcd import EtcdCluster
from kustos.etcd.backup import agent_pod
from kustos.etcd.observe import pod_view
from kustos.etcd.pods import member_claim, member_pod, services
from kustos.etcd.recovery import Source
from kustos.etcd.restore import backup_source, member_source, restore_seed_pod


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


def test_a_member_back_on_its_volume_is_its_members_pod_from_its_creation() -> None:
    """A recreated pod carries its member's ID: the planner matches it without a pass of its own
    to annotate it (one pass less before the member is seen whole again, issue 28)."""
    c = cluster(storage={"type": "pvc"})
    members = [("db-1", "http://db-1.db-peer.prod.svc:2380"), ("db-0", "http://db-0.db-peer.prod.svc:2380")]
    view = pod_view("db", member_pod(c, 1, "existing", members, "3.6.16", member_id=0xBEEF), lambda _: None)
    assert view is not None and view.member_id == 0xBEEF
    fresh = pod_view("db", member_pod(c, 1, "existing", members, "3.6.16"), lambda _: None)
    assert fresh is not None and fresh.member_id is None  # a new member's pod has no member yet


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


def _excluded(pod: dict[str, Any]) -> list[list[str]]:
    """Per node selector term (ORed), the nodes it keeps the pod off."""
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [
        [v for f in t.get("matchFields", []) if f["operator"] == "NotIn" for v in f["values"]]
        for t in terms["nodeSelectorTerms"]
    ]


def test_a_replacement_is_kept_off_the_nodes_of_leaving_members() -> None:
    pod = member_pod(cluster(), 3, "existing", [], "3.6.16", avoid_nodes=["w2", "w1"])
    assert _excluded(pod) == [["w1", "w2"]]
    assert "preferredDuringSchedulingIgnoredDuringExecution" in pod["spec"]["affinity"]["podAntiAffinity"]


def test_the_users_node_affinity_keeps_each_term_and_gains_the_exclusion() -> None:
    terms = [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]},
             {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["w9"]}]}]  # fmt: skip
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    spec = cluster(pod={"affinity": affinity})
    pod = member_pod(spec, 3, "existing", [], "3.6.16", avoid_nodes=["w1"])
    assert _excluded(pod) == [["w1"], ["w1"]]
    kept = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert kept["nodeSelectorTerms"][0]["matchExpressions"] == terms[0]["matchExpressions"]
    assert member_pod(spec, 3, "existing", [], "3.6.16")["spec"]["affinity"] == affinity  # not changed


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


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What the restricted Pod Security Standard (as the API server's PodSecurity admission
    checks it) finds wrong with a pod; the integration test proves it against the real one."""
    spec, found = pod["spec"], []
    context = spec.get("securityContext") or {}
    if (context.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        found.append("seccompProfile")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            found.append(key)
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
               "projected", "secret"}  # fmt: skip
    found += [f"volume {v['name']}" for v in spec.get("volumes") or [] if not set(v) - {"name"} <= allowed]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        own = c.get("securityContext") or {}
        if not own.get("runAsNonRoot", context.get("runAsNonRoot")):
            found.append(f"{c['name']}: runAsNonRoot")
        if own.get("runAsUser", context.get("runAsUser")) == 0:
            found.append(f"{c['name']}: runAsUser 0")
        if own.get("allowPrivilegeEscalation") is not False:
            found.append(f"{c['name']}: allowPrivilegeEscalation")
        if (own.get("capabilities") or {}).get("drop") != ["ALL"] or (own.get("capabilities") or {}).get(
            "add"
        ):
            found.append(f"{c['name']}: capabilities")
        if own.get("privileged"):
            found.append(f"{c['name']}: privileged")
    return found


@pytest.mark.parametrize(
    "spec",
    [{}, {"storage": {"type": "emptyDir"}}, {"tls": {}},
     {"tls": {"secrets": {"peer": "p", "server": "s", "operatorClient": "o"}}},
     {"pod": {"resources": {"limits": {"memory": "1Gi"}}}}],
)  # fmt: skip
def test_a_member_pod_passes_the_restricted_pod_security_standard(spec: dict[str, Any]) -> None:
    pod = member_pod(cluster(**spec), 0, "new", [("db-0", "http://db-0:2380")], "3.6.16")
    assert restricted_violations(pod) == []
    # etcd's images have no USER: the pod names the id, and its volume's group, so etcd can write.
    assert pod["spec"]["securityContext"]["runAsUser"] == 65532
    assert pod["spec"]["securityContext"]["fsGroup"] == 65532


def test_agent_pods_pass_the_restricted_pod_security_standard() -> None:
    c = cluster(tls={})
    backup = EtcdBackup.model_validate({
        "metadata": {"name": "b", "namespace": "prod", "uid": "b1"}, "spec": {"clusterName": "db"},
        "status": {"phase": "Succeeded", "location": "s3://bucket/prod/db/b.db", "sha256": "ab" * 32},
    })  # fmt: skip
    s3 = S3Storage(endpoint="http://s3", bucket="bucket", credentials_secret="creds")
    now = datetime(2026, 11, 26, tzinfo=UTC)
    pods = [
        agent_pod(backup, c, BackupStorage(pvc=PVCStorage()), ("db-0", "https://db-0:2379"), 1, "img", now),
        agent_pod(backup, c, BackupStorage(s3=s3), ("db-0", "https://db-0:2379"), 1, "img", now),
        restore_seed_pod(
            c, 3, "3.6.16", 1, member_source(Source("member", "db-0"), "https://db-0:2379"), "img"
        ),
    ]
    source = backup_source(backup, BackupStorage(s3=s3))
    assert not isinstance(source, str)
    pods.append(restore_seed_pod(c, 3, "3.6.16", 1, source, "img"))
    for pod in pods:
        assert restricted_violations(pod) == [], pod["metadata"]["name"]
