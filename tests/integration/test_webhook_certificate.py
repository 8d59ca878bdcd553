"""Replicas starting together agree on one webhook certificate through the Secret (real API
server): the leader's CA bundle then trusts whichever replica the Service picks."""

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

from kustos.devcluster.cluster import DevCluster
from kustos.install.certs import service_dns_names, shared_certificate
from kustos.runtime.api import Api
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from tests.integration.conftest import Kubectl
from tests.integration.operator import REPO, free_port


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
            [sys.executable, "-m", "kustos.cli", "run", "--kubeconfig", str(dev_cluster.kubeconfig),
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
