"""Connections to the API server: lightkube for typed calls, a raw client for informers.

Both share one configuration and one instrumented transport, so every request is
counted in ``rest_client_requests_total{code,method}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.config import client_adapter
from lightkube.config.client_adapter import ConnectionParams
from lightkube.config.kubeconfig import SingleConfig

from kustos.runtime.metrics import Metrics

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
    """What controllers use: ``api`` for typed calls, ``raw`` for list/watch of dicts."""

    config: SingleConfig
    api: AsyncClient
    raw: httpx2.AsyncClient

    async def close(self) -> None:
        await self.api.close()
        await self.raw.aclose()


def load_config(kubeconfig: Path | None = None, context: str | None = None) -> SingleConfig:
    """An explicit kubeconfig, else in-cluster, else ``$KUBECONFIG`` or ~/.kube/config."""
    source = KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_env()
    config = source.get(context_name=context)
    if config is None:
        raise ValueError(f"no context {context!r} in the kubeconfig")
    return config


def _transport(config: SingleConfig, metrics: Metrics, timeout: httpx2.Timeout) -> CountingTransport:
    params = ConnectionParams(timeout=timeout).httpx_params(config)
    inner = httpx2.AsyncHTTPTransport(verify=params["verify"], limits=httpx2.Limits(max_connections=100))
    return CountingTransport(metrics, inner)


def connect(config: SingleConfig, metrics: Metrics, field_manager: str = FIELD_MANAGER) -> KubeClients:
    timeout = httpx2.Timeout(30.0)
    api = AsyncClient(
        config=config, field_manager=field_manager, timeout=timeout,
        transport=_transport(config, metrics, timeout),
    )  # fmt: skip
    # Watches wait for events as long as the server keeps the request open.
    raw_timeout = httpx2.Timeout(30.0, read=None)
    raw = client_adapter.AsyncClient(
        config,
        ConnectionParams(
            timeout=raw_timeout,
            transport=cast(httpx2.BaseTransport, _transport(config, metrics, raw_timeout)),
        ),
    )
    return KubeClients(config=config, api=api, raw=raw)


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
