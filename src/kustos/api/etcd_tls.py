"""TLS of an EtcdCluster: spec and status (SPEC F-ETCD-10)."""

from __future__ import annotations

from pydantic import Field

from kustos.api.common import Duration
from kustos.runtime.crd import KubeModel, list_map

RENEW_ANNOTATION = "kustos.dev/renew-certificates"
"""Set (or change) this annotation on an EtcdCluster to renew every certificate now."""


class TLSSecrets(KubeModel):
    """Certificates the user provides, as Secrets with keys tls.crt, tls.key and ca.crt."""

    peer: str = Field(min_length=1)
    """Members' peer certificate: valid for every member's peer address, with both the
    serverAuth and clientAuth usages; its ca.crt is the CA peers must be signed by."""
    server: str = Field(min_length=1)
    """The certificate members serve clients: valid for the client Service and the
    members' addresses, with serverAuth and clientAuth (etcd's gateway presents it to
    etcd itself); its ca.crt is the CA client certificates must be signed by."""
    operator_client: str = Field(min_length=1)
    """The client certificate the operator (and its backup pods) use; its ca.crt is the
    CA that signed the server certificate."""


class TLSSpec(KubeModel):
    """Peer and client TLS. Without ``secrets`` the operator runs a CA per cluster."""

    secrets: TLSSecrets | None = None
    """Use these Secrets instead of certificates the operator issues. Replacing their
    contents restarts members one at a time onto the new certificates."""
    lifetime: Duration = "2160h"
    """How long certificates the operator issues are valid (default 90 days)."""
    renew_before_percent: int = Field(default=33, ge=1, le=90)
    """Renew a certificate once less than this share of its lifetime is left."""


class CertificateStatus(KubeModel):
    """One certificate in use."""

    name: str
    """The Secret holding it."""
    pod: str = ""
    """The member pod it belongs to (empty for the CA and client certificates)."""
    serial: str = ""
    """Its serial number, in hex."""
    not_after: str = ""
    """When it expires (RFC 3339)."""
    renew_after: str = ""
    """When the operator renews it (RFC 3339)."""


class CARotationStatus(KubeModel):
    """The CA's rotation under way, or the last one (RFC 3339 times)."""

    phase: str | None = None
    """Trust (members restart to trust old and new CA), Reissue (onto leaves of the new CA),
    Drop (to trust the new CA only); absent once done."""
    reason: str = ""
    """Why it rotates: the rotate-ca annotation, or the CA's expiry."""
    started: str = ""
    """When the new CA was made."""
    phase_started: str = ""
    """When the current phase began."""
    old_ca_dropped: str = ""
    """When the old CA left the CA Secret (members then restart without it)."""
    completed: str = ""
    """When every member trusted the new CA only."""


class TLSStatus(KubeModel):
    """The certificates the members and the operator use."""

    certificates: list[CertificateStatus] = Field(default_factory=list, json_schema_extra=list_map("name"))
    """Every certificate: the CA, the operator's client certificate and each member's."""
    renewing: bool = False
    """A rolling restart onto renewed certificates is under way."""
    renewal_request: str | None = None
    """The value of the renew-certificates annotation the certificates were issued under."""
    ca_rotation: CARotationStatus | None = None
    """The CA's rotation (operator-issued certificates only)."""
