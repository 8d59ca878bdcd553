"""HTTP/1.1 for every client of the operator: h11 over asyncio streams, connections kept per host.

httpx2's own transport goes through httpcore2's pool and anyio's TLS streams and loads an
HTTP/2 stack no kustos connection speaks: about a third of the CPU of an EtcdCluster pass
went there, and ~3 MiB resident (issue 28). The operator's clients (API server, etcd
members, MinIO health) send small requests to few hosts and read a few long watches, which
this serves with one h11 state machine per connection:

- a connection is reused once its response was read to the end and neither side asked to
  close it; an idle one is dropped after ``keepalive_expiry`` or when the server closed it;
- ``max_connections`` requests in flight at once, the rest wait up to the pool timeout;
- a response not read to the end (a watch stopped, a stream cancelled) closes its connection;
- failures are httpx2's exceptions, the TLS or socket error chained as their cause, so
  callers tell a refused certificate from a closed port as before.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import h11
import httpx2

READ_SIZE = 64 * 1024


class _Connection:
    """One TCP connection and its h11 state. With TLS, the session runs in memory over the
    plain stream (``ssl.SSLObject`` on two BIOs): asyncio's own TLS transport keeps a 256 KiB
    read buffer per connection, 9 MiB for the operator's ~35 connections (mostly watches)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tls: ssl.SSLObject | None = None
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()
        self._tls = tls
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()

    @classmethod
    def over_tls(
        cls, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext, host: str
    ) -> _Connection:
        conn = cls(reader, writer)
        conn._tls = context.wrap_bio(conn._incoming, conn._outgoing, server_hostname=host)
        return conn

    async def handshake(self) -> None:
        assert self._tls is not None
        while True:
            try:
                self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._fill():
                    raise ssl.SSLEOFError(
                        "the server closed the connection during the TLS handshake"
                    ) from None
        await self._flush()

    async def send(self, data: bytes) -> None:
        if self._tls is None:
            self.writer.write(data)
        else:
            self._tls.write(data)
            self.writer.write(self._outgoing.read())
        await self.writer.drain()

    async def recv(self) -> bytes:
        """The next bytes the server sent; b"" once it closed the connection."""
        if self._tls is None:
            return await self.reader.read(READ_SIZE)
        while True:
            try:
                return self._tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                await self._flush()  # what the session has to say first (a key update)
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""  # closed, with or without close_notify: h11 knows if the answer was whole

    async def _fill(self) -> bool:
        data = await self.reader.read(READ_SIZE)
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()
        return bool(data)

    async def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            self.writer.write(pending)
            await self.writer.drain()

    def usable(self, now: float, keepalive_expiry: float) -> bool:
        return (
            now - self.idle_since < keepalive_expiry
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.h11.our_state is h11.IDLE
        )

    def close(self) -> None:
        self.writer.close()


