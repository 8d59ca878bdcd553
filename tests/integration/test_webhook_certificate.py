"""Replicas starting together agree on one webhook certificate through the Secret (real API
server): the leader's CA bundle then trusts whichever replica the Service picks. Its CA rotates
while they run, with no call of the API server's failing."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kustos.devcluster.cluster import DevCluster
from kustos.devcluster.ports import free_port
from kustos.etcd.carotation import ROTATE_CA_ANNOTATION
from kustos.etcd.webhook import GUARD_NAME
from kustos.install.certs import service_dns_names, shared_certificate
from kustos.runtime.api import Api
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import etcd_cluster
from tests.integration.kube import wait_until
from tests.integration.operator import REPO, parse_metrics, start_operator


async def test_concurrent_replicas_share_one_certificate(dev_cluster: DevCluster, kubectl: Kubectl) -> None:
    names = service_dns_names(kubectl.namespace, "kustos-webhook")
    clients = [connect(load_config(dev_cluster.kubeconfig), Metrics()) for _ in range(3)]
    try:
        certificates = await asyncio.gather(
            *(
                shared_certificate(Api(c.raw), kubectl.namespace, "kustos-webhook-cert", names)
                for c in clients
            )
        )
        assert len({c.cert_pem for c in certificates}) == 1
        assert len({c.ca_pem for c in certificates}) == 1
        # A restart reads the same one.
        again = await shared_certificate(Api(clients[0].raw), kubectl.namespace, "kustos-webhook-cert", names)
        assert again.cert_pem == certificates[0].cert_pem
    finally:
        for c in clients:
            await c.close()
    secret = kubectl.get("secret", "kustos-webhook-cert")
    assert secret["type"] == "kubernetes.io/tls"


def test_kustos_run_serves_the_shared_certificate_and_points_the_api_server_at_the_service(
    dev_cluster: DevCluster, kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """The chart's default: `kustos run --webhook-service ... --webhook-cert-secret ...`."""
    namespace, configuration = kubectl.namespace, f"kustos-{kubectl.namespace}"
    metrics_port, webhook_port = free_port(), free_port()
    log = tmp_path / "operator.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kustos", "run", "--kubeconfig", str(dev_cluster.kubeconfig),
             "--namespace", namespace, "--lease-namespace", namespace, "--controllers", "storagecluster",
             "--metrics-address", f"127.0.0.1:{metrics_port}",
             "--webhook-address", f"127.0.0.1:{webhook_port}",
             "--webhook-service", f"{namespace}/kustos-webhook:443",
             "--webhook-cert-secret", "kustos-webhook-cert", "--webhook-configuration-name", configuration],
            stdout=sink, stderr=sink, cwd=REPO,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        found = ""
        while time.monotonic() < deadline and not found:
            found = dev_cluster.kubectl("get", "mutatingwebhookconfiguration", configuration,
                                        "--ignore-not-found", "-o", "json")  # fmt: skip
            time.sleep(0.5)
        assert found, log.read_text(errors="replace")[-3000:]
        entry = json.loads(found)["webhooks"][0]
        secret = kubectl.get("secret", "kustos-webhook-cert")
        assert entry["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        service = entry["clientConfig"]["service"]
        assert {k: service[k] for k in ("namespace", "name", "port")} == {
            "namespace": namespace, "name": "kustos-webhook", "port": 443,
        }  # fmt: skip
        # The server presents the Secret's certificate, valid for the Service's DNS name.
        context = ssl.create_default_context(cadata=base64.b64decode(secret["data"]["ca.crt"]).decode())
        with (
            socket.create_connection(("127.0.0.1", webhook_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=f"kustos-webhook.{namespace}.svc") as tls,
        ):
            presented = tls.getpeercert(binary_form=True)
        served = ssl.PEM_cert_to_DER_cert(base64.b64decode(secret["data"]["tls.crt"]).decode())
        assert presented == served
    finally:
        process.terminate()
        process.wait(30)
        dev_cluster.kubectl("delete", "mutatingwebhookconfiguration", configuration, "--ignore-not-found")


def _presented(port: int, ca_pem: str) -> bytes:
    """The certificate a webhook server presents, verified against ``ca_pem`` alone."""
    context = ssl.create_default_context(cadata=ca_pem)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        presented = tls.getpeercert(binary_form=True)
    assert presented is not None
    return presented


def _webhook_calls(kubectl: Kubectl, webhook: str) -> tuple[float, float]:
    """The API server's own count of calls to ``webhook`` answered 200, and of those it could
    not make (a TLS failure, a timeout) and so let through (failurePolicy Ignore)."""
    values = parse_metrics(kubectl.cluster.kubectl("get", "--raw", "/metrics"))
    label = f'name="{webhook}"'
    answered = sum(v for k, v in values.items()
                   if k.startswith("apiserver_admission_webhook_request_total{") and label in k
                   and 'code="200"' in k)  # fmt: skip
    failed = sum(v for k, v in values.items()
                 if k.startswith("apiserver_admission_webhook_fail_open_count{") and label in k)  # fmt: skip
    return answered, failed


async def test_the_webhook_ca_rotates_while_the_api_server_keeps_calling_with_no_failure(
    kubectl: Kubectl, crds: None, tmp_path: Path
) -> None:
    """Two replicas share the Secret; on request the leader trusts old and new CA, every replica
    then serves the new certificate without a restart, and the old CA is dropped. Meanwhile a
    client keeps creating EtcdClusters (server-side dry runs) through the webhook."""
    namespace, configuration = kubectl.namespace, f"kustos-{kubectl.namespace}"
    secret_name = "kustos-webhook-cert"
    common = ("--namespace", namespace, "--lease-namespace", namespace,
              "--webhook-configuration-name", configuration, "--webhook-cert-secret", secret_name,
              "--webhook-cert-check-interval", "1")  # fmt: skip
    replicas = [
        start_operator(
            kubectl.cluster, tmp_path / f"replica-{i}", *common, controllers="kustos.etcd.webhook:register"
        )
        for i in range(2)
    ]
    try:

        def bundle() -> str:
            return str(kubectl.cluster.kubectl(
                "get", "validatingwebhookconfiguration", configuration, "--ignore-not-found",
                "-o", "jsonpath={.webhooks[0].clientConfig.caBundle}",
            ))  # fmt: skip

        await wait_until(lambda: _async(bool(bundle())), "the webhook configuration", timeout=60)
        before = kubectl.get("secret", secret_name)["data"]
        assert bundle() == before["ca.crt"]
        old_ca = base64.b64decode(before["ca.crt"]).decode()
        for replica in replicas:  # one certificate, from the Secret, for both
            assert _presented(replica.webhook_port, old_ca) == _der(before["tls.crt"])

        created, refused = 0, []
        stop = asyncio.Event()

        async def client() -> None:
            nonlocal created
            i = 0
            while not stop.is_set():
                i += 1
                document = json.dumps(etcd_cluster(f"through-webhook-{i}", 3))
                try:
                    await asyncio.to_thread(
                        kubectl, "create", "--dry-run=server", "-f", "-", input_text=document
                    )
                    created += 1
                except Exception as err:
                    refused.append(str(err))

        answered_before, failed_before = _webhook_calls(kubectl, GUARD_NAME)
        writer = asyncio.create_task(client())
        started = time.monotonic()
        kubectl("annotate", "secret", secret_name, f"{ROTATE_CA_ANNOTATION}=now")
        bundles_seen: set[str] = set()

        async def rotated() -> bool:
            bundles_seen.add(bundle())
            data = kubectl.get("secret", secret_name)["data"]
            return (
                data["tls.crt"] != before["tls.crt"]
                and set(data) == {"tls.crt", "tls.key", "ca.crt"}
                and (bundle() == data["ca.crt"])
            )

        await wait_until(rotated, "the webhook CA rotation", timeout=120)
        elapsed = time.monotonic() - started
        await asyncio.sleep(3)  # calls under the new CA alone
        stop.set()
        await writer
        answered_after, failed_after = _webhook_calls(kubectl, GUARD_NAME)

        after = kubectl.get("secret", secret_name)["data"]
        new_ca = base64.b64decode(after["ca.crt"]).decode()
        assert new_ca != old_ca and old_ca not in new_ca
        # The API server trusted both CAs at some point (old, old+new, new).
        trusted = [base64.b64decode(b).decode() for b in bundles_seen if b]
        assert any(old_ca in b and new_ca in b for b in trusted), "old and new CA were never trusted together"
        for replica in replicas:  # the follower reloaded from the Secret; neither restarted
            assert replica.alive()
            assert _presented(replica.webhook_port, new_ca) == _der(after["tls.crt"])
            with pytest.raises(ssl.SSLCertVerificationError):
                _presented(replica.webhook_port, old_ca)
        assert not refused, refused[:3]
        assert created > 0 and answered_after - answered_before >= created
        assert failed_after == failed_before, "the API server could not call the webhook"
        print(f"\nwebhook CA rotation: {elapsed:.1f} s; {created} creates through the webhook, "
              f"0 refused, {failed_after - failed_before:.0f} calls failed open")  # fmt: skip
    finally:
        for replica in replicas:
            replica.stop()
        kubectl.cluster.kubectl(
            "delete", "validatingwebhookconfiguration", configuration, "--ignore-not-found"
        )


def _der(encoded: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(base64.b64decode(encoded).decode())


async def _async(value: bool) -> bool:
    return value
