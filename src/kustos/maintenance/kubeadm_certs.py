"""kubeadm's control-plane certificates on one node: what expires when, and their renewal.

The set is what ``kubeadm certs renew all`` renews (kubeadm's renewal manager): the API
server's serving and client certificates, etcd's, the front proxy's client, and the client
certificates embedded in the kubeconfigs (admin.conf, super-admin.conf, controller-manager.conf,
scheduler.conf). A renewal keeps the private key, the subject and every extension (the SANs
above all), and signs a new validity with the existing CA; kubeadm is not on the nodes kustos
runs on, and a renewal needs nothing of it but this.

After a renewal the components that read their certificates only at start are restarted as
kubeadm's documentation says: the static pod's manifest moved out of the manifests directory,
a wait (the kubelet looks every 20 s, fileCheckFrequency), and moved back. Like EKCO, etcd
is not restarted: it reads its certificates on every new connection.

File I/O and the certificate arithmetic; the decision of which node when is in
``certrotation``, the node pod that runs this in ``certs_cli``.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

VALIDITY = dt.timedelta(days=365)
"""kubeadm's default certificateValidityPeriod; never beyond the CA's own expiry."""
BACKDATE = dt.timedelta(minutes=5)
"""Valid a little before now: clocks of the control-plane nodes differ."""

CA, FRONT_PROXY_CA, ETCD_CA = "ca", "front-proxy-ca", "etcd/ca"
APISERVER, CONTROLLER_MANAGER, SCHEDULER = "kube-apiserver", "kube-controller-manager", "kube-scheduler"


@dataclass(frozen=True)
class Kind:
    """One certificate kubeadm renews: where it is, its CA, and the static pod reading it at start."""

    name: str
    """kubeadm's name for it (``kubeadm certs check-expiration``)."""
    path: str
    """Relative to the kubernetes directory: pki/<base>.crt, or a kubeconfig."""
    ca: str
    """The CA's base name under pki/."""
    restarts: str | None
    """The static pod (its manifest's base name) to restart after a renewal."""

    @property
    def kubeconfig(self) -> bool:
        return self.path.endswith(".conf")


KINDS: tuple[Kind, ...] = (
    Kind("admin.conf", "admin.conf", CA, None),
    Kind("super-admin.conf", "super-admin.conf", CA, None),
    Kind("apiserver", "pki/apiserver.crt", CA, APISERVER),
    Kind("apiserver-etcd-client", "pki/apiserver-etcd-client.crt", ETCD_CA, APISERVER),
    Kind("apiserver-kubelet-client", "pki/apiserver-kubelet-client.crt", CA, APISERVER),
    Kind("controller-manager.conf", "controller-manager.conf", CA, CONTROLLER_MANAGER),
    Kind("etcd-healthcheck-client", "pki/etcd/healthcheck-client.crt", ETCD_CA, None),
    Kind("etcd-peer", "pki/etcd/peer.crt", ETCD_CA, None),
    Kind("etcd-server", "pki/etcd/server.crt", ETCD_CA, None),
    Kind("front-proxy-client", "pki/front-proxy-client.crt", FRONT_PROXY_CA, APISERVER),
    Kind("scheduler.conf", "scheduler.conf", CA, SCHEDULER),
)
"""kubeadm's list; the API server last of the restarts (see ``restart_order``)."""


@dataclass(frozen=True)
class Expiry:
    """One certificate found on the node."""

    kind: Kind
    not_after: dt.datetime
    serial: int

    def left(self, now: dt.datetime) -> dt.timedelta:
        return self.not_after - now

    def due(self, now: dt.datetime, threshold: dt.timedelta) -> bool:
        """Renewed once it expires within ``threshold`` (EKCO's rotate_certs_ttl)."""
        return self.left(now) <= threshold


class RenewalError(Exception):
    """A certificate that cannot be renewed here (an external CA, an unreadable file)."""


_CLIENT_CERT = re.compile(r"(client-certificate-data:\s*)(\S+)")


def _cert_pem(root: Path, kind: Kind) -> bytes:
    """The certificate as PEM: the file, or the first client certificate of a kubeconfig."""
    text = (root / kind.path).read_bytes()
    if not kind.kubeconfig:
        return text
    match = _CLIENT_CERT.search(text.decode())
    if match is None:
        raise RenewalError(
            f"{kind.path}: no client-certificate-data (a certificate file kubeadm did not embed)"
        )
    return base64.b64decode(match.group(2))


