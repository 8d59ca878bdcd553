"""Certificates for etcd members, the operator and users (pure: no I/O, time is an input).

A cluster's certificates come from its own CA (ECDSA P-256, SHA-256). Every member
gets one certificate for both its listeners (peer and client) with both usages:

* serverAuth: peers and clients verify it against the name or IP they dialled;
* clientAuth: it is also the client certificate a member presents to its peers, and
  etcd's gRPC gateway presents it to its own gRPC server.

Its names are those anybody may dial it by: the pod under the peer Service and the
client Service, each with and without ``.cluster.local``; its pod IP when known; and
``localhost``/``127.0.0.1`` for tools inside the pod (as kubeadm does for etcd).
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Certificates are valid a little before they are issued: clocks of members differ.
BACKDATE = timedelta(minutes=5)
CA_LIFETIME = timedelta(days=3650)
CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes


@dataclass(frozen=True)
class CertInfo:
    """What the operator needs to know of an issued certificate."""

    serial: str  # hex
    not_before: datetime
    not_after: datetime
    dns_names: tuple[str, ...]
    ips: tuple[str, ...]
    issuer_fingerprint: str  # sha256 of the issuer's subject, to tell CAs apart cheaply
    common_name: str

    @property
    def lifetime(self) -> timedelta:
        return self.not_after - self.not_before


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _key_usage(ca: bool) -> x509.KeyUsage:
    """Signatures only; a CA also signs certificates and revocation lists."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _name(common_name: str) -> x509.Name:
    """``O=kustos``, with ``CN`` unless it is empty (the operator's client certificate)."""
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kustos")]
    if common_name:
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def new_ca(common_name: str, now: datetime, lifetime: timedelta = CA_LIFETIME) -> KeyPair:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = _new_key()
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(
    ca: KeyPair,
    common_name: str,
    now: datetime,
    lifetime: timedelta,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    server: bool = True,
    client: bool = True,
) -> KeyPair:
    """A leaf certificate signed by ``ca``; never valid beyond the CA itself."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key must be an ECDSA key")
    key = _new_key()
    not_after = min(now + lifetime, ca_cert.not_valid_after_utc)
    # Backdated by at most a tenth of the lifetime: renewal is a share of the whole validity,
    # which a fixed backdate would dwarf for short lifetimes (and renew at once).
    backdate = min(BACKDATE, lifetime / 10)
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
    usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - backdate)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys(dns_names)]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in dict.fromkeys(ips)]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def info(pem: bytes) -> CertInfo:
    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in san.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns, ips = (), ()
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return CertInfo(
        serial=format(cert.serial_number, "x"),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        dns_names=dns,
        ips=ips,
        issuer_fingerprint=hashlib.sha256(cert.issuer.public_bytes()).hexdigest(),
        common_name=str(names[0].value) if names else "",
    )


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether ``ca`` signed ``cert`` (a signature check, not a name comparison)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def member_names(cluster: str, namespace: str, pod: str) -> tuple[str, ...]:
    """Every DNS name a member may be dialled by (peers and clients, short and long forms)."""
    peer = f"{pod}.{cluster}-peer.{namespace}.svc"
    service = f"{cluster}-client"
    return (
        peer,
        f"{peer}.{CLUSTER_DOMAIN}",
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}",
        "localhost",
    )


def member_ips(pod_ip: str | None) -> tuple[str, ...]:
    return (pod_ip, "127.0.0.1") if pod_ip else ("127.0.0.1",)


def needs_renewal(cert: CertInfo, now: datetime, renew_before_percent: int) -> bool:
    """Renew once less than ``renew_before_percent`` of the certificate's lifetime is left."""
    left = cert.not_after - now
    return left <= cert.lifetime * (renew_before_percent / 100)


def renewal_due(cert: CertInfo, renew_before_percent: int) -> datetime:
    """When ``needs_renewal`` turns true."""
    return cert.not_after - cert.lifetime * (renew_before_percent / 100)


def ca_usable(ca: CertInfo, now: datetime, leaf_lifetime: timedelta) -> bool:
    """A CA is reused while it outlives a new leaf certificate by a full leaf lifetime."""
    return ca.not_after - now >= 2 * leaf_lifetime


def split_bundle(bundle: bytes) -> list[bytes]:
    """The certificates of a PEM bundle (a ca.crt that trusts more than one CA), each as PEM."""
    return [
        cert.public_bytes(serialization.Encoding.PEM) for cert in x509.load_pem_x509_certificates(bundle)
    ] if bundle.strip() else []  # fmt: skip


def ca_id(pem: bytes) -> str:
    """Who a CA is: a digest of its certificate (two CAs of the same name differ)."""
    der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()[:16]


def bundle_ids(bundle: bytes) -> frozenset[str]:
    """The CAs a ca.crt bundle trusts."""
    return frozenset(ca_id(pem) for pem in split_bundle(bundle))


def issuer_in(cert_pem: bytes, cas: list[bytes]) -> str | None:
    """Which of ``cas`` signed ``cert`` (its ``ca_id``), or None."""
    return next((ca_id(ca) for ca in cas if signed_by(cert_pem, ca)), None)


def fingerprint(*parts: bytes) -> str:
    """A short digest of certificate material, to notice when a user replaces a Secret."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]
