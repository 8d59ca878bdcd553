"""A kubeadm /etc/kubernetes made here: its three CAs (RSA 2048, as kubeadm makes them), every
certificate ``kubeadm certs renew all`` renews with kubeadm's subjects, usages and SANs, the
kubeconfigs with their client certificates embedded, and the static pod manifests' names."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from collections.abc import Mapping
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

SERVER, CLIENT = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
ETCD_NAMES = ("cp-1", "localhost", "127.0.0.1")
APISERVER_NAMES = (
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "localhost",
    "127.0.0.1",
    "10.96.0.1",
)
ADMINS = "kubeadm:cluster-admins"
# name -> (file or kubeconfig, CA, CN, O, usages, SANs)
LEAVES: dict[str, tuple[str, str, str, str | None, tuple[x509.ObjectIdentifier, ...], tuple[str, ...]]] = {
    "apiserver": ("pki/apiserver", "ca", "kube-apiserver", None, (SERVER,), APISERVER_NAMES),
    "apiserver-kubelet-client": ("pki/apiserver-kubelet-client", "ca", "kube-apiserver-kubelet-client",
                                 ADMINS, (CLIENT,), ()),
    "apiserver-etcd-client": ("pki/apiserver-etcd-client", "etcd/ca", "kube-apiserver-etcd-client", None,
                              (CLIENT,), ()),
    "front-proxy-client": ("pki/front-proxy-client", "front-proxy-ca", "front-proxy-client", None,
                           (CLIENT,), ()),
    "etcd-server": ("pki/etcd/server", "etcd/ca", "cp-1", None, (SERVER, CLIENT), ETCD_NAMES),
    "etcd-peer": ("pki/etcd/peer", "etcd/ca", "cp-1", None, (SERVER, CLIENT), ETCD_NAMES),
    "etcd-healthcheck-client": ("pki/etcd/healthcheck-client", "etcd/ca", "kube-etcd-healthcheck-client",
                                None, (CLIENT,), ()),
    "admin.conf": ("admin.conf", "ca", "kubernetes-admin", ADMINS, (CLIENT,), ()),
    "controller-manager.conf": ("controller-manager.conf", "ca", "system:kube-controller-manager", None,
                                (CLIENT,), ()),
    "scheduler.conf": ("scheduler.conf", "ca", "system:kube-scheduler", None, (CLIENT,), ()),
}  # fmt: skip
# digital signature and key encipherment (and certificate signing for the CAs), as kubeadm's
CA_USAGE = x509.KeyUsage(True, False, True, False, False, True, False, False, False)
LEAF_USAGE = x509.KeyUsage(True, False, True, False, False, False, False, False, False)
CAS = {"ca": "kubernetes", "front-proxy-ca": "front-proxy-ca", "etcd/ca": "etcd-ca"}


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org)] if org else []
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_layout(
    root: Path, now: dt.datetime, left: Mapping[str, dt.timedelta], server_url: str = "https://127.0.0.1:6443"
) -> None:
    """kubeadm's files under ``root``; each certificate expires ``left[name]`` from ``now``
    (default one year). The kubeconfigs point at ``server_url``."""
    pki = root / "pki"
    (pki / "etcd").mkdir(parents=True, exist_ok=True)
    (root / "manifests").mkdir(exist_ok=True)
    cas: dict[str, tuple[x509.Certificate, rsa.RSAPrivateKey]] = {}
    for base, cn in CAS.items():
        key = _key()
        cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )  # fmt: skip
        cas[base] = (cert, key)
        (pki / f"{base}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (pki / f"{base}.key").write_bytes(_key_pem(key))
    ca_pem = cas["ca"][0].public_bytes(serialization.Encoding.PEM)
    for name, (path, ca_base, cn, org, usages, sans) in LEAVES.items():
        ca_cert, ca_key = cas[ca_base]
        key = _key()
        expires = now + left.get(name, dt.timedelta(days=365))
        builder = (
            x509.CertificateBuilder().subject_name(_name(cn, org)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(min(now, expires) - dt.timedelta(days=1)).not_valid_after(expires)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(LEAF_USAGE, critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
        )  # fmt: skip
        if sans:
            names: list[x509.GeneralName] = []
            for san in sans:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(san)))
                except ValueError:
                    names.append(x509.DNSName(san))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert_pem = builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        if path.endswith(".conf"):
            (root / path).write_text(kubeconfig(server_url, ca_pem, cert_pem, _key_pem(key), cn))
        else:
            (root / f"{path}.crt").write_bytes(cert_pem)
            (root / f"{path}.key").write_bytes(_key_pem(key))
    key = _key()  # the service-account signing key pair (kubeadm's sa.key and sa.pub)
    (pki / "sa.key").write_bytes(_key_pem(key))
    (pki / "sa.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def kubeconfig(server: str, ca: bytes, cert: bytes, key: bytes, user: str) -> str:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return (
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n"
        f"    certificate-authority-data: {b64(ca)}\n    server: {server}\n  name: kubernetes\n"
        f"contexts:\n- context:\n    cluster: kubernetes\n    user: {user}\n  name: {user}@kubernetes\n"
        f"current-context: {user}@kubernetes\npreferences: {{}}\nusers:\n- name: {user}\n  user:\n"
        f"    client-certificate-data: {b64(cert)}\n    client-key-data: {b64(key)}\n"
    )
