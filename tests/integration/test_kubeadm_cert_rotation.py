"""kubeadm's certificates renewed on a control-plane node, with a real kube-apiserver restarted
on its renewed certificate.

What runs on each control-plane node (``kustos maintenance certs``, the command of the pod the
MaintenancePolicy controller pins there) runs here as a process against a kubeadm layout made
with kubeadm's CAs, subjects and SANs, beside a real etcd serving kubeadm's etcd certificates
and a real kube-apiserver started from the static pod manifest's own command with kubeadm's
flags. The kubelet is played by a thread that stops a static pod when its manifest leaves
the manifests directory and starts it when it returns, which is all the kubelet does with a
moved manifest.

End to end, the controller pins its renewal pod to two kubeadm control-plane Nodes in turn; the
dev cluster's pod runner runs it as a real process on its pod IP, with the node's host path as
/etc/kubernetes, and it reaches the node's API server on the bridge's gateway. Why not the dev
cluster's real nodes (kubelet and containerd): their control plane is kwok's, not kubeadm's, so
no kube-apiserver static pod reads /etc/kubernetes/pki there, and a real kubelet's host path
would be this machine's own /etc/kubernetes.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kustos.devcluster.binaries import binary_path
from kustos.devcluster.ports import free_port
from kustos.etcd.kubeadm import APISERVER_ENDPOINT_ANNOTATION
from kustos.maintenance import certrotation, kubeadm_certs
from kustos.maintenance.certrotation import CHECKED_ANNOTATION
from kustos.maintenance.certrotation_act import served_certificate
from tests.integration.conftest import Kubectl
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, chart_maintenance_operator
from tests.integration.test_maintenance_ilb import FIRST_INDEX, control_plane_node, node_root
from tests.kubeadm_support import make_layout

pytestmark = [
    pytest.mark.timeout(480),
    pytest.mark.process_runner(
        "the renewal pod on kubeadm control-plane Nodes: a real node's host path would be this machine's /etc"
    ),
]

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


@pytest.fixture
def maintenance_operator(crds: None, kubectl: Kubectl, tmp_path: Path) -> Iterator[OperatorProcess]:
    with chart_maintenance_operator(kubectl.cluster, tmp_path / "operator") as process:
        yield process


def kubeadm_apiserver_pod(node: str, endpoint: str) -> dict[str, Any]:
    """The mirror pod of the node's kube-apiserver, with the annotation kubeadm writes on it."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"kube-apiserver-{node}", "namespace": "kube-system",
                         "labels": {"component": "kube-apiserver", "tier": "control-plane"},
                         "annotations": {APISERVER_ENDPOINT_ANNOTATION: endpoint}},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "kube-apiserver", "image": KUBE_APISERVER_IMAGE}]}}  # fmt: skip


