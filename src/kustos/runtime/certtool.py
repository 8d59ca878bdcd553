"""Webhook certificates made and read in a short-lived child process.

``cryptography`` costs about 11 MiB resident once loaded, and a Python process never
gives that back: an operator that generated its webhook certificate in-process would
carry it for its whole life (measured in docs/benchmarks.md). The operator only needs
PEM bytes and two facts about a certificate (its expiry and DNS names), so this module
runs as ``python -m kustos.runtime.certtool`` with a JSON request on stdin and prints a
JSON answer; the parent never imports cryptography for its webhooks.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import subprocess
import sys
from typing import Any

TIMEOUT = 60.0


class CertToolError(RuntimeError):
    """The child process failed; its stderr says why."""


def call(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request in a child process and return its answer."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kustos.runtime.certtool"],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            check=False,
            timeout=TIMEOUT,
        )
    except subprocess.TimeoutExpired as err:
        raise CertToolError(f"certificate tool timed out after {TIMEOUT:.0f}s") from err
    if done.returncode != 0:
        raise CertToolError(f"certificate tool failed: {done.stderr.strip()[-500:]}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def generate(dns_names: list[str], ips: list[str], days: int) -> dict[str, str]:
    """A private CA and a serving certificate from it (PEM strings and the expiry)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    not_after = now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kustos-webhook-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (dns_names or ips)[0])]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    return {
        "cert": cert.public_bytes(pem).decode(),
        "key": key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        "ca": ca.public_bytes(pem).decode(),
        "not_after": not_after.isoformat(),
    }


def inspect(cert_pem: str) -> dict[str, Any]:
    """A certificate's expiry and DNS names; ``{"error": ...}`` when it does not parse."""
    from cryptography import x509

    try:
        parsed = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError as err:
        return {"error": f"not a PEM certificate: {err}"}
    try:
        san = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = san.get_values_for_type(x509.DNSName)
        ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        dns_names, ips = [], []
    return {"not_after": parsed.not_valid_after_utc.isoformat(), "dns_names": dns_names, "ips": ips}


def _answer(request: dict[str, Any]) -> dict[str, Any]:
    if request["op"] == "generate":
        return generate(list(request["dns_names"]), list(request["ips"]), int(request["days"]))
    if request["op"] == "inspect":
        return inspect(str(request["cert"]))
    raise ValueError(f"unknown operation {request['op']!r}")


if __name__ == "__main__":
    json.dump(_answer(json.load(sys.stdin)), sys.stdout)
