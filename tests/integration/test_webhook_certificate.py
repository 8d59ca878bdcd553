"""Replicas starting together agree on one webhook certificate through the Secret (real API
server): the leader's CA bundle then trusts whichever replica the Service picks."""

from __future__ import annotations

import asyncio

from kustos.devcluster.cluster import DevCluster
from kustos.install.certs import service_dns_names, shared_certificate
from kustos.runtime.api import Api
from kustos.runtime.kube import connect, load_config
from kustos.runtime.metrics import Metrics
from tests.integration.conftest import Kubectl


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