class PodWatch:
    """The renewal pods seen, polled: which existed together."""

    def __init__(self, kubectl: Kubectl) -> None:
        self.kubectl = kubectl
        self.seen: list[tuple[str, ...]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.is_set():
            found = self.kubectl.get("pods", None, "-l", f"{certrotation.TASK_LABEL}={certrotation.TASK}")
            now = tuple(sorted(p["spec"]["nodeName"] for p in found["items"]))
            if now and (not self.seen or self.seen[-1] != now):
                self.seen.append(now)
            time.sleep(0.3)


def not_after(path: Path) -> dt.datetime:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


async def test_the_controller_renews_one_control_plane_node_at_a_time(
    kubectl: Kubectl, maintenance_operator: OperatorProcess, tmp_path: Path
) -> None:
    """Two kubeadm control-plane Nodes, each with a real kube-apiserver on the pod network's
    gateway (where the renewal pod reaches it from its pod IP) serving from the node's
    /etc/kubernetes (the runner's host path for it), restarted by the kubelet stand-in when its
    manifest moves. The controller renews one node, checks its API server, records it, then
    the other; what the pod did comes back as its termination message."""
    cluster = kubectl.cluster
    gateway = cluster.network.gateway
    template = tmp_path / "kubeadm"
    make_layout(template, dt.datetime.now(dt.UTC), {"apiserver": dt.timedelta(days=2)})
    etcd, etcd_url = start_etcd(template, tmp_path / "etcd")
    kubelets: dict[str, Kubelet] = {}
    endpoints: dict[str, str] = {}
    roots: dict[str, Path] = {}
    watch: PodWatch | None = None
    try:
        for index in (FIRST_INDEX + 20, FIRST_INDEX + 21):
            name, _ = control_plane_node(cluster, index)
            root = node_root(cluster, name) / "etc" / "kubernetes"
            shutil.copytree(template, root)  # kubeadm join copies the CAs; the leaves alike here
            port = free_port(gateway)
            write_manifests(root, port, etcd_url, gateway)
            (tmp_path / name).mkdir()
            kubelets[name] = Kubelet(root, tmp_path / name)
            kubelets[name].thread.start()
            endpoints[name], roots[name] = f"{gateway}:{port}", root
            cluster.kubectl(
                "apply", "-f", "-", input_text=json.dumps(kubeadm_apiserver_pod(name, endpoints[name]))
            )
        before = {name: wait_ready(endpoint) for name, endpoint in endpoints.items()}
        pids = {name: kubelet.pid("kube-apiserver") for name, kubelet in kubelets.items()}
        admin = {name: (root / "admin.conf").read_bytes() for name, root in roots.items()}
        watch = PodWatch(kubectl)
        policy = {
            "apiVersion": "kustos.dev/v1alpha1",
            "kind": "MaintenancePolicy",
            "metadata": {"name": "default"},
        }
        kubectl.apply({**policy, "spec": {"hostTaskNamespace": kubectl.namespace}})

        def checked(name: str) -> certrotation.Checked | None:
            node = kubectl.get("node", name)
            return certrotation.Checked.parse(node["metadata"].get("annotations", {}).get(CHECKED_ANNOTATION))

        async def both_recorded() -> bool:
            records = [checked(name) for name in endpoints]
            # A failure is final for this test (its retry is 10 min away): its record says why.
            return all(r is not None for r in records) or any(r and r.outcome == "Failed" for r in records)

        try:
            await wait_until(both_recorded, "both control-plane nodes checked and recorded", timeout=300,
                             cluster=cluster, namespace=kubectl.namespace)  # fmt: skip
        finally:
            watch.done.set()
        first, second = sorted(endpoints)
        for name in (first, second):
            record = checked(name)
            # What the pod did (its termination message), then what the controller checked.
            assert record is not None and record.outcome == "Renewed", record
            assert record.message.startswith("renewed 1: apiserver; serves a certificate valid until"), record
        # One at a time, in name order: never two renewal pods, the second after the first's record.
        assert watch.seen == [(first,), (second,)], watch.seen
        first_done, second_done = checked(first), checked(second)
        assert first_done is not None and second_done is not None and first_done.time <= second_done.time
        for name, endpoint in endpoints.items():
            # The certificate on disk moved a year on; the API server was restarted onto it
            # (a new process) and serves it: same key and names, new serial.
            assert not_after(roots[name] / "pki" / "apiserver.crt") - dt.datetime.now(dt.UTC) > dt.timedelta(
                days=364
            )
            assert kubelets[name].pid("kube-apiserver") != pids[name]
            assert [pod for pod, _ in kubelets[name].stops] == ["kube-apiserver"]
            served = wait_ready(endpoint)
            assert served.serial_number != before[name].serial_number
            assert served.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=364)
            assert public(served) == public(before[name]) and sans(served) == sans(before[name])
            assert (roots[name] / "admin.conf").read_bytes() == admin[name]  # a year left: untouched
        events = kubectl.get("events", None, "-A", "--field-selector", "reason=CertificatesChecked")
        assert {e["involvedObject"]["name"] for e in events["items"]} >= set(endpoints)

        async def recorded() -> dict[str, Any] | None:
            status = kubectl.get("maintenancepolicy", "default").get("status") or {}
            found = status.get("certificateRotation") or {}
            return found if found.get("nodesChecked") == "2/2" and not found.get("renewing") else None

        rotation = await wait_until(recorded, "status.certificateRotation 2/2", timeout=60)
        assert rotation["message"].startswith(f"{second}: Renewed: renewed 1: apiserver"), rotation
    finally:
        if watch is not None:
            watch.done.set()
        for kubelet in kubelets.values():
            kubelet.done.set()
        for kubelet in kubelets.values():
            kubelet.thread.join(60)
        for name in endpoints:
            cluster.kubectl("delete", "pod", "-n", "kube-system", f"kube-apiserver-{name}",
                            "--ignore-not-found", "--wait=false", check=False)  # fmt: skip
            cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)
        etcd.terminate()
        etcd.wait(30)


