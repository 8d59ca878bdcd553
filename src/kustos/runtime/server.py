"""The operator's HTTP endpoints: /metrics, /healthz, /readyz, and HTTPS admission webhooks."""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kustos.runtime.metrics import Metrics
from kustos.runtime.webhook import ServingCertificate, Webhook, handle_review

ReadinessCheck = Callable[[], tuple[bool, str]]


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``:8080`` means every interface)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")  # [::1]:8080
    return host or "0.0.0.0", int(port)


class ProbeServer:
    """Plain HTTP: metrics and probes. /readyz fails until every check passes."""

    def __init__(self, metrics: Metrics, address: str) -> None:
        self._metrics = metrics
        self._address = address
        self._checks: dict[str, ReadinessCheck] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    def add_readiness_check(self, name: str, check: ReadinessCheck) -> None:
        self._checks[name] = check

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = split_address(self._address)
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = _bound_port(site)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _serve_metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, _: web.Request) -> web.Response:
        failing = []
        for name, check in self._checks.items():
            ok, detail = check()
            if not ok:
                failing.append(f"{name}: {detail}")
        if failing:
            return web.Response(status=503, text="not ready\n" + "\n".join(failing))
        return web.Response(text="ok")


class WebhookServer:
    """HTTPS for the API server's AdmissionReview calls."""

    def __init__(self, address: str, certificate: ServingCertificate) -> None:
        self._address = address
        self.certificate = certificate
        self._webhooks: dict[str, Webhook] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.serving = False

    def register(self, webhook: Webhook) -> None:
        self._webhooks[webhook.path] = webhook

    @property
    def webhooks(self) -> list[Webhook]:
        return list(self._webhooks.values())

    async def start(self) -> None:
        app = web.Application()
        for path in self._webhooks:
            app.router.add_post(path, self._review)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, port = split_address(self._address)
        site = web.TCPSite(self._runner, host, port, ssl_context=self._ssl_context())
        await site.start()
        self.port = _bound_port(site)
        self.serving = True

    async def stop(self) -> None:
        self.serving = False
        if self._runner is not None:
            await self._runner.cleanup()

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        # ssl loads chains from files only; the key never leaves a private temporary dir.
        with tempfile.TemporaryDirectory() as scratch:
            cert, key = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
            cert.write_bytes(self.certificate.cert_pem)
            key.write_bytes(self.certificate.key_pem)
            context.load_cert_chain(cert, key)
        return context

    async def _review(self, request: web.Request) -> web.Response:
        webhook = self._webhooks[request.path]
        body = await request.json()
        return web.json_response(await handle_review(webhook, body))


def _bound_port(site: web.TCPSite) -> int:
    server = site._server  # aiohttp keeps the asyncio server here; port 0 means "pick one"
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1]) if sockets else 0
