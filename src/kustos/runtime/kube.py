"""The connection to the API server: one client of dicts for calls, watches and the Lease.

Every request goes through one instrumented transport, so it is counted in
``rest_client_requests_total{code,method}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx2

from kustos.runtime import kubeconfig
from kustos.runtime.kubeconfig import KubeAccess
from kustos.runtime.metrics import Metrics
from kustos.runtime.transport import H11Transport

FIELD_MANAGER = "kustos"


class CountingTransport(httpx2.AsyncBaseTransport):
    """Counts requests by status code and method on their way through."""

    def __init__(self, metrics: Metrics, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._metrics = metrics
        self._inner = inner

    def bind(self, inner: httpx2.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        assert self._inner is not None
        try:
            response = await self._inner.handle_async_request(request)
        except httpx2.HTTPError:
            self._metrics.rest_requests.labels("<error>", request.method, request.url.host).inc()
            raise
        self._metrics.rest_requests.labels(str(response.status_code), request.method, request.url.host).inc()
        return response

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()


@dataclass
class KubeClients:
    """What controllers use: ``raw`` for every call and list/watch of dicts, and ``config``
    for what opens its own connections (exec into a pod)."""

    config: KubeAccess
    raw: httpx2.AsyncClient

    async def close(self) -> None:
        await self.raw.aclose()


# An explicit kubeconfig, else in-cluster, else ``$KUBECONFIG`` or ~/.kube/config.
load_config = kubeconfig.load


def connect(config: KubeAccess, metrics: Metrics) -> KubeClients:
    # Watches wait for events as long as the server keeps the request open.
    timeout = httpx2.Timeout(30.0, read=None)
    transport = H11Transport(config.ssl_context(), max_connections=100)
    raw = httpx2.AsyncClient(
        base_url=config.server, auth=config.auth(), timeout=timeout,
        transport=CountingTransport(metrics, transport),
    )  # fmt: skip
    return KubeClients(config=config, raw=raw)


def api_path(group: str, version: str, plural: str, namespace: str | None = None, name: str = "") -> str:
    """The REST path of a resource collection or object."""
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    path = f"{base}/{plural}"
    return f"{path}/{name}" if name else path


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name`` (``name`` for cluster-scoped objects), as controller-runtime keys them."""
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])
