"""Admission webhooks: AdmissionReview answers, the serving certificate, and the configurations."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given
from hypothesis import strategies as st

from kustos.runtime.webhook import (
    MUTATING,
    VALIDATING,
    AdmissionResponse,
    ServingCertificate,
    Webhook,
    handle_review,
    webhook_configurations,
)

DNS_NAMES = ["kustos-webhook.kustos-system.svc", "kustos-webhook.kustos-system.svc.cluster.local"]
IPS = ["127.0.0.1", "::1"]


# ---- AdmissionResponse ---------------------------------------------------------------------


def test_allow_review() -> None:
    assert AdmissionResponse.allow().review("uid-1") == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "uid-1", "allowed": True},
    }


def test_allow_with_warnings() -> None:
    response = AdmissionResponse.allow("replicas should be odd", "version is old").review("u")["response"]
    assert response == {"uid": "u", "allowed": True, "warnings": ["replicas should be odd", "version is old"]}


def test_deny_review_carries_code_and_message() -> None:
    response = AdmissionResponse.deny("spec.replicas: must be odd").review("u")["response"]
    assert response == {
        "uid": "u",
        "allowed": False,
        "status": {"code": 403, "message": "spec.replicas: must be odd"},
    }
    assert AdmissionResponse.deny("bad", code=422).review("u")["response"]["status"]["code"] == 422


def test_mutate_review_carries_a_base64_json_patch() -> None:
    patch = [
        {"op": "add", "path": "/spec/replicas", "value": 3},
        {"op": "replace", "path": "/metadata/labels/a~1b", "value": "ü"},
    ]
    response = AdmissionResponse.mutate(patch).review("u")["response"]
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == patch
    assert "status" not in response


def test_an_empty_patch_is_a_plain_allow() -> None:
    assert AdmissionResponse.mutate([]).review("u")["response"] == {"uid": "u", "allowed": True}


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
PATCH_OPS = st.fixed_dictionaries(
    {
        "op": st.sampled_from(["add", "remove", "replace"]),
        "path": st.text().map(lambda s: "/" + s),
        "value": JSON_VALUES,
    }
)


@given(patch=st.lists(PATCH_OPS, min_size=1, max_size=5), uid=st.text())
def test_any_patch_round_trips_through_the_review(patch: list[dict[str, Any]], uid: str) -> None:
    review = AdmissionResponse.mutate(patch).review(uid)
    json.dumps(review)  # serialisable as it is
    assert review["response"]["uid"] == uid
    assert json.loads(base64.b64decode(review["response"]["patch"], validate=True)) == patch


# ---- handle_review -------------------------------------------------------------------------


def _webhook(handler: Any, kind: str = "validating", **extra: Any) -> Webhook:
    name = "vetcd.kustos.dev" if kind == "validating" else "metcd.kustos.dev"
    rules = [
        {
            "apiGroups": ["kustos.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["etcdclusters"],
        }
    ]
    return Webhook(name, f"/{kind}/etcd", kind, rules, handler, **extra)  # type: ignore[arg-type]


async def test_handle_review_passes_the_request_and_answers_with_its_uid() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(request: dict[str, Any]) -> AdmissionResponse:
        seen.append(request)
        return AdmissionResponse.deny("no")

    request = {"uid": "abc-123", "operation": "CREATE", "object": {"spec": {"replicas": 2}}}
    review = await handle_review(_webhook(handler), {"apiVersion": "admission.k8s.io/v1", "request": request})
    assert seen == [request]
    assert review["response"] == {
        "uid": "abc-123",
        "allowed": False,
        "status": {"code": 403, "message": "no"},
    }


async def test_a_handler_exception_becomes_a_500_denial_naming_the_webhook() -> None:
    async def handler(request: dict[str, Any]) -> AdmissionResponse:
        raise KeyError("spec")

    review = await handle_review(_webhook(handler), {"request": {"uid": "u-1"}})
    response = review["response"]
    assert response["uid"] == "u-1"
    assert response["allowed"] is False
    assert response["status"]["code"] == 500
    assert "vetcd.kustos.dev" in response["status"]["message"]
    assert "spec" in response["status"]["message"]


async def test_handle_review_without_a_request() -> None:
    async def handler(request: dict[str, Any]) -> AdmissionResponse:
        assert request == {}
        return AdmissionResponse.allow()

    review = await handle_review(_webhook(handler), {})
    assert review["response"] == {"uid": "", "allowed": True}


# ---- the serving certificate ---------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate() -> ServingCertificate:
    return ServingCertificate.self_signed(DNS_NAMES, IPS, days=30)


def _load(certificate: ServingCertificate) -> tuple[x509.Certificate, x509.Certificate]:
    return x509.load_pem_x509_certificate(certificate.cert_pem), x509.load_pem_x509_certificate(
        certificate.ca_pem
    )


def test_the_certificate_is_issued_by_the_ca(certificate: ServingCertificate) -> None:
    leaf, ca = _load(certificate)
    assert leaf.issuer == ca.subject
    leaf.verify_directly_issued_by(ca)  # raises if the signature does not check out
    ca.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True


def test_the_certificate_names_the_requested_hosts(certificate: ServingCertificate) -> None:
    leaf, _ = _load(certificate)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == DNS_NAMES
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address(ip) for ip in IPS]
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == DNS_NAMES[0]


def test_the_certificate_is_for_servers(certificate: ServingCertificate) -> None:
    leaf, _ = _load(certificate)
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_the_key_matches_and_validity_covers_now(certificate: ServingCertificate) -> None:
    leaf, ca = _load(certificate)
    key = serialization.load_pem_private_key(certificate.key_pem, password=None)
    assert key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    now = dt.datetime.now(dt.UTC)
    for cert in (leaf, ca):
        assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc
    assert abs(leaf.not_valid_after_utc - (now + dt.timedelta(days=30))) < dt.timedelta(minutes=1)
    assert abs(certificate.not_after - leaf.not_valid_after_utc) < dt.timedelta(seconds=1)


def test_ca_bundle_is_the_base64_ca(certificate: ServingCertificate) -> None:
    assert base64.b64decode(certificate.ca_bundle) == certificate.ca_pem


def test_a_certificate_for_ips_only_is_named_after_the_first() -> None:
    leaf = x509.load_pem_x509_certificate(ServingCertificate.self_signed([], ["10.0.0.7"]).cert_pem)
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "10.0.0.7"
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == []


def test_from_files_round_trips(certificate: ServingCertificate, tmp_path: Path) -> None:
    cert, key, ca = _write(certificate, tmp_path)
    loaded = ServingCertificate.from_files(cert, key, ca)
    assert (loaded.cert_pem, loaded.key_pem, loaded.ca_pem) == (
        certificate.cert_pem,
        certificate.key_pem,
        certificate.ca_pem,
    )
    assert abs(loaded.not_after - certificate.not_after) < dt.timedelta(seconds=1)
    # Without a CA file, the certificate is its own bundle.
    assert ServingCertificate.from_files(cert, key).ca_pem == certificate.cert_pem


def _write(certificate: ServingCertificate, directory: Path) -> tuple[Path, Path, Path]:
    cert, key, ca = directory / "tls.crt", directory / "tls.key", directory / "ca.crt"
    cert.write_bytes(certificate.cert_pem)
    key.write_bytes(certificate.key_pem)
    ca.write_bytes(certificate.ca_pem)
    return cert, key, ca


@pytest.fixture
async def tls_port(certificate: ServingCertificate, tmp_path: Path) -> AsyncIterator[int]:
    """A TLS echo-hello server on 127.0.0.1 presenting the serving certificate."""
    cert, key, _ = _write(certificate, tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def hello(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(hello, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def _client_context(ca_pem: bytes, strict: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    # Go's verifier (the API server's) does not apply OpenSSL's strict RFC 5280 profile;
    # the strict case has its own test below.
    if strict:
        context.verify_flags |= ssl.VERIFY_X509_STRICT
    else:
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


async def _hello(port: int, context: ssl.SSLContext, server_hostname: str) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname=server_hostname
    )
    try:
        return await reader.read()
    finally:
        writer.close()


@pytest.mark.parametrize("server_hostname", [*DNS_NAMES, "127.0.0.1"])
async def test_a_client_trusting_the_ca_accepts_the_server(
    certificate: ServingCertificate, tls_port: int, server_hostname: str
) -> None:
    assert await _hello(tls_port, _client_context(certificate.ca_pem), server_hostname) == b"hello"


async def test_a_client_rejects_a_name_the_certificate_does_not_carry(
    certificate: ServingCertificate, tls_port: int
) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await _hello(tls_port, _client_context(certificate.ca_pem), "other.kustos-system.svc")


async def test_a_client_trusting_another_ca_rejects_the_server(tls_port: int) -> None:
    stranger = ServingCertificate.self_signed(DNS_NAMES, IPS)
    with pytest.raises(ssl.SSLCertVerificationError):
        await _hello(tls_port, _client_context(stranger.ca_pem), DNS_NAMES[0])


async def test_the_chain_passes_strict_rfc5280_verification(
    certificate: ServingCertificate, tls_port: int
) -> None:
    context = _client_context(certificate.ca_pem, strict=True)
    assert await _hello(tls_port, context, DNS_NAMES[0]) == b"hello"


# ---- webhook configurations ----------------------------------------------------------------


async def _allow(request: dict[str, Any]) -> AdmissionResponse:
    return AdmissionResponse.allow()


def test_configurations_with_a_url() -> None:
    validating = _webhook(_allow, "validating")
    mutating = _webhook(_allow, "mutating", failure_policy="Ignore", timeout_seconds=5)
    configs = webhook_configurations(
        "kustos", [validating, mutating], "Q0E=", base_url="https://10.0.0.1:9443/"
    )
    assert [ref for ref, _ in configs] == [VALIDATING, MUTATING]
    (_, vobj), (_, mobj) = configs
    assert vobj["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert vobj["kind"] == "ValidatingWebhookConfiguration"
    assert mobj["kind"] == "MutatingWebhookConfiguration"
    assert vobj["metadata"] == {"name": "kustos"}  # no labels: helm owns managed-by
    assert vobj["webhooks"] == [
        {
            "name": "vetcd.kustos.dev",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "rules": validating.rules,
            "clientConfig": {"caBundle": "Q0E=", "url": "https://10.0.0.1:9443/validating/etcd"},
        }
    ]
    [entry] = mobj["webhooks"]
    assert entry["clientConfig"] == {"caBundle": "Q0E=", "url": "https://10.0.0.1:9443/mutating/etcd"}
    assert entry["failurePolicy"] == "Ignore"
    assert entry["timeoutSeconds"] == 5
    assert entry["reinvocationPolicy"] == "IfNeeded"
    assert "namespaceSelector" not in entry and "objectSelector" not in entry


def test_configurations_with_a_service_and_selectors() -> None:
    selector = {"matchExpressions": [{"key": "kustos.dev/ignore", "operator": "DoesNotExist"}]}
    objects = {"matchLabels": {"app": "etcd"}}
    hooks = [
        _webhook(_allow, "validating", namespace_selector=selector, object_selector=objects),
        Webhook("v2.kustos.dev", "/validating/other", "validating", [], _allow),
    ]
    service = {"namespace": "kustos-system", "name": "kustos-webhook", "port": 443}
    configs = webhook_configurations("kustos", hooks, "Q0E=", service=service)
    assert [ref for ref, _ in configs] == [VALIDATING]  # no mutating webhooks: no mutating configuration
    first, second = configs[0][1]["webhooks"]
    assert first["clientConfig"] == {"caBundle": "Q0E=", "service": {**service, "path": "/validating/etcd"}}
    assert first["namespaceSelector"] == selector
    assert first["objectSelector"] == objects
    assert "reinvocationPolicy" not in first
    assert second["name"] == "v2.kustos.dev"
    assert second["clientConfig"]["service"]["path"] == "/validating/other"
    assert "namespaceSelector" not in second
    assert service == {"namespace": "kustos-system", "name": "kustos-webhook", "port": 443}


def test_no_webhooks_no_configurations() -> None:
    assert webhook_configurations("kustos", [], "Q0E=", base_url="https://x") == []
