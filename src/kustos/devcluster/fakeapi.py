"""A small JSON-over-HTTP(S) server for the local fakes of cloud APIs (dev tool, F-NODE-6).

No emulator exists for GCP's instance group managers or Azure's scale sets, so each fake
(``gcpfake``, ``azurefake``) speaks the part of the REST API kustos's provider uses, on
loopback, and the provider reaches it through the official SDK like the real service.
Routes are URI templates as the SDKs' own API descriptions spell them (``{project}``
matches one path segment), so a unit test checks each against the SDK's description.

Faults are injected per API method: the next N calls answer with an error status, body and
headers (429 with Retry-After, 403 quota, ...), so a provider's error mapping is tested
through the SDK's own parsing of real responses.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, str], dict[str, list[str]], Any], "Reply"]


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class ApiError(Exception):
    """Raised by a handler: answered as ``status`` with ``body``."""

    def __init__(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{status}: {body}")
        self.reply = Reply(status, body, dict(headers or {}))


@dataclass(frozen=True)
class Route:
    method: str  # "get", "post", "put", "patch", "delete"
    template: str  # "/compute/v1/projects/{project}/zones/{zone}/..."
    name: str  # the API method, e.g. "instanceGroupManagers.resize": what faults name
    handler: Handler
    public: bool = False  # served without credentials (a token endpoint, discovery documents)

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if method != self.method:
            return None
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.template))
        found = re.fullmatch(pattern, path)
        return found.groupdict() if found else None


@dataclass
class Fault:
    name: str
    reply: Reply
    times: int


class FakeApi:
    """Routes, faults, one lock over the fake's state, and the HTTP server that serves them."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = routes
        self.lock = threading.RLock()
        self.faults: list[Fault] = []
        self.calls: list[str] = []  # every API method called, in order
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.scheme = "http"
        # When set, asked about every request to a route that is not public: the reply that
        # refuses its credentials (401), or None to serve it.
        self.authorize: Callable[[Mapping[str, str]], Reply | None] | None = None

    def fail(
        self, name: str, status: int, body: Any, times: int = 1, headers: Mapping[str, str] | None = None
    ) -> None:
        """The next ``times`` calls of API method ``name`` answer ``status`` with ``body``."""
        with self.lock:
            self.faults.append(Fault(name, Reply(status, body, dict(headers or {})), times))

    def handle(self, method: str, url: str, body: bytes, headers: Mapping[str, str] | None = None) -> Reply:
        headers = headers or {}
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        for route in self.routes:
            params = route.match(method, parts.path)
            if params is None:
                continue
            with self.lock:
                if not route.public and self.authorize is not None:
                    refused = self.authorize(headers)
                    if refused is not None:
                        return refused
                self.calls.append(route.name)
                for fault in self.faults:
                    if fault.name == route.name and fault.times > 0:
                        fault.times -= 1
                        return fault.reply
                try:
                    return route.handler(params, query, _payload(body, headers))
                except ApiError as err:
                    return err.reply
        return Reply(404, {"error": {"code": 404, "message": f"no route for {method.upper()} {parts.path}"}})

    # -- serving ---------------------------------------------------------------------------

    def start(self, host: str = "127.0.0.1", port: int = 0, tls: tuple[Path, Path] | None = None) -> str:
        """Serve in a daemon thread; ``tls`` = (certificate, key) files. Returns the root URL."""
        api = self

        class RequestHandler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                reply = api.handle(self.command.lower(), self.path, body, dict(self.headers.items()))
                data = b"" if reply.body is None else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("fake api: " + format, *args)

        server = ThreadingHTTPServer((host, port), RequestHandler)
        server.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            server.socket = context.wrap_socket(server.socket, server_side=True)
            self.scheme = "https"
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, args=(0.05,), name="fake-api", daemon=True
        )
        self._thread.start()
        return self.url

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None


def _payload(body: bytes, headers: Mapping[str, str]) -> Any:
    """A request's body: JSON, or a form (``application/x-www-form-urlencoded``, as OAuth
    token endpoints take) as a dict of its first values."""
    if not body:
        return None
    kind = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    if kind.startswith("application/x-www-form-urlencoded"):
        return {key: values[0] for key, values in parse_qs(body.decode()).items()}
    return json.loads(body)


__all__ = ["ApiError", "FakeApi", "Fault", "Reply", "Route"]
