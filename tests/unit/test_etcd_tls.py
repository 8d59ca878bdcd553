"""etcd TLS, the pure parts: certificates (tls.py), renewal decisions and pod flags
(certs.py), and rolling members onto new certificates (planner)."""

from __future__ import annotations

import base64
import copy
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from kustos.api.etcd import EtcdCluster
from kustos.etcd import planner, tls
from kustos.etcd.certs import (
    POD_UID_ANNOTATION,
    REQUEST_ANNOTATION,
    MemberPod,
    ca_verdict,
    client_secret_name,
    member_renewal_reason,
    secret_manifest,
    user_fingerprint,
)
from kustos.etcd.planner import MemberView, PodView, plan
from kustos.etcd.pods import member_pod, member_urls
from tests.unit.test_etcd_planner import Model, healthy_cluster, observed

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture(scope="module")
def ca() -> tls.KeyPair:
    return tls.new_ca("test CA", NOW)


def cluster(**tls_spec: Any) -> EtcdCluster:
    return EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "e", "namespace": "ns", "uid": "c-uid"},
        "spec": {"size": 3, "addressing": "podIP", "tls": tls_spec},
    })  # fmt: skip


# ---- tls.py ----------------------------------------------------------------------------


def test_a_member_certificate_names_every_address_it_is_dialled_by(ca: tls.KeyPair) -> None:
    names = tls.member_names("e", "ns", "e-2")
    pair = tls.issue(ca, "e-2", NOW, DAY, dns_names=names, ips=tls.member_ips("127.3.0.7"))
    info = tls.info(pair.cert)
    for name in (
        "e-2.e-peer.ns.svc", "e-2.e-peer.ns.svc.cluster.local", "e-client", "e-client.ns",
        "e-client.ns.svc", "e-client.ns.svc.cluster.local", "localhost",
    ):  # fmt: skip
        assert name in info.dns_names
    assert set(info.ips) == {"127.3.0.7", "127.0.0.1"}
    cert = x509.load_pem_x509_certificate(pair.cert)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # serverAuth for whoever dials it, clientAuth for its peers and etcd's own gateway.
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert tls.signed_by(pair.cert, ca.cert)
    assert info.common_name == "e-2"


def test_without_an_ip_yet_only_loopback_is_named(ca: tls.KeyPair) -> None:
    assert tls.member_ips(None) == ("127.0.0.1",)


def test_a_client_certificate_cannot_serve(ca: tls.KeyPair) -> None:
    pair = tls.issue(ca, "kustos-operator", NOW, DAY, server=False)
    usages = x509.load_pem_x509_certificate(pair.cert).extensions.get_extension_for_class(
        x509.ExtendedKeyUsage
    )
    assert list(usages.value) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_lifetime_backdating_and_the_ca_bound(ca: tls.KeyPair) -> None:
    info = tls.info(tls.issue(ca, "m", NOW, DAY).cert)
    assert info.not_after == NOW + DAY
    assert info.not_before == NOW - tls.BACKDATE
    # Never valid beyond the CA that signed it.
    # A short lifetime is backdated by a tenth only, or it would be due for renewal at once.
    minute = tls.info(tls.issue(ca, "m", NOW, timedelta(seconds=60)).cert)
    assert minute.not_before == NOW - timedelta(seconds=6)
    assert not tls.needs_renewal(minute, NOW + timedelta(seconds=20), 50)
    assert tls.needs_renewal(minute, NOW + timedelta(seconds=28), 50)
    short = tls.new_ca("short", NOW, lifetime=timedelta(hours=2))
    assert tls.info(tls.issue(short, "m", NOW, DAY).cert).not_after == NOW + timedelta(hours=2)


def test_each_certificate_has_its_own_serial_and_key(ca: tls.KeyPair) -> None:
    a, b = tls.issue(ca, "m", NOW, DAY), tls.issue(ca, "m", NOW, DAY)
    assert tls.info(a.cert).serial != tls.info(b.cert).serial and a.key != b.key


def test_another_ca_is_told_apart_by_signature(ca: tls.KeyPair) -> None:
    other = tls.new_ca("test CA", NOW)  # same name, other key
    pair = tls.issue(other, "m", NOW, DAY)
    assert not tls.signed_by(pair.cert, ca.cert) and tls.signed_by(pair.cert, other.cert)


