"""Admission webhooks: AdmissionReview v1 handlers, their serving certificate, and the
webhook configurations that point the API server at them (caBundle kept current).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from kustos.runtime import certtool
from kustos.runtime.informer import ResourceRef

Obj = dict[str, Any]

VALIDATING = ResourceRef(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration", namespaced=False,
)  # fmt: skip
MUTATING = ResourceRef(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration", namespaced=False,
)  # fmt: skip


@dataclass(frozen=True)
class AdmissionResponse:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[Obj] | None = None
    warnings: tuple[str, ...] = ()

    @classmethod
    def allow(cls, *warnings: str) -> AdmissionResponse:
        return cls(True, warnings=warnings)

    @classmethod
    def deny(cls, message: str, code: int = 403) -> AdmissionResponse:
        return cls(False, message=message, code=code)

    @classmethod
    def mutate(cls, patch: list[Obj]) -> AdmissionResponse:
        """Allow with a JSON patch (RFC 6902) applied to the object."""
        return cls(True, patch=patch)

    def review(self, uid: str) -> Obj:
        response: Obj = {"uid": uid, "allowed": self.allowed}
        if not self.allowed:
            response["status"] = {"code": self.code, "message": self.message}
        if self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(self.patch).encode()).decode()
        if self.warnings:
            response["warnings"] = list(self.warnings)
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


AdmissionHandler = Callable[[Obj], Awaitable[AdmissionResponse]]


@dataclass
class Webhook:
    """One webhook: where it is served, what it intercepts, and its handler."""

    name: str  # a DNS-style name, e.g. vexample.example.kustos.dev
    path: str
    kind: Literal["validating", "mutating"]
    rules: list[Obj]
    handler: AdmissionHandler
    failure_policy: Literal["Fail", "Ignore"] = "Fail"
    namespace_selector: Obj | None = None
    object_selector: Obj | None = None
    timeout_seconds: int = 10
    side_effects: Literal["None", "NoneOnDryRun"] = "None"
    """NoneOnDryRun: the handler writes (records what it saw) except on a dry run."""
    configuration: str | None = None
    """The name of a configuration of its own, applied and removed by its family as its spec
    says (the pod image overrides: only while there are overrides); None: in the manager's
    shared configuration, applied once by the leader."""

    def configuration_entry(self, client_config: Obj) -> Obj:
        entry: Obj = {
            "name": self.name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": self.side_effects,
            "failurePolicy": self.failure_policy,
            "timeoutSeconds": self.timeout_seconds,
            "rules": self.rules,
            "clientConfig": client_config,
        }
        if self.namespace_selector is not None:
            entry["namespaceSelector"] = self.namespace_selector
        if self.object_selector is not None:
            entry["objectSelector"] = self.object_selector
        if self.kind == "mutating":
            entry["reinvocationPolicy"] = "IfNeeded"
        return entry


async def handle_review(webhook: Webhook, body: Obj) -> Obj:
    """Answer one AdmissionReview; a handler's exception becomes a clear denial, not a 500."""
    request = body.get("request") or {}
    uid = str(request.get("uid", ""))
    try:
        result = await webhook.handler(request)
    except Exception as err:
        result = AdmissionResponse.deny(f"{webhook.name}: internal error: {err}", code=500)
    return result.review(uid)


@dataclass
class ServingCertificate:
    """PEM certificate and key the webhook server presents, and the CA bundle that trusts it."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes
    not_after: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    @classmethod
    def from_files(cls, cert_file: Path, key_file: Path, ca_file: Path | None = None) -> ServingCertificate:
        cert = cert_file.read_bytes()
        facts = certtool.call({"op": "inspect", "cert": cert.decode()})
        if "error" in facts:
            raise ValueError(f"{cert_file}: {facts['error']}")
        ca = ca_file.read_bytes() if ca_file else cert
        return cls(cert, key_file.read_bytes(), ca, dt.datetime.fromisoformat(facts["not_after"]))

    @classmethod
    def self_signed(cls, dns_names: list[str], ips: list[str], days: int = 365) -> ServingCertificate:
        """A private CA and a serving certificate from it, made in a child process (certtool)."""
        made = certtool.call({"op": "generate", "dns_names": dns_names, "ips": ips, "days": days})
        return cls(
            cert_pem=made["cert"].encode(),
            key_pem=made["key"].encode(),
            ca_pem=made["ca"].encode(),
            not_after=dt.datetime.fromisoformat(made["not_after"]),
        )

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_pem).decode()


class CertificateSource(Protocol):
    """Where a running operator's serving certificate comes from (install/certs.py: the Secret its
    replicas share). The manager asks it every ``certificate_check_interval``; ``leader``: the
    caller also keeps the webhook configurations current, so it may rotate the CA."""

    async def current(self, leader: bool) -> ServingCertificate: ...


def webhook_configurations(
    name: str, webhooks: list[Webhook], ca_bundle: str, base_url: str | None = None,
    service: Obj | None = None,
) -> list[tuple[ResourceRef, Obj]]:  # fmt: skip
    """The Validating/MutatingWebhookConfiguration objects for ``webhooks``.

    Either ``base_url`` (the operator outside the cluster, as in the dev cluster) or
    ``service`` ({namespace, name, port}) says where the API server reaches us.

    No labels: the chart owns these objects and their ``app.kubernetes.io/managed-by: Helm``;
    a label of ours would make every later ``helm upgrade`` fail on a server-side apply
    conflict.
    """
    result: list[tuple[ResourceRef, Obj]] = []
    for kind, ref in (("validating", VALIDATING), ("mutating", MUTATING)):
        chosen = [w for w in webhooks if w.kind == kind]
        if not chosen:
            continue
        entries = []
        for webhook in chosen:
            client_config: Obj = {"caBundle": ca_bundle}
            if base_url:
                client_config["url"] = base_url.rstrip("/") + webhook.path
            elif service:
                client_config["service"] = {**service, "path": webhook.path}
            entries.append(webhook.configuration_entry(client_config))
        obj = {
            "apiVersion": ref.api_version,
            "kind": ref.kind,
            "metadata": {"name": name},
            "webhooks": entries,
        }
        result.append((ref, obj))
    return result
