"""EtcdCluster with TLS (SPEC F-ETCD-10), with real etcd members run by the pod runner.

These clusters use DNS addressing, except ``sec`` and ``own`` (pod-IP addressing: each
member's certificate is issued once its pod has an IP, and its container waits for it).
"""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from kustos.etcd import tls
from kustos.etcd.client import EtcdClient, EtcdTLS, EtcdTLSError
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_rejected,
    etcd_cluster,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "certificates and handshakes are etcd's; a TLS cluster on runc: test_real_nodes_lifecycle"
)


def secret_data(kubectl: Kubectl, name: str) -> dict[str, bytes]:
    data = kubectl.get("secret", name)["data"]
    return {k: base64.b64decode(v) for k, v in data.items()}


def user_client_certificate(
    kubectl: Kubectl, cluster: str, directory: Path, common_name: str = "test-user"
) -> EtcdTLS:
    """What a user does: take the cluster's CA and issue a client certificate from it (with no
    ``common_name`` for a client that logs in with a password, as etcd's gateway then needs)."""
    ca = secret_data(kubectl, f"{cluster}-ca")
    pair = tls.issue(
        tls.KeyPair(ca["ca.crt"], ca["ca.key"]), common_name, datetime.now(UTC), timedelta(hours=1),
        server=False,
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(ca["ca.crt"])
    (directory / "user.crt").write_bytes(pair.cert)
    (directory / "user.key").write_bytes(pair.key)
    return EtcdTLS(directory / "ca.crt", directory / "user.crt", directory / "user.key")


async def served_serial(endpoint: str, client: EtcdTLS) -> str:
    """The serial of the certificate a member really serves (a TLS handshake)."""
    url = httpx.URL(endpoint)
    _reader, writer = await asyncio.open_connection(url.host, url.port, ssl=client.ssl_context())
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return format(x509.load_der_x509_certificate(der).serial_number, "x")


def member_serials(status: dict[str, Any]) -> dict[str, str]:
    certs = (status.get("tls") or {}).get("certificates") or []
    return {c["pod"]: c["serial"] for c in certs if c.get("pod")}


def events(kubectl: Kubectl, name: str) -> str:
    return kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")


async def test_tls_cluster_works_refuses_clients_without_certificates_renews_and_scales(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Failure detection is not under test here: on a busy machine a joining member may take
    # longer than the 5 s the other tests use, and replacing it only slows the roll down.
    kubectl.apply(etcd_cluster("sec", 3, tls={"lifetime": "24h"}, memberFailureTimeout="15s",
                               addressing="podIP"))  # fmt: skip
    status = await wait_healthy(kubectl, "sec", 3, timeout=180)
    urls = [m["clientUrl"] for m in status["members"]]
    assert all(u.startswith("https://") for u in urls), urls
    user = user_client_certificate(kubectl, "sec", tmp_path / "user")

    # A client with the CA and a certificate issued from it works ...
    async with EtcdClient(urls[0], user) as client:
        await client.put("/hello", "tls")
        assert (await client.get("/hello")).value == b"tls"  # type: ignore[union-attr]
    # ... one without a certificate is refused (--client-cert-auth), and so is plain http.
    async with EtcdClient(urls[0], EtcdTLS(user.ca_file), timeout=3.0) as anonymous:
        try:
            await anonymous.status()
            raise AssertionError("a client without a certificate was served")
        except EtcdTLSError:
            pass
    async with EtcdClient(urls[0].replace("https://", "http://"), timeout=3.0) as plain:
        assert not await plain.health()

    # Every member serves its own certificate, naming its pod IP, signed by the cluster's CA.
    ca = secret_data(kubectl, "sec-ca")["ca.crt"]
    before = member_serials(status)
    assert sorted(before) == sorted(m["name"] for m in status["members"])
    for member in status["members"]:
        data = secret_data(kubectl, f"{member['name']}-tls")
        info = tls.info(data["tls.crt"])
        ip = httpx.URL(member["clientUrl"]).host
        assert ip in info.ips and tls.signed_by(data["tls.crt"], ca)
        assert f"{member['name']}.sec-peer.{kubectl.namespace}.svc" in info.dns_names
        assert await served_serial(member["clientUrl"], user) == info.serial == before[member["name"]]
    assert "CertificatesIssued" in events(kubectl, "sec")

    # A forced renewal rotates every certificate while a writer keeps writing through the CA.
    writer = Writer(urls, tls=user)
    writer.start()
    try:
        kubectl("annotate", "etcdcluster", "sec", "kustos.dev/renew-certificates=1")
        sizes: set[int] = set()
        phases: set[str] = set()

        async def renewed() -> dict[str, Any] | None:
            current = status_of(kubectl, "sec")
            writer.update(current)
            sizes.add(len(current.get("members") or []))
            phases.add(str(current.get("phase")))
            serials = member_serials(current)
            done = (
                current.get("ready") == "3/3"
                and len(current.get("members") or []) == 3
                and not (current.get("tls") or {}).get("renewing")
                and len(serials) == 3
                and not set(serials.values()) & set(before.values())
            )
            return current if done else None

        status = await wait_until(renewed, "every certificate renewed", timeout=240,
                                  cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        status = await wait_healthy(kubectl, "sec", 3)
        writer.update(status)
        await asyncio.sleep(1)
    finally:
        await writer.stop()
    assert len(writer.acknowledged) > 50
    assert await writer.missing(status["members"][0]["clientUrl"]) == []
    assert max(sizes) <= 4 and "QuorumLost" not in phases  # one member at a time
    after = member_serials(status)
    for member in status["members"]:
        assert await served_serial(member["clientUrl"], user) == after[member["name"]]
    client_serial = next(c["serial"] for c in status["tls"]["certificates"] if c["name"] == "sec-client-tls")
    assert status["tls"]["renewalRequest"] == "1" and client_serial
    # The CA is kept: certificates users issued from it before the renewal stay valid.
    assert secret_data(kubectl, "sec-ca")["ca.crt"] == ca
    assert "CertificatesRenewed" in events(kubectl, "sec")

    # The operator still talks to it (it reports members healthy) and it grows with TLS.
    kubectl("patch", "etcdcluster", "sec", "--type=merge", "-p", '{"spec":{"size":5}}')
    status = await wait_healthy(kubectl, "sec", 5, timeout=180)
    serials = member_serials(status)
    assert len(serials) == 5
    for member in status["members"]:
        assert await served_serial(member["clientUrl"], user) == serials[member["name"]]
    async with EtcdClient(status["members"][-1]["clientUrl"], user) as client:
        assert (await client.get("/hello")).value == b"tls"  # type: ignore[union-attr]


async def test_pvc_members_restart_on_their_volumes_onto_renewed_certificates(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    # As for "sec" above: a member's failure clock runs from its pod's deletion, and under CI's
    # load one restart took 5 s (its pod 4.5 s to stop), so the 5 s timeout replaced it, and the
    # next joiner too, instead of renewing (stop 35's CI).
    kubectl.apply(etcd_cluster("pv", 3, tls={}, storage={"type": "pvc", "size": "64Mi"},
                               memberFailureTimeout="15s"))  # fmt: skip
    status = await wait_healthy(kubectl, "pv", 3, timeout=180)
    user = user_client_certificate(kubectl, "pv", tmp_path / "user")
    async with EtcdClient(status["members"][0]["clientUrl"], user) as client:
        for i in range(100):
            await client.put(f"/kept/{i:03d}", str(i))
    before = member_serials(status)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.get("pods")["items"]}
    ids = {m["name"]: m["id"] for m in status["members"]}

    kubectl("annotate", "etcdcluster", "pv", "kustos.dev/renew-certificates=now")

    async def renewed() -> dict[str, Any] | None:
        current = status_of(kubectl, "pv")
        serials = member_serials(current)
        done = (
            current.get("ready") == "3/3"
            and not (current.get("tls") or {}).get("renewing")
            and sorted(serials) == sorted(before)
            and not set(serials.values()) & set(before.values())
        )
        return current if done else None

    status = await wait_until(renewed, "every certificate renewed", timeout=240,
                              cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    status = await wait_healthy(kubectl, "pv", 3)
    # The same members (names and etcd IDs) in new pods, on their own volumes.
    assert {m["name"]: m["id"] for m in status["members"]} == ids
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.get("pods")["items"]}
    assert sorted(pods) == sorted(uids) and not set(pods.values()) & set(uids.values())
    async with EtcdClient(status["members"][-1]["clientUrl"], user) as client:
        found = await client.range("/kept/", prefix=True, keys_only=True)
    assert len(found.kvs) == 100
    restarts = events(kubectl, "pv")
    assert "restarting it: a renewal was asked for" in restarts and "CertificatesRenewed" in restarts


async def test_a_backup_of_a_tls_cluster_uses_the_operators_client_certificate(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    kubectl.apply(etcd_cluster("bt", 1, tls={}))
    status = await wait_healthy(kubectl, "bt", 1, timeout=120)
    user = user_client_certificate(kubectl, "bt", tmp_path / "user")
    async with EtcdClient(status["members"][0]["clientUrl"], user) as client:
        for i in range(50):
            revision = await client.put(f"/b/{i}", "x" * 100)
    kubectl.apply({"apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup", "metadata": {"name": "bt-now"},
                   "spec": {"clusterName": "bt"}})  # fmt: skip

    async def succeeded() -> dict[str, Any] | None:
        current = dict(kubectl.get("etcdbackup", "bt-now").get("status") or {})
        return current if current.get("phase") == "Succeeded" else None

    result = await wait_until(succeeded, "the backup to succeed", timeout=120, cluster=kubectl.cluster,
                              namespace=kubectl.namespace)  # fmt: skip
    assert result["revision"] >= revision and result["size"] > 0 and result["attempts"] == 1
    # etcdctl saved it over TLS with the operator's client certificate (the agent itself never dials)
    pod = kubectl.get("pod", "bt-now-snapshot-1")
    save = pod["spec"]["initContainers"][0]
    assert save["command"][0] == "etcdctl" and "--cert" in save["command"]
    assert "snapshot saved" in kubectl("logs", "bt-now-snapshot-1", "-c", "etcdctl").lower()


async def test_certificates_are_renewed_before_they_expire(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    """No annotation: a 60 s lifetime renewed with half of it left."""
    kubectl.apply(etcd_cluster("exp", 1, tls={"lifetime": "60s", "renewBeforePercent": 50}))
    status = await wait_healthy(kubectl, "exp", 1, timeout=120)
    first = member_serials(status)
    member = next(c for c in status["tls"]["certificates"] if c.get("pod"))
    not_after = datetime.fromisoformat(member["notAfter"])
    renew_after = datetime.fromisoformat(member["renewAfter"])
    assert timedelta(seconds=25) <= not_after - renew_after <= timedelta(seconds=35)

    async def renewed() -> dict[str, Any] | None:
        current = status_of(kubectl, "exp")
        serials = member_serials(current)
        fresh = serials and not set(serials.values()) & set(first.values())
        return current if fresh and current.get("ready") == "1/1" else None

    status = await wait_until(renewed, "the member's certificate renewed", timeout=120,
                              cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    # Renewed before the old certificate expired (the cluster never ran on an expired one).
    assert datetime.now(UTC) < not_after + timedelta(seconds=10)
    assert "due for renewal" in events(kubectl, "exp")


def _user_tls_secret(name: str, pair: tls.KeyPair, ca: tls.KeyPair) -> dict[str, Any]:
    data = {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": ca.cert}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}  # fmt: skip


async def test_user_secrets_missing_are_reported_then_used_once_they_exist(
    kubectl: Kubectl, operator: OperatorProcess, tmp_path: Path
) -> None:
    secrets = {"peer": "my-peer", "server": "my-server", "operatorClient": "my-client"}
    kubectl.apply(etcd_cluster("own", 1, tls={"secrets": secrets}, addressing="podIP"))

    async def reported() -> bool:
        conditions = {c["type"]: c for c in status_of(kubectl, "own").get("conditions") or []}
        ready = conditions.get("CertificatesReady") or {}
        return ready.get("status") == "False" and "my-peer does not exist" in ready.get("message", "")

    await wait_until(reported, "the missing Secret reported", timeout=60)

    async def told() -> bool:
        # The Event follows the status write that turned the condition (a CI run at a load of
        # 15 read the events in between).
        return "TLSSecretInvalid" in events(kubectl, "own")

    await wait_until(told, "a TLSSecretInvalid Event", timeout=30)

    # The member waits for its Secrets; a user who knows its address can now issue them.
    async def pod_ip() -> str | None:
        pod = kubectl.get("pod", "own-0")
        return (pod.get("status") or {}).get("podIP")

    ip = await wait_until(pod_ip, "the member's pod IP", timeout=60)
    now = datetime.now(UTC)
    ca = tls.new_ca("my CA", now)
    member = tls.issue(ca, "own", now, timedelta(hours=1), dns_names=("localhost",), ips=(ip,))
    client = tls.issue(ca, "me", now, timedelta(hours=1), server=False)
    kubectl.apply(
        _user_tls_secret("my-peer", member, ca),
        _user_tls_secret("my-server", member, ca),
        _user_tls_secret("my-client", client, ca),
    )
    status = await wait_healthy(kubectl, "own", 1, timeout=120)
    (tmp_path / "ca.crt").write_bytes(ca.cert)
    (tmp_path / "me.crt").write_bytes(client.cert)
    (tmp_path / "me.key").write_bytes(client.key)
    mine = EtcdTLS(tmp_path / "ca.crt", tmp_path / "me.crt", tmp_path / "me.key")
    async with EtcdClient(status["members"][0]["clientUrl"], mine) as etcd:
        await etcd.put("/mine", "yes")
    assert await served_serial(status["members"][0]["clientUrl"], mine) == tls.info(member.cert).serial
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["CertificatesReady"] == "True"

    # It started on the Secrets as they are now: that is recorded, and nothing restarts.
    async def fingerprinted() -> bool:
        annotations = kubectl.get("pod", "own-0")["metadata"].get("annotations") or {}
        return "kustos.dev/tls-fingerprint" in annotations

    await wait_until(fingerprinted, "the member's TLS fingerprint", timeout=30)
    await asyncio.sleep(5)
    assert [p["metadata"]["name"] for p in kubectl.get("pods")["items"]] == ["own-0"]
    assert {c["name"] for c in status["tls"]["certificates"]} == {"my-peer", "my-server", "my-client"}


async def test_a_renewal_cut_short_by_an_operator_crash_resumes(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    """The roll lives in Secrets, pods and status, not in the operator's memory."""
    with running_operator(kubectl, tmp_path / "a"):
        kubectl.apply(etcd_cluster("cr", 3, tls={}, storage={"type": "pvc", "size": "64Mi"}))
        status = await wait_healthy(kubectl, "cr", 3, timeout=180)
    before = member_serials(status)
    kubectl("annotate", "etcdcluster", "cr", "kustos.dev/renew-certificates=after-crash")
    faulty_env = {"KUSTOS_FAULT_EXIT_AFTER": "DeletePod", "KUSTOS_FAULT_MARKER": str(tmp_path / "fault")}
    with running_operator(kubectl, tmp_path / "b", env=faulty_env) as faulty:

        async def crashed() -> bool:
            return not faulty.alive()

        await wait_until(crashed, "the operator to exit after restarting a member", timeout=90)
        assert faulty.process.returncode == 137
    with running_operator(kubectl, tmp_path / "c"):

        async def renewed() -> dict[str, Any] | None:
            current = status_of(kubectl, "cr")
            serials = member_serials(current)
            done = (
                current.get("ready") == "3/3"
                and not (current.get("tls") or {}).get("renewing")
                and sorted(serials) == sorted(before)
                and not set(serials.values()) & set(before.values())
            )
            return current if done else None

        await wait_until(renewed, "the renewal finished by the next operator", timeout=240,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
        await wait_healthy(kubectl, "cr", 3)
    assert "CertificatesRenewed" in events(kubectl, "cr")


def test_bad_tls_specs_are_rejected_naming_the_field(crds: None, kubectl: Kubectl) -> None:
    assert_rejected(kubectl, etcd_cluster("bad", 1, tls={"lifetime": "90 days"}), "spec.tls.lifetime")
    assert_rejected(
        kubectl, etcd_cluster("bad", 1, tls={"renewBeforePercent": 0}), "spec.tls.renewBeforePercent"
    )
    assert_rejected(
        kubectl, etcd_cluster("bad", 1, tls={"secrets": {"peer": "p"}}), "spec.tls.secrets.server"
    )
    kubectl.apply(etcd_cluster("plain", 1))
    assert_rejected(
        kubectl, etcd_cluster("plain", 1, tls={}), "tls cannot be turned on or off on a live cluster"
    )
