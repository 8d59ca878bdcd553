"""The webhook serving certificate of an operator installed in a cluster, shared by its replicas.

Every replica serves the webhooks (the Service picks any of them) but only the leader writes
the CA bundle into the webhook configurations: so all replicas must present certificates from
the same CA. The first replica to start generates a CA and a certificate for the webhook
Service's DNS names and creates a Secret with them; every other replica, and every restart,
reads that Secret. A certificate that expires within ``RENEW_BEFORE`` (or names another
Service) is replaced at the next start, guarded by the Secret's resourceVersion so that two
replicas starting together agree on one.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from typing import Any

from kustos.runtime import certtool
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.resources import SECRETS
from kustos.runtime.webhook import ServingCertificate

log = logging.getLogger(__name__)

VALIDITY_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)
ATTEMPTS = 5

Obj = dict[str, Any]


def service_dns_names(namespace: str, name: str) -> list[str]:
    """The names the API server may use for a Service (it uses ``<name>.<namespace>.svc``)."""
    return [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}", name]


def _decode(secret: Obj, key: str) -> bytes:
    return base64.b64decode((secret.get("data") or {}).get(key) or "")


def usable(secret: Obj | None, dns_names: list[str], now: dt.datetime) -> ServingCertificate | None:
    """The certificate in ``secret`` if it is complete, valid long enough, and names our Service."""
    if secret is None:
        return None
    cert, key, ca = _decode(secret, "tls.crt"), _decode(secret, "tls.key"), _decode(secret, "ca.crt")
    if not (cert and key and ca):
        return None
    facts = certtool.call({"op": "inspect", "cert": cert.decode(errors="replace")})
    if "error" in facts or not set(dns_names) <= set(facts["dns_names"]):
        return None
    not_after = dt.datetime.fromisoformat(facts["not_after"])
    if not_after - now < RENEW_BEFORE:
        return None
    return ServingCertificate(cert, key, ca, not_after)


def secret_manifest(namespace: str, name: str, certificate: ServingCertificate) -> Obj:
    def encode(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "kustos", "app.kubernetes.io/component": "webhook"},
        },
        "data": {
            "tls.crt": encode(certificate.cert_pem),
            "tls.key": encode(certificate.key_pem),
            "ca.crt": encode(certificate.ca_pem),
        },
    }


async def shared_certificate(
    api: Api, namespace: str, secret_name: str, dns_names: list[str]
) -> ServingCertificate:
    """The certificate every replica serves with: read from the Secret, or made and stored there."""
    for _ in range(ATTEMPTS):
        secret = await api.get(SECRETS, namespace, secret_name)
        found = usable(secret, dns_names, dt.datetime.now(dt.UTC))
        if found is not None:
            return found
        fresh = ServingCertificate.self_signed(dns_names, [], days=VALIDITY_DAYS)
        manifest = secret_manifest(namespace, secret_name, fresh)
        try:
            if secret is None:
                await api.create(SECRETS, manifest)
            else:
                # Replace only the version we judged unusable: a replica that renewed it first wins.
                guard = {"metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]}}
                await api.patch(SECRETS, namespace, secret_name, {**guard, "data": manifest["data"]})
        except ApiStatusError as err:
            if err.conflict:
                continue  # another replica stored one first: read theirs
            raise
        log.info("webhook certificate generated, valid until %s, in Secret %s/%s",
                 fresh.not_after.date(), namespace, secret_name)  # fmt: skip
        return fresh
    raise RuntimeError(f"could not agree on the webhook certificate in Secret {namespace}/{secret_name}")


__all__ = ["secret_manifest", "service_dns_names", "shared_certificate", "usable"]
