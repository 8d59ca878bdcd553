"""The operator's HTTP/1.1 transport against a real local server: connections kept and given
back only when clean, every failure one of httpx2's, and no slot lost to a failure."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx2
import pytest

from kustos.etcd import tls
from kustos.runtime.transport import H11Transport


class Server:
    """Answers by path: ``/hello`` (kept alive), ``/close`` (says it closes, and does), ``/bye``
    (closes without saying so: an idle timeout, a restart), ``/slow`` (never answers),
    ``/lines`` (three chunks, 50 ms apart), ``/big`` (1 MiB); counts connections."""

    def __init__(self) -> None:
        self.connections = 0
        self.bodies: list[bytes] = []
        self.handlers: set[asyncio.Task[None]] = set()

    async def stop(self, listener: asyncio.Server) -> None:
        """No connection handler outlives the test (a later test checks that no task is left)."""
        listener.close()
        for task in self.handlers:
            task.cancel()
        await asyncio.gather(*self.handlers, return_exceptions=True)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        task.add_done_callback(self.handlers.discard)
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                path = lines[0].split()[1]
                length = next(
                    (int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")), 0
                )
                self.bodies.append(await reader.readexactly(length))
                if path == "/slow":
                    await asyncio.sleep(3600)
                if path == "/lines":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for n in range(3):
                        line = f"line {n}\n".encode()
                        writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                        await writer.drain()
                        await asyncio.sleep(0.05)
                    writer.write(b"0\r\n\r\n")
                    continue
                body = b"x" * (1 << 20) if path == "/big" else f"{path} {self.connections}".encode()
                close = path in ("/close", "/bye")
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n"
                    % (len(body), b"Connection: close\r\n" if path == "/close" else b"")
                    + body
                )
                await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[tuple[Server, str]]:
    handler = Server()
    listener = await asyncio.start_server(handler.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    yield handler, f"http://127.0.0.1:{port}"
    await handler.stop(listener)


def client(base: str, **kwargs: object) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(base_url=base, transport=H11Transport(**kwargs), timeout=5.0)  # type: ignore[arg-type]


async def test_a_connection_is_kept_between_requests_and_a_body_is_sent(server: tuple[Server, str]) -> None:
    handler, base = server
    async with client(base) as http:
        for _ in range(3):
            assert (await http.get("/hello")).text == "/hello 1"
        response = await http.post("/hello", json={"key": "a"})
        assert response.status_code == 200 and response.text == "/hello 1"
    assert handler.connections == 1 and handler.bodies[-1] == b'{"key":"a"}'


async def test_a_connection_the_server_closes_is_not_used_again(server: tuple[Server, str]) -> None:
    handler, base = server
    async with client(base) as http:
        assert (await http.get("/close")).text == "/close 1"
        assert (await http.get("/bye")).text == "/bye 2"
        await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        assert (await http.get("/hello")).text == "/hello 3"
    assert handler.connections == 3


async def test_an_idle_connection_past_its_expiry_is_replaced(server: tuple[Server, str]) -> None:
    handler, base = server
    async with client(base, keepalive_expiry=0.1) as http:
        await http.get("/hello")
        await asyncio.sleep(0.2)
        assert (await http.get("/hello")).text == "/hello 2"
    assert handler.connections == 2


async def test_a_stream_stopped_early_closes_its_connection_and_the_next_answer_is_whole(
    server: tuple[Server, str],
) -> None:
    handler, base = server
    async with client(base, max_connections=1) as http:
        async with http.stream("GET", "/big") as response:
            async for _ in response.aiter_bytes():
                break  # a watch stopped mid-stream
        assert (await http.get("/hello")).text == "/hello 2"
        async with http.stream("GET", "/lines") as response:
            assert [line async for line in response.aiter_lines()] == ["line 0", "line 1", "line 2"]
        assert (await http.get("/hello")).text == "/hello 2"  # read to the end: kept
        assert len((await http.get("/big")).content) == 1 << 20
    assert handler.connections == 2


async def test_timeouts_are_httpx_timeouts_and_free_their_slot(server: tuple[Server, str]) -> None:
    _, base = server
    async with client(base, max_connections=1) as http:
        with pytest.raises(httpx2.ReadTimeout):
            await http.get("/slow", timeout=httpx2.Timeout(5.0, read=0.1))
        async with http.stream("GET", "/lines"):
            with pytest.raises(httpx2.PoolTimeout):
                await http.get("/hello", timeout=httpx2.Timeout(5.0, pool=0.1))
        assert (await http.get("/hello")).status_code == 200  # both slots came back


async def test_a_cancelled_request_frees_its_slot(server: tuple[Server, str]) -> None:
    _, base = server
    async with client(base, max_connections=1) as http:
        task = asyncio.create_task(http.get("/slow"))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await http.get("/hello", timeout=httpx2.Timeout(1.0))).status_code == 200


async def test_a_closed_port_is_a_connect_error() -> None:
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    async with client(f"http://127.0.0.1:{port}", max_connections=1) as http:
        for _ in range(2):  # the failed connect gave its slot back
            with pytest.raises(httpx2.ConnectError):
                await http.get("/")


async def test_tls_sessions_the_server_ended_are_not_reused_nor_untrusted_servers_used(
    tmp_path: Path,
) -> None:
    now = datetime.now(UTC)
    ca = tls.new_ca("ca", now)
    serving = tls.issue(ca, "server", now, timedelta(days=1), ips=("127.0.0.1",))
    (tmp_path / "serving.pem").write_bytes(serving.cert + serving.key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "serving.pem")
    handler = Server()
    listener = await asyncio.start_server(handler.handle, "127.0.0.1", 0, ssl=context)
    base = f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        trusting = ssl.create_default_context(cadata=ca.cert.decode())
        async with client(base, ssl_context=trusting) as http:
            assert (await http.get("/hello")).text == "/hello 1"
            assert (await http.get("/hello")).text == "/hello 1"
            # The server ends the session (close_notify, then FIN) while the connection is idle.
            assert (await http.get("/bye")).text == "/bye 1"
            await asyncio.sleep(0.05)
            assert (await http.get("/hello")).text == "/hello 2"
        stranger = ssl.create_default_context(cadata=tls.new_ca("other", now).cert.decode())
        async with client(base, ssl_context=stranger) as http:
            with pytest.raises(httpx2.ConnectError) as refused:
                await http.get("/hello")
        assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
    finally:
        await handler.stop(listener)
