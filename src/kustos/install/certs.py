"""The webhook serving certificate of an operator installed in a cluster, shared by its replicas.

Every replica serves the webhooks (the Service picks any of them) but only the leader writes
the CA bundle into the webhook configurations: so all replicas must present certificates from
the same CA. The first replica to start generates a CA and a certificate for the webhook
Service's DNS names and creates a Secret with them; every other replica, and every restart,
reads that Secret. A certificate that expires within ``RENEW_BEFORE`` (or names another
Service) is replaced at the next start, guarded by the Secret's resourceVersion so that two
replicas starting together agree on one.

While the operator runs, the leader rotates the CA before the certificate expires (within
``RENEW_BEFORE``) or when asked (``kustos.dev/rotate-ca`` on the Secret), one step per pass
with the state in the Secret, so a new leader carries on where the last one stopped:

1. trust: a new CA and certificate are stored beside the served ones (``next.*``) and
   ``ca.crt`` becomes the bundle of old and new CA, which the leader writes into the webhook
   configurations; every replica still serves the old certificate.
2. serve: the new certificate becomes ``tls.crt``/``tls.key``; each replica loads it into its
   TLS context at its next check (no restart), and both CAs are still trusted meanwhile.
3. drop: ``ca.crt`` becomes the new CA alone.

Each step waits ``settle`` after the previous one, long enough for every replica to have
read the Secret and the API server to have seen the configurations.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import logging
from enum import StrEnum
from typing import Any

from kustos.etcd.carotation import ROTATE_CA_ANNOTATION
from kustos.runtime import certtool
from kustos.runtime.api import Api, ApiStatusError
from kustos.runtime.resources import SECRETS
from kustos.runtime.times import parse_rfc3339, rfc3339
from kustos.runtime.webhook import ServingCertificate

log = logging.getLogger(__name__)

VALIDITY_DAYS = 365
RENEW_BEFORE = dt.timedelta(days=30)
ATTEMPTS = 5

Obj = dict[str, Any]

NEXT_CERT, NEXT_KEY, NEXT_CA = "next.crt", "next.key", "next-ca.crt"
STEP_AT_ANNOTATION = "kustos.dev/webhook-ca-step-at"
ROTATED_FOR_ANNOTATION = "kustos.dev/webhook-ca-rotated-for"


class Step(StrEnum):
    TRUST = "trust"
    SERVE = "serve"
    DROP = "drop"


def service_dns_names(namespace: str, name: str) -> list[str]:
    """The names the API server may use for a Service (it uses ``<name>.<namespace>.svc``)."""
    return [f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}", name]


def _decode(secret: Obj, key: str) -> bytes:
    return base64.b64decode((secret.get("data") or {}).get(key) or "")


@functools.lru_cache(maxsize=8)
def _inspect(cert_pem: str) -> dict[str, Any]:
    """A certificate's facts, read once: running replicas check the Secret every interval, and
    each read would otherwise start a child process (certtool)."""
    return certtool.call({"op": "inspect", "cert": cert_pem})


def usable(
    secret: Obj | None, dns_names: list[str], now: dt.datetime, ips: list[str] | None = None
) -> ServingCertificate | None:
    """The certificate in ``secret`` if it is complete, not expired, and names our Service (or
    address). One near its expiry is kept: the leader rotates it without a gap (``rotation_step``).
    """
    if secret is None:
        return None
    cert, key, ca = _decode(secret, "tls.crt"), _decode(secret, "tls.key"), _decode(secret, "ca.crt")
    if not (cert and key and ca):
        return None
    facts = _inspect(cert.decode(errors="replace"))
    if "error" in facts or not set(dns_names) <= set(facts["dns_names"]):
        return None
    if not set(ips or []) <= set(facts.get("ips", [])):
        return None
    not_after = dt.datetime.fromisoformat(facts["not_after"])
    if not_after <= now:
        return None
    return ServingCertificate(cert, key, ca, not_after)


def rotation_step(secret: Obj, not_after: dt.datetime, now: dt.datetime, settle: dt.timedelta) -> Step | None:
    """The next step of the CA rotation (module docstring) the leader may take now, if any."""
    data = secret.get("data") or {}
    notes = secret.get("metadata", {}).get("annotations") or {}
    if data.get(NEXT_CA):
        since = parse_rfc3339(notes.get(STEP_AT_ANNOTATION))
        if since is not None and now - since < settle:
            return None
        return Step.SERVE if data.get(NEXT_CERT) else Step.DROP
    requested = notes.get(ROTATE_CA_ANNOTATION, "")
    if requested and requested != notes.get(ROTATED_FOR_ANNOTATION, ""):
        return Step.TRUST
    return Step.TRUST if not_after - now < RENEW_BEFORE else None


def rotation_patch(step: Step, secret: Obj, now: dt.datetime, fresh: ServingCertificate | None = None) -> Obj:
    """The merge patch that takes ``step`` on ``secret``, guarded by its resourceVersion so that
    a step is taken once even if leadership changed hands meanwhile."""
    data = secret.get("data") or {}
    notes = secret.get("metadata", {}).get("annotations") or {}
    metadata: Obj = {"resourceVersion": secret["metadata"]["resourceVersion"]}
    if step is Step.TRUST:
        assert fresh is not None
        bundle = _decode(secret, "ca.crt").rstrip(b"\n") + b"\n" + fresh.ca_pem
        changes: dict[str, str | None] = {
            NEXT_CERT: _encode(fresh.cert_pem), NEXT_KEY: _encode(fresh.key_pem),
            NEXT_CA: _encode(fresh.ca_pem), "ca.crt": _encode(bundle),
        }  # fmt: skip
        metadata["annotations"] = {
            STEP_AT_ANNOTATION: rfc3339(now),
            ROTATED_FOR_ANNOTATION: notes.get(ROTATE_CA_ANNOTATION) or notes.get(ROTATED_FOR_ANNOTATION),
        }
    elif step is Step.SERVE:
        changes = {"tls.crt": data[NEXT_CERT], "tls.key": data[NEXT_KEY], NEXT_CERT: None, NEXT_KEY: None}
        metadata["annotations"] = {STEP_AT_ANNOTATION: rfc3339(now)}
    else:
        changes = {"ca.crt": data[NEXT_CA], NEXT_CA: None}
        metadata["annotations"] = {STEP_AT_ANNOTATION: None}
    return {"metadata": metadata, "data": changes}


def _encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def secret_manifest(namespace: str, name: str, certificate: ServingCertificate) -> Obj:
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
            "tls.crt": _encode(certificate.cert_pem),
            "tls.key": _encode(certificate.key_pem),
            "ca.crt": _encode(certificate.ca_pem),
        },
    }


async def shared_certificate(
    api: Api, namespace: str, secret_name: str, dns_names: list[str], ips: list[str] | None = None
) -> ServingCertificate:
    """The certificate every replica serves with: read from the Secret, or made and stored there."""
    for _ in range(ATTEMPTS):
        secret = await api.get(SECRETS, namespace, secret_name)
        found = usable(secret, dns_names, dt.datetime.now(dt.UTC), ips)
        if found is not None:
            return found
        fresh = ServingCertificate.self_signed(dns_names, ips or [], days=VALIDITY_DAYS)
        manifest = secret_manifest(namespace, secret_name, fresh)
        try:
            if secret is None:
                await api.create(SECRETS, manifest)
            else:
                # Replace only the version we judged unusable: a replica that renewed it first wins.
                # A rotation it was in the middle of is abandoned with it.
                guard = {"resourceVersion": secret["metadata"]["resourceVersion"],
                         "annotations": {STEP_AT_ANNOTATION: None}}  # fmt: skip
                data = {NEXT_CERT: None, NEXT_KEY: None, NEXT_CA: None, **manifest["data"]}
                await api.patch(SECRETS, namespace, secret_name, {"metadata": guard, "data": data})
        except ApiStatusError as err:
            if err.conflict:
                continue  # another replica stored one first: read theirs
            raise
        log.info("webhook certificate generated, valid until %s, in Secret %s/%s",
                 fresh.not_after.date(), namespace, secret_name)  # fmt: skip
        return fresh
    raise RuntimeError(f"could not agree on the webhook certificate in Secret {namespace}/{secret_name}")


class SharedCertificate:
    """The Secret as the manager's ``CertificateSource``: every replica reads it; the leader
    also takes the rotation's next step when it is due."""

    def __init__(
        self, api: Api, namespace: str, secret_name: str, dns_names: list[str], ips: list[str],
        settle: dt.timedelta,
    ) -> None:  # fmt: skip
        self.api, self.namespace, self.secret_name = api, namespace, secret_name
        self.dns_names, self.ips, self.settle = dns_names, ips, settle

    async def current(self, leader: bool) -> ServingCertificate:
        for _ in range(ATTEMPTS):
            secret = await self.api.get(SECRETS, self.namespace, self.secret_name)
            now = dt.datetime.now(dt.UTC)
            found = usable(secret, self.dns_names, now, self.ips)
            if secret is None or found is None:
                return await shared_certificate(
                    self.api, self.namespace, self.secret_name, self.dns_names, self.ips
                )
            step = rotation_step(secret, found.not_after, now, self.settle) if leader else None
            if step is None:
                return found
            fresh = (
                ServingCertificate.self_signed(self.dns_names, self.ips, VALIDITY_DAYS)
                if step is Step.TRUST
                else None
            )
            try:
                await self.api.patch(
                    SECRETS, self.namespace, self.secret_name, rotation_patch(step, secret, now, fresh)
                )
            except ApiStatusError as err:
                if err.conflict:
                    continue  # changed meanwhile (a user's request, another leader): judge again
                raise
            log.info(
                "webhook CA rotation: %s step taken in Secret %s/%s", step, self.namespace, self.secret_name
            )
        raise RuntimeError(
            f"could not read the webhook certificate in Secret {self.namespace}/{self.secret_name}"
        )


__all__ = [
    "SharedCertificate",
    "Step",
    "rotation_patch",
    "rotation_step",
    "secret_manifest",
    "service_dns_names",
    "shared_certificate",
    "usable",
]