async def test_a_failed_renewal_says_why_on_the_node_and_in_the_policy(
    kubectl: Kubectl, maintenance_operator: OperatorProcess, tmp_path: Path
) -> None:
    """A node whose CA key is not on it (an external CA): the renewal pod fails, and its
    termination message, the reason, is what the Node's record, its Warning Event and the
    policy's status say. Nothing is restarted, so no API server is needed here."""
    cluster = kubectl.cluster
    name, _ = control_plane_node(cluster, FIRST_INDEX + 22)
    root = node_root(cluster, name) / "etc" / "kubernetes"
    try:
        make_layout(root, dt.datetime.now(dt.UTC), {"apiserver": dt.timedelta(days=2)})
        (root / "pki" / "ca.key").unlink()
        port = free_port(cluster.network.gateway)
        endpoint = f"{cluster.network.gateway}:{port}"
        write_manifests(root, port, "https://127.0.0.1:2379", cluster.network.gateway)
        manifests = sorted(p.name for p in (root / "manifests").iterdir())
        cluster.kubectl("apply", "-f", "-", input_text=json.dumps(kubeadm_apiserver_pod(name, endpoint)))
        policy = {
            "apiVersion": "kustos.dev/v1alpha1",
            "kind": "MaintenancePolicy",
            "metadata": {"name": "default"},
        }
        kubectl.apply({**policy, "spec": {"hostTaskNamespace": kubectl.namespace}})

        async def recorded() -> certrotation.Checked | None:
            node = kubectl.get("node", name)
            return certrotation.Checked.parse(node["metadata"].get("annotations", {}).get(CHECKED_ANNOTATION))

        record = await wait_until(recorded, f"{name} checked", timeout=120, cluster=cluster,
                                  namespace=kubectl.namespace)  # fmt: skip
        assert record.outcome == "Failed", record
        assert record.message.startswith("failed: apiserver: no CA key at"), record
        assert record.message.endswith("pki/ca.key (an external CA renews it)"), record
        events = kubectl.get("events", None, "-A", "--field-selector", "reason=CertificateRotationFailed")
        warned = [e for e in events["items"] if e["involvedObject"]["name"] == name]
        assert warned and warned[0]["type"] == "Warning" and warned[0]["message"] == record.message

        async def said() -> str | None:
            status = kubectl.get("maintenancepolicy", "default").get("status") or {}
            message = str((status.get("certificateRotation") or {}).get("message") or "")
            return message if message.startswith(f"{name}: Failed: failed: apiserver: no CA key") else None

        await wait_until(said, "the failure in status.certificateRotation", timeout=60)
        assert sorted(p.name for p in (root / "manifests").iterdir()) == manifests  # nothing restarted
    finally:
        cluster.kubectl("delete", "pod", "-n", "kube-system", f"kube-apiserver-{name}",
                        "--ignore-not-found", "--wait=false", check=False)  # fmt: skip
        cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)