@given(
    lifetime_hours=st.integers(1, 24 * 365),
    percent=st.integers(1, 90),
    elapsed=st.floats(0, 1.2),
)
@settings(max_examples=200, deadline=None)
def test_renewal_is_due_once_the_given_share_of_lifetime_is_left(
    lifetime_hours: int, percent: int, elapsed: float
) -> None:
    lifetime = timedelta(hours=lifetime_hours)
    info = tls.CertInfo("1", NOW, NOW + lifetime, (), (), "", "m")
    moment = NOW + lifetime * elapsed
    left = (NOW + lifetime) - moment
    assert tls.needs_renewal(info, moment, percent) == (left <= lifetime * (percent / 100))
    assert tls.renewal_due(info, percent) <= info.not_after
    assert tls.needs_renewal(info, tls.renewal_due(info, percent), percent)
    assert not tls.needs_renewal(info, NOW, percent)


def test_a_ca_is_reused_while_it_outlives_new_certificates() -> None:
    ca = tls.info(tls.new_ca("c", NOW).cert)
    assert tls.ca_usable(ca, NOW, timedelta(days=90))
    assert not tls.ca_usable(ca, NOW + timedelta(days=3650 - 100), timedelta(days=90))


# ---- certs.py: renewal decisions and the pod ----------------------------------------


def member_secret(
    ca: tls.KeyPair, pod_uid: str, request: str = "", lifetime: timedelta = DAY
) -> dict[str, Any]:
    pair = tls.issue(ca, "e-0", NOW, lifetime)
    return secret_manifest(
        cluster(), "e-0-tls", {"tls.crt": pair.cert, "tls.key": pair.key, "ca.crt": ca.cert},
        {"uid": "p"}, {POD_UID_ANNOTATION: pod_uid, REQUEST_ANNOTATION: request},
    )  # fmt: skip


POD = MemberPod("e-0", "u0", "127.1.1.1", running=True, deleting=False)


def test_a_current_certificate_is_kept(ca: tls.KeyPair) -> None:
    assert member_renewal_reason(member_secret(ca, "u0"), POD, ca.cert, "", NOW, 33) is None
    assert member_renewal_reason(None, POD, ca.cert, "", NOW, 33) is None  # not issued yet: it waits


def test_expiry_a_renewal_request_and_another_ca_each_restart_a_member(ca: tls.KeyPair) -> None:
    secret = member_secret(ca, "u0")
    assert "due" in str(member_renewal_reason(secret, POD, ca.cert, "", NOW + DAY * 0.7, 33))
    assert "asked" in str(member_renewal_reason(secret, POD, ca.cert, "2026-11-23", NOW, 33))
    other = tls.new_ca("other", NOW)
    assert "CA" in str(member_renewal_reason(secret, POD, other.cert, "", NOW, 33))


def test_a_certificate_of_an_earlier_pod_restarts_a_running_member_only(ca: tls.KeyPair) -> None:
    secret = member_secret(ca, "old-uid")
    assert "earlier pod" in str(member_renewal_reason(secret, POD, ca.cert, "", NOW, 33))
    waiting = dataclasses.replace(POD, running=False)  # it is waiting for its own: reissue, no restart
    assert member_renewal_reason(secret, waiting, ca.cert, "", NOW, 33) is None


def test_secrets_are_labelled_owned_and_base64(ca: tls.KeyPair) -> None:
    secret = member_secret(ca, "u0")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["labels"]["kustos.dev/cluster"] == "e"
    assert base64.b64decode(secret["data"]["ca.crt"]) == ca.cert


def test_user_secret_fingerprint_follows_certificates_not_keys(ca: tls.KeyPair) -> None:
    a = member_secret(ca, "u0")
    b = copy.deepcopy(a)
    assert user_fingerprint(a, a) == user_fingerprint(b, b)
    b["data"]["tls.crt"] = base64.b64encode(tls.issue(ca, "x", NOW, DAY).cert).decode()
    assert user_fingerprint(a, b) != user_fingerprint(a, a)


def _args(pod: dict[str, Any]) -> list[str]:
    return list(pod["spec"]["containers"][0]["args"])