def expiries(root: Path) -> list[Expiry]:
    """Every kubeadm certificate present under ``root`` (absent ones, like etcd's with an
    external etcd or super-admin.conf before Kubernetes 1.29, are skipped as kubeadm does)."""
    found = []
    for kind in KINDS:
        if not (root / kind.path).exists():
            continue
        cert = x509.load_pem_x509_certificate(_cert_pem(root, kind))
        found.append(Expiry(kind, cert.not_valid_after_utc, cert.serial_number))
    return found


def renewed(
    cert_pem: bytes,
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    now: dt.datetime,
    validity: dt.timedelta = VALIDITY,
) -> bytes:
    """The same certificate (key, subject, extensions) with a new serial and validity, signed by
    the CA; never valid beyond the CA itself."""
    old = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        raise RenewalError(f"the CA key is a {type(ca_key).__name__}, not RSA, ECDSA or Ed25519")
    if old.issuer != ca.subject:
        raise RenewalError(
            f"issued by {old.issuer.rfc4514_string()}, not by this CA ({ca.subject.rfc4514_string()})"
        )
    if ca.not_valid_after_utc <= now:
        raise RenewalError(f"the CA {ca.subject.rfc4514_string()} expired at {ca.not_valid_after_utc}")
    builder = (
        x509.CertificateBuilder()
        .subject_name(old.subject)
        .issuer_name(ca.subject)
        .public_key(old.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + validity, ca.not_valid_after_utc))
    )
    for extension in old.extensions:
        if isinstance(extension.value, x509.AuthorityKeyIdentifier):
            continue  # named anew from the CA below
        builder = builder.add_extension(extension.value, extension.critical)
    builder = builder.add_extension(
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
        critical=False,
    )
    algorithm = None if isinstance(ca_key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(ca_key, algorithm).public_bytes(serialization.Encoding.PEM)


def replace_file(path: Path, data: bytes) -> None:
    """Write then rename, keeping the mode: a component never reads half a certificate."""
    mode = path.stat().st_mode & 0o777
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
        out.write(data)
        out.flush()
        os.fchmod(out.fileno(), mode)
        os.fsync(out.fileno())
    Path(out.name).replace(path)


def renew(root: Path, kind: Kind, now: dt.datetime, validity: dt.timedelta = VALIDITY) -> Expiry:
    """Renew one certificate in place (a kubeconfig's embedded one in its text); its new expiry."""
    pki = root / "pki"
    try:
        ca_cert = (pki / f"{kind.ca}.crt").read_bytes()
        ca_key = (pki / f"{kind.ca}.key").read_bytes()
    except FileNotFoundError as err:
        raise RenewalError(f"{kind.name}: no CA key at {err.filename} (an external CA renews it)") from err
    old = _cert_pem(root, kind)
    try:
        new = renewed(old, ca_cert, ca_key, now, validity)
    except RenewalError as err:
        raise RenewalError(f"{kind.name}: {err}") from err
    path = root / kind.path
    if kind.kubeconfig:
        text = path.read_text()
        old_data = _CLIENT_CERT.search(text)
        assert old_data is not None  # _cert_pem found it
        start, end = old_data.span(2)
        replace_file(path, (text[:start] + base64.b64encode(new).decode() + text[end:]).encode())
    else:
        replace_file(path, new)
    cert = x509.load_pem_x509_certificate(new)
    return Expiry(kind, cert.not_valid_after_utc, cert.serial_number)


def restart_order(renewed_kinds: Iterable[Kind]) -> list[str]:
    """The static pods to restart, the API server last: the others reach it again at once."""
    pods = {k.restarts for k in renewed_kinds if k.restarts is not None}
    return sorted(pods, key=lambda pod: (pod == APISERVER, pod))


def describe(found: Sequence[Expiry], now: dt.datetime, threshold: dt.timedelta) -> list[str]:
    """One line per certificate, as ``kustos maintenance certs --dry-run`` prints them."""
    lines = []
    for expiry in sorted(found, key=lambda e: e.not_after):
        left = expiry.left(now)
        days = f"{left.days}d" if left >= dt.timedelta(0) else "EXPIRED"
        mark = "renew" if expiry.due(now, threshold) else "keep"
        lines.append(
            f"{expiry.kind.name:<26} {expiry.not_after.isoformat(timespec='seconds')}  {days:>8}  {mark}"
        )
    return lines
