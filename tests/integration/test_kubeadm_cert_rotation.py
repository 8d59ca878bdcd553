"""kubeadm's certificates renewed on a control-plane node, with a real kube-apiserver restarted
on its renewed certificate.

What runs on each control-plane node (``kustos maintenance certs``, the command of the pod the
MaintenancePolicy controller pins there) runs here as a process against a kubeadm layout made
with kubeadm's CAs, subjects and SANs, beside a real etcd serving kubeadm's etcd certificates
and a real kube-apiserver started from the static pod manifest's own command with kubeadm's
flags. The kubelet is played by a thread that stops a static pod when its manifest leaves
the manifests directory and starts it when it returns, which is all the kubelet does with a
moved manifest. Why not the dev cluster's real nodes: their control plane is kwok's, not
kubeadm's, so no kube-apiserver static pod reads /etc/kubernetes/pki there, and the pod would
renew certificates nothing serves.

The controller's side (the pod pinned to each control-plane node in turn) is proven by its
planner's tests (tests/unit/test_certrotation_planner.py), not yet end to end: a run on a
loaded machine saw the renewal pod run through the pod runner but not finish within 5 min.
"""

from __future__ import annotations

import datetime as dt
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kustos.devcluster.binaries import binary_path
from kustos.maintenance import kubeadm_certs
from kustos.maintenance.certs_cli import served_certificate
from tests.integration.etcd_support import free_port
from tests.kubeadm_support import make_layout

pytestmark = pytest.mark.timeout(480)

HOST = "127.0.0.1"
KUBE_APISERVER_IMAGE = "registry.k8s.io/kube-apiserver:v1.36.3"  # not run by the pod runner: kwok's
NEAR = {"apiserver": dt.timedelta(days=2), "front-proxy-client": dt.timedelta(days=2),
        "scheduler.conf": dt.timedelta(days=5)}  # fmt: skip
"""Within the 720 h default threshold; everything else expires in a year."""


def apiserver_manifest(root: Path, port: int, etcd: str, host: str = HOST) -> dict[str, object]:
    """kube-apiserver's static pod as kubeadm writes it (its flags, the paths under ``root``)."""
    pki = root / "pki"
    command = [
        "kube-apiserver", f"--advertise-address={host}", f"--bind-address={host}", f"--secure-port={port}",
        "--allow-privileged=true", "--authorization-mode=Node,RBAC", f"--client-ca-file={pki}/ca.crt",
        "--enable-admission-plugins=NodeRestriction", f"--etcd-servers={etcd}",
        f"--etcd-cafile={pki}/etcd/ca.crt", f"--etcd-certfile={pki}/apiserver-etcd-client.crt",
        f"--etcd-keyfile={pki}/apiserver-etcd-client.key", f"--etcd-prefix=/registry-{host}-{port}",
        f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
        f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
        f"--proxy-client-cert-file={pki}/front-proxy-client.crt",
        f"--proxy-client-key-file={pki}/front-proxy-client.key",
        f"--requestheader-client-ca-file={pki}/front-proxy-ca.crt",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group", "--requestheader-username-headers=X-Remote-User",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
        "--service-cluster-ip-range=10.96.0.0/12", f"--tls-cert-file={pki}/apiserver.crt",
        f"--tls-private-key-file={pki}/apiserver.key",
    ]  # fmt: skip
    container = {
        "name": "kube-apiserver",
        "image": "registry.k8s.io/kube-apiserver:v1.36.3",
        "command": command,
    }
    meta = {"name": "kube-apiserver", "namespace": "kube-system"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"hostNetwork": True, "containers": [container]},
    }


