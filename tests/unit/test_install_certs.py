"""Which stored webhook certificate the replicas may keep using (install/certs.py)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kustos.etcd.carotation import ROTATE_CA_ANNOTATION
from kustos.install.certs import (
    RENEW_BEFORE,
    Step,
    rotation_patch,
    rotation_step,
    secret_manifest,
    service_dns_names,
    usable,
)
from kustos.runtime.webhook import ServingCertificate

NAMES = service_dns_names("kustos-system", "kustos-webhook")
SETTLE = dt.timedelta(seconds=125)


def test_the_service_names_include_what_the_api_server_calls() -> None:
    assert "kustos-webhook.kustos-system.svc" in NAMES


def test_a_complete_current_certificate_for_our_service_is_kept() -> None:
    certificate = ServingCertificate.self_signed(NAMES, [], days=365)
    secret = secret_manifest("kustos-system", "kustos-webhook-cert", certificate)
    found = usable(secret, NAMES, dt.datetime.now(dt.UTC))
    assert found is not None and found.cert_pem == certificate.cert_pem and found.ca_pem == certificate.ca_pem
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}


def test_a_certificate_near_expiry_is_kept_for_the_leader_to_rotate() -> None:
    certificate = ServingCertificate.self_signed(NAMES, [], days=365)
    secret = secret_manifest("kustos-system", "s", certificate)
    later = certificate.not_after - RENEW_BEFORE + dt.timedelta(hours=1)
    assert usable(secret, NAMES, later) is not None
    assert rotation_step(stored(secret), certificate.not_after, later, SETTLE) is Step.TRUST
    assert usable(secret, NAMES, certificate.not_after + dt.timedelta(seconds=1)) is None  # expired


def stored(secret: dict[str, Any], version: str = "1") -> dict[str, Any]:
    return {**secret, "metadata": {**secret["metadata"], "resourceVersion": version}}


def apply(secret: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The API server's merge patch of a Secret: a null removes the key."""
    assert patch["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    data = {k: v for k, v in {**secret["data"], **patch["data"]}.items() if v is not None}
    notes = {**(secret["metadata"].get("annotations") or {}), **patch["metadata"].get("annotations", {})}
    notes = {k: v for k, v in notes.items() if v is not None}
    version = str(int(secret["metadata"]["resourceVersion"]) + 1)
    return {
        **secret,
        "data": data,
        "metadata": {**secret["metadata"], "annotations": notes, "resourceVersion": version},
    }


def served(secret: dict[str, Any]) -> ServingCertificate:
    found = usable(secret, NAMES, dt.datetime.now(dt.UTC))
    assert found is not None
    return found


def test_a_requested_rotation_trusts_both_cas_then_serves_the_new_then_drops_the_old() -> None:
    old = ServingCertificate.self_signed(NAMES, [], days=365)
    secret = stored(secret_manifest("kustos-system", "s", old))
    now = dt.datetime.now(dt.UTC)
    assert rotation_step(secret, old.not_after, now, SETTLE) is None  # nothing due
    secret["metadata"]["annotations"] = {ROTATE_CA_ANNOTATION: "2026-11-26"}
    assert rotation_step(secret, old.not_after, now, SETTLE) is Step.TRUST
    new = ServingCertificate.self_signed(NAMES, [], days=365)

    secret = apply(secret, rotation_patch(Step.TRUST, secret, now, new))
    trusted = served(secret)
    assert trusted.cert_pem == old.cert_pem  # still the old leaf, trusted by both CAs
    assert trusted.ca_pem.count(b"BEGIN CERTIFICATE") == 2 and new.ca_pem in trusted.ca_pem
    assert rotation_step(secret, old.not_after, now + SETTLE / 2, SETTLE) is None  # replicas catch up

    later = now + SETTLE
    assert rotation_step(secret, old.not_after, later, SETTLE) is Step.SERVE
    secret = apply(secret, rotation_patch(Step.SERVE, secret, later))
    switched = served(secret)
    assert switched.cert_pem == new.cert_pem and switched.ca_pem == trusted.ca_pem
    assert rotation_step(secret, new.not_after, later, SETTLE) is None

    last = later + SETTLE
    assert rotation_step(secret, new.not_after, last, SETTLE) is Step.DROP
    secret = apply(secret, rotation_patch(Step.DROP, secret, last))
    assert served(secret).ca_pem == new.ca_pem and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    # The request was carried out: the same annotation asks for nothing more.
    assert rotation_step(secret, new.not_after, last + SETTLE, SETTLE) is None


def test_a_certificate_for_an_address_must_name_it() -> None:
    for_ip = ServingCertificate.self_signed([], ["127.0.0.1"], days=365)
    secret = secret_manifest("kustos-system", "s", for_ip)
    now = dt.datetime.now(dt.UTC)
    assert usable(secret, [], now, ["127.0.0.1"]) is not None
    assert usable(secret, [], now, ["10.0.0.1"]) is None


def test_a_certificate_for_another_service_or_incomplete_is_replaced() -> None:
    other = ServingCertificate.self_signed(service_dns_names("elsewhere", "kustos-webhook"), [], days=365)
    now = dt.datetime.now(dt.UTC)
    assert usable(secret_manifest("kustos-system", "s", other), NAMES, now) is None
    secret = secret_manifest("kustos-system", "s", ServingCertificate.self_signed(NAMES, [], days=365))
    del secret["data"]["ca.crt"]
    assert usable(secret, NAMES, now) is None
    assert usable(None, NAMES, now) is None