def test_a_tls_member_pod_listens_on_https_and_demands_client_certificates() -> None:
    c = cluster()
    pod = member_pod(c, 0, "new", [("e-0", member_urls(c, "e-0")[0])], "3.6.16")
    args = _args(pod)
    assert "--listen-client-urls=https://0.0.0.0:2379" in args
    assert "--listen-peer-urls=https://0.0.0.0:2380" in args
    assert "--advertise-client-urls=https://$(POD_IP):2379" in args
    assert "--initial-cluster=e-0=https://$(POD_IP):2380" in args
    flags = (
        "--client-cert-auth",
        "--peer-client-cert-auth",
        "--cert-file=/etc/etcd/tls/tls.crt",
        "--peer-trusted-ca-file=/etc/etcd/tls/ca.crt",
        "--listen-metrics-urls=http://0.0.0.0:2381",
    )
    for flag in flags:
        assert flag in args
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["tls"]["secret"] == {"secretName": "e-0-tls"}  # not optional: the pod waits for it
    container = pod["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["port"] == 2381
    assert {"name": "tls", "mountPath": "/etc/etcd/tls", "readOnly": True} in container["volumeMounts"]


def test_user_secrets_are_mounted_for_peer_and_server() -> None:
    c = cluster(secrets={"peer": "my-peer", "server": "my-server", "operatorClient": "my-client"})
    pod = member_pod(c, 0, "new", [("e-0", member_urls(c, "e-0")[0])], "3.6.16")
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    assert volumes == {"peer-tls": "my-peer", "server-tls": "my-server"}
    assert "--peer-cert-file=/etc/etcd/peer-tls/tls.crt" in _args(pod)
    assert "--cert-file=/etc/etcd/server-tls/tls.crt" in _args(pod)
    assert client_secret_name(c) == "my-client"
    assert client_secret_name(cluster()) == "e-client-tls"


def test_a_plain_cluster_is_untouched() -> None:
    c = EtcdCluster.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdCluster",
        "metadata": {"name": "e", "namespace": "ns", "uid": "c-uid"}, "spec": {"addressing": "podIP"},
    })  # fmt: skip
    pod = member_pod(c, 0, "new", [("e-0", member_urls(c, "e-0")[0])], "3.6.16")
    assert not any("cert" in a for a in _args(pod)) and len(pod["spec"]["volumes"]) == 1
    assert "--listen-client-urls=http://0.0.0.0:2379" in _args(pod)


# ---- planner: restarting members onto new certificates ------------------------------


def test_tls_urls_are_https() -> None:
    members, pods = healthy_cluster(1)
    o = observed(members, pods, 1, tls=True)
    assert planner.peer_url(o, pods[0]) == "https://127.1.1.1:2380"
    assert planner.client_url(o, pods[0]) == "https://127.1.1.1:2379"


def test_a_stale_pvc_member_restarts_in_place_with_the_reason() -> None:
    members, pods = healthy_cluster(3, leader=0)
    pods[2] = dataclasses.replace(pods[2], tls_stale="a renewal was asked for")
    step = plan(observed(members, pods, 3, storage="pvc"))
    assert step == planner.DeletePod("e-2", "u2", "restarting it: a renewal was asked for")


def test_a_stale_emptydir_member_is_replaced_by_a_new_one_first() -> None:
    members, pods = healthy_cluster(3, leader=0)
    pods = [dataclasses.replace(p, tls_stale="due") for p in pods]
    assert plan(observed(members, pods, 3)) == planner.CreatePod(3)


def test_a_certificate_renewal_is_not_an_upgrade() -> None:
    """A member on a fresh certificate dying is replaced; it does not halt anything."""
    members, pods = healthy_cluster(3)
    pods = [dataclasses.replace(p, tls_stale="due" if p.index < 2 else None) for p in pods]
    members[2] = dataclasses.replace(members[2], healthy=False)
    since = {"e-2": datetime(2026, 1, 1, tzinfo=UTC)}
    step = plan(observed(members, pods, 3, unhealthy_since=since))
    assert isinstance(step, planner.RemoveMember) and step.name == "e-2"


@given(size=st.integers(1, 7), storage=st.sampled_from(["emptyDir", "pvc"]), leader=st.integers(0, 6))
@settings(max_examples=100, deadline=None)
def test_renewal_restarts_every_member_once_one_at_a_time_leader_last(
    size: int, storage: str, leader: int
) -> None:
    model = Model(size, storage)
    model.run()
    for m in list(model.members.values()):
        model.members[m.id] = dataclasses.replace(m, leader=False)
    chosen = list(model.members.values())[leader % size]
    model.members[chosen.id] = dataclasses.replace(chosen, leader=True)
    for name, pod in list(model.pods.items()):
        model.pods[name] = dataclasses.replace(pod, tls_stale="a renewal was asked for")
    model.roll(lambda p: p.tls_stale is not None)
    assert not any(p.tls_stale for p in model.pods.values()) and len(model.pods) == size
    assert len(model.members) == size and all(m.healthy for m in model.members.values())


