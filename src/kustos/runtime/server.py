"""The operator's HTTP endpoints: /metrics, /healthz, /readyz, and HTTPS admission webhooks."""

from __future__ import annotations

import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kustos.runtime.http import HttpServer, Request, Response
from kustos.runtime.metrics import Metrics
from kustos.runtime.webhook import ServingCertificate, Webhook, handle_review

ReadinessCheck = Callable[[], tuple[bool, str]]
ReadinessNote = Callable[[], str]


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
        self._notes: dict[str, ReadinessNote] = {}
        self._server: HttpServer | None = None
        self.port = 0

    def add_readiness_check(self, name: str, check: ReadinessCheck) -> None:
        self._checks[name] = check

    def add_readiness_note(self, name: str, note: ReadinessNote) -> None:
        """Something /readyz says without failing on it (e.g. a controller waiting for its CRD)."""
        self._notes[name] = note

    async def start(self) -> None:
        self._server = HttpServer(*split_address(self._address))
        self._server.route("GET", "/metrics", self._serve_metrics)
        self._server.route("GET", "/healthz", self._healthz)
        self._server.route("GET", "/readyz", self._readyz)
        await self._server.start()
        self.port = self._server.port

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()

    async def _serve_metrics(self, _: Request) -> Response:
        return Response(200, generate_latest(self._metrics.registry), CONTENT_TYPE_LATEST)

    async def _healthz(self, _: Request) -> Response:
        return Response.text("ok")

    async def _readyz(self, _: Request) -> Response:
        failing = []
        for name, check in self._checks.items():
            ok, detail = check()
            if not ok:
                failing.append(f"{name}: {detail}")
        notes = [f"{name}: {text}" for name, note in self._notes.items() if (text := note())]
        if failing:
            return Response.text("\n".join(["not ready", *failing, *notes]), 503)
        return Response.text("\n".join(["ok", *notes]))


class WebhookServer:
    """HTTPS for the API server's AdmissionReview calls."""

    def __init__(self, address: str, certificate: ServingCertificate) -> None:
        self._address = address
        self.certificate = certificate
        self._webhooks: dict[str, Webhook] = {}
        self._server: HttpServer | None = None
        self._context: ssl.SSLContext | None = None
        self.port = 0
        self.serving = False

    def register(self, webhook: Webhook) -> None:
        self._webhooks[webhook.path] = webhook

    @property
    def webhooks(self) -> list[Webhook]:
        return list(self._webhooks.values())

    async def start(self) -> None:
        host, port = split_address(self._address)
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._load(self._context)
        self._server = HttpServer(host, port, ssl_context=self._context)
        for path in self._webhooks:
            self._server.route("POST", path, self._review)
        await self._server.start()
        self.port = self._server.port
        self.serving = True

    async def stop(self) -> None:
        self.serving = False
        if self._server is not None:
            await self._server.stop()

    def reload(self, certificate: ServingCertificate) -> None:
        """Serve ``certificate`` from the next TLS handshake on, without a restart: the listening
        socket keeps its context, whose chain is replaced; open connections keep the old one."""
        if self._context is not None and certificate.cert_pem != self.certificate.cert_pem:
            self._load(self._context, certificate)
        self.certificate = certificate

    def _load(self, context: ssl.SSLContext, certificate: ServingCertificate | None = None) -> None:
        certificate = certificate or self.certificate
        # ssl loads chains from files only; the key never leaves a private temporary dir.
        with tempfile.TemporaryDirectory() as scratch:
            cert, key = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
            cert.write_bytes(certificate.cert_pem)
            key.write_bytes(certificate.key_pem)
            context.load_cert_chain(cert, key)

    async def _review(self, request: Request) -> Response:
        try:
            review = request.json()
        except ValueError as err:
            return Response.text(f"not an AdmissionReview: {err}", 400)
        return Response.json(await handle_review(self._webhooks[request.path], review))