class Kubelet:
    """The kubelet's part: each static pod runs while its manifest is in the manifests directory.
    A manifest whose command is not a binary here (the scheduler's) only counts its restarts."""

    def __init__(self, root: Path, logs: Path) -> None:
        self.manifests = root / "manifests"
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes] | None] = {}
        self.starts: list[tuple[str, float]] = []
        self.stops: list[tuple[str, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _start(self, name: str) -> None:
        pod = yaml.safe_load((self.manifests / f"{name}.yaml").read_text())
        command = pod["spec"]["containers"][0]["command"]
        process = None
        if command[0] == "kube-apiserver":
            log = (self.logs / f"{name}.log").open("ab")
            process = subprocess.Popen(
                [str(binary_path("kube-apiserver")), *command[1:]], stdout=log, stderr=log
            )
        self.running[name] = process
        self.starts.append((name, time.monotonic()))

    def _stop(self, name: str) -> None:
        process = self.running.pop(name)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        self.stops.append((name, time.monotonic()))

    def _loop(self) -> None:
        while not self.done.is_set():
            present = {p.stem for p in self.manifests.glob("*.yaml")}
            for name in sorted(set(self.running) - present):
                self._stop(name)
            for name in sorted(present - set(self.running)):
                self._start(name)
            time.sleep(0.2)
        for name in list(self.running):
            self._stop(name)

    def pid(self, name: str) -> int | None:
        process = self.running.get(name)
        return process.pid if process is not None else None


def wait_ready(address: str, timeout: float = 90) -> x509.Certificate:
    deadline = time.monotonic() + timeout
    while True:
        try:
            der, status = served_certificate(address)
            if " 200 " in f"{status} ":
                return x509.load_der_x509_certificate(der)
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the API server at {address} is not ready"
        time.sleep(0.5)


def public(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def sans(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def start_etcd(root: Path, data: Path) -> tuple[subprocess.Popen[bytes], str]:
    """etcd as kubeadm runs it, on kubeadm's etcd certificates (clients must present one)."""
    pki = root / "pki"
    client, peer = free_port(HOST), free_port(HOST)
    log = (data.parent / "etcd.log").open("ab")
    etcd = subprocess.Popen(
        [str(binary_path("etcd")), "--name=cp-1", f"--data-dir={data}",
         f"--listen-client-urls=https://{HOST}:{client}", f"--advertise-client-urls=https://{HOST}:{client}",
         f"--listen-peer-urls=http://{HOST}:{peer}", f"--initial-advertise-peer-urls=http://{HOST}:{peer}",
         f"--initial-cluster=cp-1=http://{HOST}:{peer}", f"--cert-file={pki}/etcd/server.crt",
         f"--key-file={pki}/etcd/server.key", "--client-cert-auth", f"--trusted-ca-file={pki}/etcd/ca.crt"],
        stdout=log, stderr=log,
    )  # fmt: skip
    return etcd, f"https://{HOST}:{client}"


def write_manifests(root: Path, port: int, etcd: str, host: str = HOST) -> None:
    manifests = root / "manifests"
    (manifests / "kube-apiserver.yaml").write_text(yaml.safe_dump(apiserver_manifest(root, port, etcd, host)))
    container = {"name": "kube-scheduler", "command": ["kube-scheduler"]}
    scheduler = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kube-scheduler"},
                 "spec": {"containers": [container]}}  # fmt: skip
    (manifests / "kube-scheduler.yaml").write_text(yaml.safe_dump(scheduler))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Path, str, Kubelet]]:
    """A kubeadm control-plane node: /etc/kubernetes, etcd and the kubelet with its API server."""
    root = tmp_path / "kubernetes"
    port = free_port(HOST)
    make_layout(root, dt.datetime.now(dt.UTC), NEAR, server_url=f"https://{HOST}:{port}")
    etcd, etcd_url = start_etcd(root, tmp_path / "etcd")
    write_manifests(root, port, etcd_url)
    kubelet = Kubelet(root, tmp_path)
    kubelet.thread.start()
    try:
        yield root, f"{HOST}:{port}", kubelet
    finally:
        kubelet.done.set()
        kubelet.thread.join(60)
        etcd.terminate()
        etcd.wait(30)


def test_near_expiry_certificates_are_renewed_and_served(
    node: tuple[Path, str, Kubelet], tmp_path: Path
) -> None:
    root, address, kubelet = node
    before = wait_ready(address)
    files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "manifests" not in p.parts}
    kinds = {k.name: k for k in kubeadm_certs.KINDS}
    apiserver_pid = kubelet.pid("kube-apiserver")
    summary = tmp_path / "summary"

    renewal = subprocess.run(
        [sys.executable, "-m", "kustos.cli", "maintenance", "certs", "--kubernetes-dir", str(root),
         "--apiserver", address, "--manifest-absent", "2", "--apiserver-timeout", "90",
         "--summary-file", str(summary)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert renewal.returncode == 0, renewal.stdout + renewal.stderr

    # The API server answers on its renewed certificate: a new NotAfter, the same key and SANs.
    served = wait_ready(address)
    assert served.serial_number != before.serial_number
    assert served.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=364)
    assert before.not_valid_after_utc - dt.datetime.now(dt.UTC) < dt.timedelta(days=2)
    assert public(served) == public(before)
    assert sans(served) == sans(before)
    assert served.subject == before.subject
    # ... and it was restarted onto it by its manifest's move (once), as was the scheduler.
    assert kubelet.pid("kube-apiserver") != apiserver_pid
    assert [name for name, _ in kubelet.stops] == ["kube-scheduler", "kube-apiserver"]
    # A client trusting kubeadm's CA reaches it through the renewed scheduler.conf and admin.conf.
    kubectl = binary_path("kubectl")
    for conf in ("admin.conf", "scheduler.conf"):
        answer = subprocess.run([str(kubectl), "--kubeconfig", str(root / conf), "get", "--raw", "/readyz"],
                                capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert answer.stdout.strip() == "ok", answer.stderr
    # Far from expiry: untouched, byte for byte; near: changed.
    near = {root / kinds[name].path for name in NEAR}
    changed = {p for p, data in files.items() if p.read_bytes() != data}
    assert changed == near
    assert summary.read_text() == "renewed 3: apiserver, front-proxy-client, scheduler.conf"

    # Nothing within the threshold any more: a second run renews and restarts nothing.
    again = subprocess.run(
        [sys.executable, "-m", "kustos.cli", "maintenance", "certs", "--kubernetes-dir", str(root),
         "--apiserver", address, "--summary-file", str(summary)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    assert summary.read_text() == "none within 720h"
    assert len(kubelet.stops) == 2
    shutil.rmtree(tmp_path / "etcd", ignore_errors=True)