def test_a_backup_pod_of_a_tls_cluster_gets_the_client_certificate() -> None:
    from kustos.api.backup import BackupStorage, EtcdBackup, PVCStorage
    from kustos.etcd.backup import agent_pod

    backup = EtcdBackup.model_validate({
        "apiVersion": "kustos.dev/v1alpha1", "kind": "EtcdBackup",
        "metadata": {"name": "b", "namespace": "ns", "uid": "b1"}, "spec": {"clusterName": "e"},
    })  # fmt: skip
    started = datetime(2026, 11, 23, tzinfo=UTC)
    pod = agent_pod(
        backup, cluster(), BackupStorage(pvc=PVCStorage()), ("e-0", "https://m:2379"), 1, "img", started
    )
    save = pod["spec"]["initContainers"][0]  # etcdctl talks to the member; the agent only stores
    command = save["command"]
    assert command[command.index("--cacert") + 1] == "/etc/etcd/client-tls/ca.crt"
    assert command[command.index("--cert") + 1] == "/etc/etcd/client-tls/tls.crt"
    assert command[command.index("--key") + 1] == "/etc/etcd/client-tls/tls.key"
    assert {"name": "etcd-client-tls", "mountPath": "/etc/etcd/client-tls", "readOnly": True} in save[
        "volumeMounts"
    ]
    assert "--cacert" not in pod["spec"]["containers"][0]["command"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["etcd-client-tls"]["secret"] == {"secretName": "e-client-tls"}
    assert len(pod["spec"]["volumes"]) == len(volumes)


def _ca_secret(pair: tls.KeyPair) -> dict[str, Any]:
    return secret_manifest(cluster(), "e-ca", {"ca.crt": pair.cert, "ca.key": pair.key}, {"uid": "c"})


def test_the_ca_is_created_once_then_reused(ca: tls.KeyPair) -> None:
    assert ca_verdict(None, NOW, 90 * DAY) == (None, None, None)  # none yet: create one
    reused, problem, warning = ca_verdict(_ca_secret(ca), NOW + 30 * DAY, 90 * DAY)
    assert reused == ca and problem is None and warning is None


def test_a_ca_is_never_replaced_silently(ca: tls.KeyPair) -> None:
    other = tls.new_ca("other", NOW)
    mixed = _ca_secret(tls.KeyPair(ca.cert, other.key))
    assert ca_verdict(mixed, NOW, DAY)[1] == "its ca.key does not belong to its ca.crt"
    broken = _ca_secret(tls.KeyPair(b"not a certificate", ca.key))
    assert "unusable" in str(ca_verdict(broken, NOW, DAY)[1])
    empty = _ca_secret(ca)
    del empty["data"]["ca.key"]
    assert ca_verdict(empty, NOW, DAY)[1] == "it lacks ca.crt or ca.key"
    old = tls.new_ca("old", NOW - 2 * DAY, lifetime=DAY)
    assert "expired" in str(ca_verdict(_ca_secret(old), NOW, DAY)[1])


def test_a_ca_close_to_its_end_is_reused_with_a_warning() -> None:
    ending = tls.new_ca("ending", NOW, lifetime=100 * DAY)
    reused, problem, warning = ca_verdict(_ca_secret(ending), NOW, 90 * DAY)
    assert reused == ending and problem is None and "expires at" in str(warning)


def test_a_member_that_surged_in_is_not_shrunk_away_while_it_starts() -> None:
    members, pods = healthy_cluster(3, leader=0)
    pods = [dataclasses.replace(p, tls_stale="due") for p in pods]
    pods.append(PodView("e-3", 3, uid="u3", ip="127.1.1.4", running=True, member_id=103))
    members.append(MemberView(103, "e-3", "http://127.1.1.4:2380", healthy=False))
    step = plan(observed(members, pods, 3))
    assert isinstance(step, planner.Wait) and "e-3" in step.reason
    # Once it answers, an outdated member goes.
    members[3] = dataclasses.replace(members[3], healthy=True)
    step = plan(observed(members, pods, 3))
    assert isinstance(step, planner.RemoveMember) and step.name == "e-2"