class H11Transport(httpx2.AsyncBaseTransport):
    """An ``httpx2.AsyncBaseTransport``: ``ssl_context`` verifies (and presents a client
    certificate to) every ``https`` host; ``http`` goes in the clear."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = 100,
        max_idle_per_host: int = 20,
        keepalive_expiry: float = 5.0,
    ) -> None:
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._max_idle = max_idle_per_host
        self._keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        try:
            async with asyncio.timeout(timeouts.get("pool")):
                await self._slots.acquire()
        except TimeoutError as err:
            raise httpx2.PoolTimeout("no connection free within the pool timeout", request=request) from err
        conn: _Connection | None = None
        try:
            url = request.url
            key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
            conn = self._take_idle(key) or await self._connect(key, timeouts.get("connect"), request)
            await self._send(conn, request, timeouts.get("write"))
            head = await self._head(conn, request, timeouts.get("read"))
        except BaseException:
            if conn is not None:
                conn.close()
            self._slots.release()
            raise
        stream = _Body(self, conn, key, request, timeouts.get("read"))
        return httpx2.Response(
            head.status_code,
            headers=list(head.headers),
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason},
        )

    def _take_idle(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now, self._keepalive_expiry):
                return conn
            conn.close()
        return None

    async def _connect(
        self, key: tuple[str, str, int], timeout: float | None, request: httpx2.Request
    ) -> _Connection:
        scheme, host, port = key
        if scheme == "https" and self._ssl is None:
            self._ssl = ssl.create_default_context()
        writer: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=READ_SIZE)
                if scheme != "https":
                    return _Connection(reader, writer)
                assert self._ssl is not None
                conn = _Connection.over_tls(reader, writer, self._ssl, host)
                await conn.handshake()
                return conn
        except BaseException as err:
            if writer is not None:
                writer.close()
            if isinstance(err, TimeoutError):
                raise httpx2.ConnectTimeout(
                    f"connecting to {host}:{port} timed out", request=request
                ) from err
            if isinstance(err, OSError):  # refused, unreachable, and every TLS failure (ssl.SSLError)
                raise httpx2.ConnectError(str(err) or type(err).__name__, request=request) from err
            raise

    async def _send(self, conn: _Connection, request: httpx2.Request, timeout: float | None) -> None:
        target = request.url.raw_path
        data = (
            conn.h11.send(h11.Request(method=request.method, target=target, headers=request.headers.raw))
            or b""
        )
        assert isinstance(request.stream, httpx2.AsyncByteStream)
        async for chunk in request.stream:
            data += conn.h11.send(h11.Data(data=chunk)) or b""
        data += conn.h11.send(h11.EndOfMessage()) or b""
        try:
            async with asyncio.timeout(timeout):
                await conn.send(data)
        except TimeoutError as err:
            raise httpx2.WriteTimeout("writing the request timed out", request=request) from err
        except OSError as err:
            raise httpx2.WriteError(str(err) or type(err).__name__, request=request) from err

    async def _head(self, conn: _Connection, request: httpx2.Request, timeout: float | None) -> h11.Response:
        while True:
            event = await _next_event(conn, request, timeout)
            if isinstance(event, h11.Response):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise httpx2.RemoteProtocolError(
                    "Server disconnected without sending a response.", request=request
                )
            # an InformationalResponse (100 Continue): the real answer follows

    def _release(self, conn: _Connection, key: tuple[str, str, int], reusable: bool) -> None:
        self._slots.release()
        idle = self._idle.setdefault(key, [])
        if (
            reusable
            and not self._closed
            and len(idle) < self._max_idle
            and conn.h11.our_state is h11.DONE
            and conn.h11.their_state is h11.DONE
        ):
            conn.h11.start_next_cycle()
            conn.idle_since = time.monotonic()
            idle.append(conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def _next_event(conn: _Connection, request: httpx2.Request, timeout: float | None) -> Any:
    while True:
        try:
            event = conn.h11.next_event()
        except h11.RemoteProtocolError as err:
            raise httpx2.RemoteProtocolError(str(err), request=request) from err
        if event is not h11.NEED_DATA:
            return event
        try:
            async with asyncio.timeout(timeout):
                data = await conn.recv()
        except TimeoutError as err:
            raise httpx2.ReadTimeout("reading the response timed out", request=request) from err
        except OSError as err:
            raise httpx2.ReadError(str(err) or type(err).__name__, request=request) from err
        try:
            conn.h11.receive_data(data)  # b"" is the end of the stream
        except h11.RemoteProtocolError as err:
            raise httpx2.RemoteProtocolError(str(err), request=request) from err


class _Body(httpx2.AsyncByteStream):
    """A response's body as it arrives; its connection goes back to the pool when it is read to
    the end, and is closed when the reader stops early."""

    def __init__(
        self,
        transport: H11Transport,
        conn: _Connection,
        key: tuple[str, str, int],
        request: httpx2.Request,
        timeout: float | None,
    ) -> None:
        self._transport = transport
        self._conn: _Connection | None = conn
        self._key = key
        self._request = request
        self._timeout = timeout

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        complete = False
        try:
            while True:
                event = await _next_event(conn, self._request, self._timeout)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    complete = True
                    return
                elif isinstance(event, h11.ConnectionClosed):
                    raise httpx2.RemoteProtocolError(
                        "Server disconnected before the body ended.", request=self._request
                    )
        finally:
            self._done(complete)

    def _done(self, complete: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._transport._release(conn, self._key, reusable=complete)

    async def aclose(self) -> None:
        self._done(False)
