"""HTTP/1.1 for every client of the operator: h11 on asyncio sockets, connections kept per host.

httpx2's own transport goes through httpcore2's pool and anyio's TLS streams and loads an
HTTP/2 stack no kustos connection speaks: about a third of the CPU of an EtcdCluster pass
went there, and ~3 MiB resident (issue 28). The operator's clients (API server, etcd
members, MinIO health) send small requests to few hosts and read a few long watches, which
this serves with one h11 state machine per connection:

- a connection is reused once its response was read to the end and neither side asked to
  close it; an idle one is dropped after ``keepalive_expiry``, or once the server closed it or
  sent anything (as httpcore and Go's transport do), so no request goes out on a connection
  the server has already ended, unless the server's close crosses it on the wire;
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


class _Socket(asyncio.Protocol):
    """One TCP connection's bytes as they arrive, and whether the server closed it: what an idle
    connection must be checked for before it is used again (a server that closed it may have
    sent a TLS close_notify first, which a stream reader would hold as unread data)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._received = bytearray()
        self._closed = False
        self._error: Exception | None = None
        self._waiting: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._writing_paused = False

    @property
    def quiet(self) -> bool:
        """Nothing arrived and nothing closed since the last read."""
        return not self._received and not self._closed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._received += data
        if len(self._received) > 4 * READ_SIZE and not self._reading_paused:
            self._reading_paused = True  # a reader slower than the network: the kernel holds the rest
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._error = exc
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    def _wake(self) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    async def _wait(self) -> None:
        self._waiting = asyncio.get_running_loop().create_future()
        try:
            await self._waiting
        finally:
            self._waiting = None

    async def read(self) -> bytes:
        """What arrived since the last read, waiting for something; b"" once the server closed."""
        while not self._received and not self._closed:
            await self._wait()
        if not self._received:
            if self._error is not None:
                raise self._error
            return b""
        data = bytes(self._received)
        self._received.clear()
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        assert self.transport is not None
        if self._closed:
            raise self._error or ConnectionResetError("the server closed the connection")
        self.transport.write(data)
        while self._writing_paused and not self._closed:
            await self._wait()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Connection:
    """One connection and its h11 state. With TLS, the session runs in memory over the plain
    socket (``ssl.SSLObject`` on two BIOs): asyncio's own TLS transport keeps a 256 KiB read
    buffer per connection, 9 MiB for the operator's ~35 connections (mostly watches)."""

    def __init__(self, socket: _Socket) -> None:
        self.socket = socket
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = time.monotonic()
        self._tls: ssl.SSLObject | None = None
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()

    async def start_tls(self, context: ssl.SSLContext, host: str) -> None:
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_hostname=host)
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
            await self.socket.write(data)
        else:
            self._tls.write(data)
            await self.socket.write(self._outgoing.read())

    async def recv(self) -> bytes:
        """The next bytes the server sent; b"" once it closed the connection."""
        if self._tls is None:
            return await self.socket.read()
        while True:
            try:
                return self._tls.read(READ_SIZE)
            except ssl.SSLWantReadError:
                await self._flush()  # what the session has to say first (a key update)
                await self._fill()
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""  # closed, with or without close_notify: h11 knows if the answer was whole

    async def _fill(self) -> bool:
        data = await self.socket.read()
        if data:
            self._incoming.write(data)
        else:
            self._incoming.write_eof()
        return bool(data)

    async def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            await self.socket.write(pending)

    def usable(self, now: float, keepalive_expiry: float) -> bool:
        """Idle, not expired, and the server has neither closed it nor said anything since."""
        return (
            now - self.idle_since < keepalive_expiry
            and self.socket.quiet
            and not self._incoming.pending
            and self.h11.our_state is h11.IDLE
        )

    def close(self) -> None:
        self.socket.close()


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
        socket: _Socket | None = None
        try:
            async with asyncio.timeout(timeout):
                _, socket = await asyncio.get_running_loop().create_connection(_Socket, host, port)
                conn = _Connection(socket)
                if scheme == "https":
                    assert self._ssl is not None
                    await conn.start_tls(self._ssl, host)
                return conn
        except BaseException as err:
            if socket is not None:
                socket.close()
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
