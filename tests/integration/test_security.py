"""Security past RBAC (issue 27) against the real API server and real etcd members.

- kustos's pods pass the restricted Pod Security Standard: in a namespace that enforces it,
  TLS members, an S3 backup's agent pod and a restore's seed are all admitted and run;
- a member pod the API server refuses is a condition naming the refusal, retried with the
  runtime's backoff, on the same member index (the audit log counts the creates);
- each EtcdCluster has a NetworkPolicy (peer port from members only, client port from its
  clients), kept with its spec and removed with it or when turned off. What it allows is
  read from the object: the dev cluster's network plugin does not enforce NetworkPolicy;
- nothing secret leaks: the values of every Secret of such a run (the CA's and members' keys,
  the operator's client key, the S3 secret key, etcd users' passwords and the operator's etcd
  root passwords, the operator's own token) appear in none of
  the operator's log, the namespace's Events, the kustos objects (status and conditions) or
  the agent pods' logs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.cluster import DevClusterError
from kustos.devcluster.s3 import S3Server
from kustos.etcd.client import (
    AuthFailed,
    AuthRequired,
    EtcdClient,
    EtcdCredentials,
    EtcdTLS,
    PermissionDenied,
)
from kustos.etcd.network import OPERATOR_NAMESPACE_ENV, OPERATOR_POD_LABELS_ENV
from tests.integration import audit
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster, running_operator, status_of, wait_healthy
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, chart_identity
from tests.integration.test_etcd_backup import s3, s3_secret, s3_storage  # noqa: F401  (fixture)
from tests.integration.test_etcd_recovery import take_backup
from tests.integration.test_etcd_tls import user_client_certificate

pytestmark = pytest.mark.process_runner(
    "admission of restricted pods is the API server's; restricted pods on runc: test_real_nodes_lifecycle"
)

ENFORCE = "pod-security.kubernetes.io/enforce"
# How long the refused creates are watched: the backoff shows within it, and its next retry comes
# soon after.
WINDOW = 30
APP_PASSWORD = "app-password-in-a-secret"
APP = (EtcdCredentials("app", APP_PASSWORD),)
APP_AUTH = {
    "users": [{"name": "app", "passwordSecret": {"name": "app-pw"}, "roles": ["app"]}],
    "roles": [{"name": "app", "permissions": [{"type": "readwrite", "key": "/s/", "prefix": True}]}],
}


async def app_writes(url: str, tls: EtcdTLS) -> bool:
    """etcd authentication is on (a login gives a token) and app writes its prefix."""
    try:
        async with EtcdClient(url, tls, credentials=APP) as client:
            token = await client.login()
            await client.put("/s/probe", "x")
    except (AuthFailed, AuthRequired, PermissionDenied):
        return False
    return token is not None


def api_token_mounted(pod: dict[str, Any]) -> bool:
    """The pod, as admitted, has a projected service account token (``kube-api-access-*``)."""
    projected = [v.get("projected") or {} for v in pod["spec"].get("volumes") or []]
    return any("serviceAccountToken" in source for p in projected for source in p.get("sources") or [])


def enforce_restricted(kubectl: Kubectl) -> None:
    kubectl.cluster.kubectl("label", "namespace", kubectl.namespace, f"{ENFORCE}=restricted",
                            f"{ENFORCE}-version=latest")  # fmt: skip


async def test_tls_members_an_s3_backup_and_a_restore_run_restricted_and_no_secret_leaks(
    kubectl: Kubectl,
    operator: OperatorProcess,
    s3: S3Server,  # noqa: F811
    tmp_path: Path,
) -> None:
    enforce_restricted(kubectl)
    s3_secret(kubectl, s3)
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "app-pw"},
                   "stringData": {"password": APP_PASSWORD}})  # fmt: skip
    kubectl.apply(etcd_cluster("sec", 3, tls={}, auth=APP_AUTH, storage={"type": "pvc", "size": "1Gi"}))
    status = await wait_healthy(kubectl, "sec", 3, timeout=180)
    # With etcd authentication on, a client logs in: a certificate with no Common Name, a password.
    user = user_client_certificate(kubectl, "sec", tmp_path / "user", common_name="")
    await wait_until(lambda: app_writes(status["members"][0]["clientUrl"], user), "user app", timeout=90)
    async with EtcdClient(status["members"][0]["clientUrl"], user, credentials=APP) as client:
        for i in range(50):
            await client.put(f"/s/{i:03d}", "v" * 64)
    backup = await take_backup(kubectl, "sec-s3", "sec", storage=s3_storage(s3))
    assert backup["location"].startswith("s3://")

    # Restored with its users: the operator logs in with sec's root password, then sets its own.
    kubectl.apply(etcd_cluster("copy", 1, tls={}, auth=APP_AUTH, restore={"backup": "sec-s3"}))
    copy = await wait_healthy(kubectl, "copy", 1, timeout=180)
    assert copy["recovery"]["phase"] == "Succeeded"
    reader = user_client_certificate(kubectl, "copy", tmp_path / "reader", common_name="")

    async def all_read() -> bool:
        async with EtcdClient(copy["members"][0]["clientUrl"], reader, credentials=APP) as client:
            return len((await client.range("/s/0", prefix=True, keys_only=True)).kvs) == 50

    await wait_until(all_read, "the restored keys, read as app", timeout=60)

    # Each was admitted under enforce=restricted (the API server refuses any other pod there).
    pods = {p["metadata"]["name"]: p for p in kubectl.get("pods")["items"]}
    assert {"sec-0", "sec-1", "sec-2", "sec-s3-snapshot-1"} <= set(pods)
    assert any(p.startswith("copy-") for p in pods)
    for pod in pods.values():
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, pod["metadata"]["name"]
    # etcd members (the restored one too: its fetch read S3 without one) hold no API token.
    members = [n for n in pods if n.startswith(("sec-", "copy-")) and not n.startswith("sec-s3")]
    assert members and [n for n in members if api_token_mounted(pods[n])] == []

    secrets = dict(secret_values(kubectl, operator))
    assert any("ca.key" in where for where in secrets) and any("secretAccessKey" in w for w in secrets)
    texts = {"operator log": operator.log(), "events": kubectl("get", "events", "-o", "json")}
    for kind in ("etcdclusters", "etcdbackups"):
        texts[kind] = kubectl("get", kind, "-o", "json")
    for name, pod in pods.items():
        for container in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]:
            texts[f"log of {name}/{container['name']}"] = kubectl("logs", name, "-c", container["name"],
                                                                  check=False)  # fmt: skip
    leaks = [f"{where} in the {text}" for where, value in secrets.items() for text, content in texts.items()
             if value in content]  # fmt: skip
    assert leaks == []


def test_the_charts_operator_pod_is_admitted_in_a_restricted_namespace(kubectl: Kubectl) -> None:
    """The operator's pod as the chart renders it, created (server-side dry run: admission runs,
    nothing is stored) where the API server enforces the restricted standard."""
    from kustos.devcluster import operator as dev_operator

    enforce_restricted(kubectl)
    rendered = dev_operator.helm(kubectl.cluster, "template", "kustos", str(dev_operator.chart_dir()),
                                 "--namespace", kubectl.namespace)  # fmt: skip
    deployment = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "operator"},
           "spec": {**deployment["spec"]["template"]["spec"], "serviceAccountName": "default"}}  # fmt: skip
    created = kubectl("create", "--dry-run=server", "-o", "name", "-f", "-", input_text=json.dumps(pod))
    assert created.strip() == "pod/operator"
    # And the same pod as root is refused there: the namespace does enforce.
    pod["spec"]["securityContext"] = {**pod["spec"]["securityContext"], "runAsNonRoot": False, "runAsUser": 0}
    with pytest.raises(DevClusterError, match="violates PodSecurity"):
        kubectl("create", "--dry-run=server", "-f", "-", input_text=json.dumps(pod))


def secret_values(kubectl: Kubectl, operator: OperatorProcess) -> Iterator[tuple[str, str]]:
    """(where, value) for every secret value of the run, and the forms it could leak in: whole,
    base64 (as a Secret's data), and each line of a PEM key's body. Certificates are public."""
    for secret in kubectl.get("secrets")["items"]:
        for key, encoded in (secret.get("data") or {}).items():
            if key.endswith(".crt"):
                continue
            where = f"{secret['metadata']['name']}/{key}"
            value = base64.b64decode(encoded).decode(errors="replace")
            yield from forms(where, value)
            yield f"{where} (base64)", encoded
    config = yaml.safe_load(chart_identity(kubectl.cluster).read_text())
    yield "the operator's token", config["users"][0]["user"]["token"]


def forms(where: str, value: str) -> Iterator[tuple[str, str]]:
    if len(value) >= 12:  # shorter ones (an access key id) are no secret and match by chance
        yield where, value.strip()
    for n, line in enumerate(value.splitlines()):
        if len(line) >= 40 and not line.startswith("-----"):
            yield f"{where} (line {n})", line


async def test_a_refused_member_pod_keeps_its_index_and_is_retried_with_backoff(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    enforce_restricted(kubectl)
    kubectl.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
                   "spec": {"hard": {"pods": "0"}}})  # fmt: skip
    audit_log = kubectl.cluster.audit_log
    offset = audit_log.stat().st_size
    kubectl.apply(etcd_cluster("strict", 1, storage={"type": "pvc", "size": "1Gi"}))
    started = time.monotonic()

    async def refused() -> dict[str, Any] | None:
        conditions = status_of(kubectl, "strict").get("conditions") or []
        return next((c for c in conditions if c.get("reason") == "PodRefused"), None)

    condition = await wait_until(refused, "a condition naming the refusal", timeout=60,
                                 cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert condition["type"] == "Progressing"
    assert "strict-0" in condition["message"] and "exceeded quota" in condition["message"]

    indexes: list[int] = []
    while time.monotonic() - started < WINDOW:
        indexes.append(int(status_of(kubectl, "strict").get("nextMemberIndex") or 0))
        await asyncio.sleep(0.5)
    creates = pod_creates(audit_log, offset, kubectl.namespace)
    print(
        f"refused pod creates in the first {WINDOW} s: {len(creates)}, at",
        [round(t - creates[0], 2) for t in creates],
    )
    # Before: ~20 creates a second, each burning an index (1,201 after 35 s).
    # The backoff (5 ms doubling) allows ~13 in 30 s, nearly all in its first seconds, the next
    # at about 41 s: soon after the quota goes, below.
    assert 3 <= len(creates) <= 16, creates
    last_half = [t for t in creates if t >= creates[0] + WINDOW / 2]
    assert len(last_half) <= 2, creates
    # Reserved by each attempt's intent for a moment, and given back by its record.
    assert max(indexes) <= 1 and indexes.count(0) > len(indexes) // 2, indexes

    kubectl("delete", "resourcequota", "no-pods")
    status = await wait_healthy(kubectl, "strict", 1, timeout=120)  # the backoff's next retry
    assert [m["name"] for m in status["members"]] == ["strict-0"]
    assert status["nextMemberIndex"] == 1
    assert [c["metadata"]["name"] for c in kubectl.get("pvc")["items"]] == ["strict-0-data"]
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        await client.put("/after", "the refusal")


def pod_creates(audit_log: Path, offset: int, namespace: str) -> list[float]:
    """When (seconds, from the audit log's timestamps) the operator asked to create a pod in
    ``namespace``, from the log's byte ``offset`` on."""
    with audit_log.open() as log:
        log.seek(offset)
        lines = log.read().splitlines()
    times = []
    for line in lines:
        if not line.endswith("}"):  # blank, or the one the API server is writing
            continue
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            event.get("stage") == "ResponseComplete" and event.get("verb") == "create"
            and ref.get("resource") == "pods" and not ref.get("subresource")
            and ref.get("namespace") == namespace
            and audit.is_operator(event.get("user", {}).get("username", ""))
        ):  # fmt: skip
            times.append(datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp())
    return times


async def test_a_network_policy_lets_in_only_the_clusters_clients_and_follows_its_spec(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    chart = {  # as the chart sets them in the operator's pod
        OPERATOR_NAMESPACE_ENV: "kustos-system",
        OPERATOR_POD_LABELS_ENV: "app.kubernetes.io/name=kustos,app.kubernetes.io/instance=kustos",
    }
    app = {
        "namespaceSelector": {"matchLabels": {"team": "app"}},
        "podSelector": {"matchLabels": {"app": "api"}},
    }
    with running_operator(kubectl, tmp_path / "operator", env=chart):
        kubectl.apply(etcd_cluster("np", 1))

        async def policy(want: int | None = None) -> dict[str, Any] | None:
            found = kubectl.get("networkpolicies")["items"]
            current = found[0] if found else None
            if current is None or (want is not None and len(current["spec"]["ingress"][1]["from"]) != want):
                return None
            return dict(current)

        made = await wait_until(policy, "the cluster's NetworkPolicy", timeout=60, cluster=kubectl.cluster,
                                namespace=kubectl.namespace)  # fmt: skip
        assert (
            made["metadata"]["name"] == "np"
            and made["metadata"]["ownerReferences"][0]["kind"] == "EtcdCluster"
        )
        members = {"matchLabels": {"kustos.dev/cluster": "np"},
                   "matchExpressions": [{"key": "kustos.dev/member", "operator": "Exists"}]}  # fmt: skip
        assert made["spec"]["podSelector"] == members
        peer, client = made["spec"]["ingress"]
        assert peer == {"from": [{"podSelector": members}], "ports": [{"protocol": "TCP", "port": 2380}]}
        assert client["ports"] == [{"protocol": "TCP", "port": 2379}]
        assert client["from"] == [
            {"podSelector": members},
            {"podSelector": {"matchLabels": {"kustos.dev/cluster-backup": "np"}}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kustos-system"}},
             "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kustos",
                                             "app.kubernetes.io/instance": "kustos"}}},
        ]  # fmt: skip
        await wait_healthy(kubectl, "np", 1)  # and the members run beside it

        kubectl("patch", "etcdcluster", "np", "--type=merge", "-p", json.dumps({"spec": {"networkPolicy": {
            "clients": [app]}}}))  # fmt: skip
        updated = await wait_until(lambda: policy(4), "the spec's client let in", timeout=60,
                                   cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        assert updated["spec"]["ingress"][1]["from"][3] == app

        kubectl(
            "patch", "etcdcluster", "np", "--type=merge", "-p", '{"spec":{"networkPolicy":{"enabled":false}}}'
        )

        async def gone() -> bool:
            return not kubectl.get("networkpolicies")["items"]

        await wait_until(gone, "the NetworkPolicy turned off", timeout=60, cluster=kubectl.cluster,
                         namespace=kubectl.namespace)  # fmt: skip
        kubectl(
            "patch", "etcdcluster", "np", "--type=merge", "-p", '{"spec":{"networkPolicy":{"enabled":true}}}'
        )
        await wait_until(policy, "the NetworkPolicy back", timeout=60, cluster=kubectl.cluster,
                         namespace=kubectl.namespace)  # fmt: skip
        kubectl("delete", "etcdcluster", "np", "--wait=false")
        await wait_until(gone, "the NetworkPolicy gone with its cluster", timeout=90, cluster=kubectl.cluster,
                         namespace=kubectl.namespace)  # fmt: skip
