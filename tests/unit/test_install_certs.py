"""Which stored webhook certificate the replicas may keep using (install/certs.py)."""

from __future__ import annotations

import datetime as dt

from kustos.install.certs import RENEW_BEFORE, secret_manifest, service_dns_names, usable
from kustos.runtime.webhook import ServingCertificate

NAMES = service_dns_names("kustos-system", "kustos-webhook")


def test_the_service_names_include_what_the_api_server_calls() -> None:
    assert "kustos-webhook.kustos-system.svc" in NAMES


def test_a_complete_current_certificate_for_our_service_is_kept() -> None:
    certificate = ServingCertificate.self_signed(NAMES, [], days=365)
    secret = secret_manifest("kustos-system", "kustos-webhook-cert", certificate)
    found = usable(secret, NAMES, dt.datetime.now(dt.UTC))
    assert found is not None and found.cert_pem == certificate.cert_pem and found.ca_pem == certificate.ca_pem
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}


def test_a_certificate_near_expiry_is_replaced() -> None:
    certificate = ServingCertificate.self_signed(NAMES, [], days=365)
    secret = secret_manifest("kustos-system", "s", certificate)
    later = certificate.not_after - RENEW_BEFORE + dt.timedelta(hours=1)
    assert usable(secret, NAMES, later) is None


def test_a_certificate_for_another_service_or_incomplete_is_replaced() -> None:
    other = ServingCertificate.self_signed(service_dns_names("elsewhere", "kustos-webhook"), [], days=365)
    now = dt.datetime.now(dt.UTC)
    assert usable(secret_manifest("kustos-system", "s", other), NAMES, now) is None
    secret = secret_manifest("kustos-system", "s", ServingCertificate.self_signed(NAMES, [], days=365))
    del secret["data"]["ca.crt"]
    assert usable(secret, NAMES, now) is None
    assert usable(None, NAMES, now) is None
