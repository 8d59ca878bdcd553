"""kubeadm's certificates renewed in a kubeadm layout made with real keys: near expiry renewed
(same key, subject and SANs, a new NotAfter, signed by the same CA), the rest untouched."""

from __future__ import annotations

import base64
import datetime as dt
import re
import shutil
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from typer.testing import CliRunner

from kustos.cli import app
from kustos.maintenance import kubeadm_certs
from tests.kubeadm_support import make_layout

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
"""The layout's certificates expire relative to the real time: the CLI's dry run reads the
clock (a fixed date here made its 48 h threshold test fail from the day after it)."""
KINDS = {k.name: k for k in kubeadm_certs.KINDS}


def cert_of(root: Path, name: str) -> x509.Certificate:
    kind = KINDS[name]
    data = (root / kind.path).read_bytes()
    if kind.kubeconfig:
        found = re.search(rb"client-certificate-data: (\S+)", data)
        assert found is not None
        data = base64.b64decode(found.group(1))
    return x509.load_pem_x509_certificate(data)


def public(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Made once (RSA keys take a while), copied for each test."""
    root = tmp_path_factory.mktemp("kubeadm")
    make_layout(root, NOW, {"apiserver": dt.timedelta(days=3), "admin.conf": dt.timedelta(days=10),
                            "etcd-peer": dt.timedelta(days=-1)})  # fmt: skip
    return root


@pytest.fixture
def layout(made: Path, tmp_path: Path) -> Path:
    shutil.copytree(made, tmp_path / "kubernetes")
    return tmp_path / "kubernetes"


def test_every_kubeadm_certificate_is_found_with_its_expiry(layout: Path) -> None:
    found = {e.kind.name: e for e in kubeadm_certs.expiries(layout)}
    assert set(found) == set(KINDS) - {"super-admin.conf"}  # before Kubernetes 1.29 there is none
    assert found["apiserver"].left(NOW) == dt.timedelta(days=3)
    due = {name for name, e in found.items() if e.due(NOW, dt.timedelta(days=30))}
    assert due == {"apiserver", "admin.conf", "etcd-peer"}


@pytest.mark.parametrize("name", ["apiserver", "admin.conf", "etcd-peer", "front-proxy-client"])
def test_a_renewal_keeps_key_subject_and_extensions(layout: Path, name: str) -> None:
    old = cert_of(layout, name)
    kubeadm_certs.renew(layout, KINDS[name], NOW)
    new = cert_of(layout, name)
    assert new.not_valid_after_utc == NOW + kubeadm_certs.VALIDITY
    assert new.serial_number != old.serial_number
    assert public(new) == public(old)
    assert new.subject == old.subject
    sans = x509.SubjectAlternativeName
    if name in {"apiserver", "etcd-peer"}:
        assert (
            new.extensions.get_extension_for_class(sans).value
            == old.extensions.get_extension_for_class(sans).value
        )
    assert new.extensions.get_extension_for_class(
        x509.ExtendedKeyUsage
    ) == old.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    ca = x509.load_pem_x509_certificate((layout / "pki" / f"{KINDS[name].ca}.crt").read_bytes())
    new.verify_directly_issued_by(ca)


def test_a_kubeconfig_keeps_everything_but_its_certificate(layout: Path) -> None:
    before = (layout / "admin.conf").read_text().splitlines()
    kubeadm_certs.renew(layout, KINDS["admin.conf"], NOW)
    after = (layout / "admin.conf").read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and "client-certificate-data" in changed[0][0]


def test_never_beyond_the_ca(layout: Path) -> None:
    kubeadm_certs.renew(layout, KINDS["apiserver"], NOW, validity=dt.timedelta(days=99999))
    ca = x509.load_pem_x509_certificate((layout / "pki" / "ca.crt").read_bytes())
    assert cert_of(layout, "apiserver").not_valid_after_utc == ca.not_valid_after_utc


def test_an_external_ca_is_a_clear_error(layout: Path) -> None:
    (layout / "pki" / "front-proxy-ca.key").unlink()
    with pytest.raises(kubeadm_certs.RenewalError, match="front-proxy-client: no CA key"):
        kubeadm_certs.renew(layout, KINDS["front-proxy-client"], NOW)


def test_a_certificate_of_another_ca_is_refused(layout: Path) -> None:
    (layout / "pki" / "etcd" / "ca.crt").write_bytes((layout / "pki" / "ca.crt").read_bytes())
    (layout / "pki" / "etcd" / "ca.key").write_bytes((layout / "pki" / "ca.key").read_bytes())
    with pytest.raises(kubeadm_certs.RenewalError, match="etcd-server: issued by CN=etcd-ca, not by this CA"):
        kubeadm_certs.renew(layout, KINDS["etcd-server"], NOW)


def test_the_api_server_restarts_last() -> None:
    renewed = [
        KINDS["apiserver"],
        KINDS["scheduler.conf"],
        KINDS["controller-manager.conf"],
        KINDS["etcd-peer"],
    ]
    assert kubeadm_certs.restart_order(renewed) == [
        "kube-controller-manager",
        "kube-scheduler",
        "kube-apiserver",
    ]
    assert kubeadm_certs.restart_order([KINDS["admin.conf"], KINDS["etcd-server"]]) == []


def test_dry_run_lists_expiries_and_changes_nothing(layout: Path) -> None:
    before = {p: p.read_bytes() for p in layout.rglob("*") if p.is_file()}
    result = CliRunner().invoke(app, ["maintenance", "certs", "--dry-run", "--kubernetes-dir", str(layout)])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line.split() for line in result.output.splitlines()}
    assert lines["etcd-peer"][-2:] == ["EXPIRED", "renew"]
    assert lines["apiserver"][-1] == "renew"
    assert lines["scheduler.conf"][-1] == "keep"
    assert {p: p.read_bytes() for p in layout.rglob("*") if p.is_file()} == before


def test_dry_run_takes_the_threshold_from_the_policy(
    layout: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    config = tmp_path_factory.mktemp("config") / "policy.yaml"
    config.write_text("spec:\n  rotateCertsThreshold: 48h\n")
    result = CliRunner().invoke(
        app, ["maintenance", "certs", "--dry-run", "--config", str(config), "--kubernetes-dir", str(layout)]
    )
    marks = {line.split()[0]: line.split()[-1] for line in result.output.splitlines()}
    assert marks["etcd-peer"] == "renew" and marks["apiserver"] == "keep"


def test_no_layout_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["maintenance", "certs", "--dry-run", "--kubernetes-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"no kubeadm certificates under {tmp_path}" in result.output
