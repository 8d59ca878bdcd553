"""A small HTTP/1.1 server on asyncio streams, with h11 speaking the protocol.

The operator serves three tiny things (probes, /metrics, admission webhooks). h11 is
already loaded for the API client, so this costs no memory, where a web framework
cost 9 MiB of the operator's idle footprint. Keep-alive is honoured (the API server
reuses webhook connections); bodies are capped; idle connections are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024  # an AdmissionReview carries at most two ~1.5 MiB objects
IDLE_TIMEOUT = 60.0
READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        return cls(status, text.encode())

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(value).encode(), "application/json")


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """Routes ``(method, path)`` to handlers; unknown paths are 404, other methods 405."""

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self._host, self._requested_port = host, port
        self._ssl = ssl_context
        self._routes: dict[str, dict[str, Handler]] = {}
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self.port = 0

    def route(self, method: str, path: str, handler: Handler) -> None:
        self._routes.setdefault(path, {})[method] = handler

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self._host, self._requested_port, ssl=self._ssl
        )
        self.port = int(self._server.sockets[0].getsockname()[1])  # port 0 means "pick one"

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        connections = list(self._connections)
        for writer in connections:
            writer.close()
        if connections:  # so a client never reuses a keep-alive connection we are dropping
            await asyncio.wait([asyncio.ensure_future(_closed(w)) for w in connections], timeout=5)
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        self._connections.add(writer)
        try:
            while True:
                request = await self._read_request(connection, reader)
                if request is None:
                    return
                response = await self._dispatch(request)
                await self._send(connection, writer, response)
                if connection.our_state is h11.MUST_CLOSE:
                    return
                connection.start_next_cycle()
        except h11.RemoteProtocolError as err:
            if connection.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                with contextlib.suppress(h11.ProtocolError, OSError, ssl.SSLError):
                    await self._send(connection, writer, Response.text(str(err), err.error_status_hint))
        except (h11.ProtocolError, OSError, TimeoutError, ssl.SSLError) as err:
            log.debug("HTTP connection closed: %s", err)
        finally:
            self._connections.discard(writer)
            writer.close()
            await _closed(writer)

    async def _read_request(self, connection: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        start: h11.Request | None = None
        body = bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                async with asyncio.timeout(IDLE_TIMEOUT):
                    connection.receive_data(await reader.read(READ_SIZE))
            elif isinstance(event, h11.Request):
                start = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise h11.RemoteProtocolError("request body too large", error_status_hint=413)
            elif isinstance(event, h11.EndOfMessage) and start is not None:
                target = start.target.decode("ascii", "replace").split("?", 1)[0]
                return Request(start.method.decode("ascii", "replace"), target, bytes(body))
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _dispatch(self, request: Request) -> Response:
        handlers = self._routes.get(request.path)
        if handlers is None:
            return Response.text("not found", 404)
        handler = handlers.get(request.method)
        if handler is None:
            return Response.text("method not allowed", 405)
        try:
            return await handler(request)
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return Response.text("internal error", 500)

    @staticmethod
    async def _send(connection: h11.Connection, writer: asyncio.StreamWriter, response: Response) -> None:
        headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body)))]
        writer.write(connection.send(h11.Response(status_code=response.status, headers=headers)) or b"")
        writer.write(connection.send(h11.Data(data=response.body)) or b"")
        writer.write(connection.send(h11.EndOfMessage()) or b"")
        await writer.drain()


async def _closed(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
