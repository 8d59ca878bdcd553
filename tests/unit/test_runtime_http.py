"""The operator's small HTTP server, spoken to over real loopback sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from kustos.runtime import http
from kustos.runtime.http import HttpServer, Request, Response


async def echo(request: Request) -> Response:
    return Response.json({"method": request.method, "path": request.path, "size": len(request.body)})


async def broken(_: Request) -> Response:
    raise RuntimeError("boom")


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    server = HttpServer("127.0.0.1", 0)
    server.route("POST", "/echo", echo)
    server.route("GET", "/broken", broken)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_routes_by_path_ignoring_the_query(server: HttpServer) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        response = await client.post(f"http://127.0.0.1:{server.port}/echo?x=1", content=b"abc")
    assert response.json() == {"method": "POST", "path": "/echo", "size": 3}


async def test_unknown_path_is_404_and_wrong_method_405(server: HttpServer) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        assert (await client.get(f"http://127.0.0.1:{server.port}/nowhere")).status_code == 404
        assert (await client.get(f"http://127.0.0.1:{server.port}/echo")).status_code == 405


async def test_a_failing_handler_is_a_500_and_the_server_goes_on(server: HttpServer) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        assert (await client.get(f"http://127.0.0.1:{server.port}/broken")).status_code == 500
        assert (await client.post(f"http://127.0.0.1:{server.port}/echo")).status_code == 200


async def test_keep_alive_serves_many_requests_on_one_connection(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    request = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
    writer.write(request * 3)
    await writer.drain()
    answers = b""
    while answers.count(b'"size": 2') < 3:
        answers += await asyncio.wait_for(reader.read(4096), 5)
    assert answers.count(b"HTTP/1.1 200") == 3
    writer.close()


async def test_an_oversized_body_is_refused_with_413(
    server: HttpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http, "MAX_BODY", 10)
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        response = await client.post(f"http://127.0.0.1:{server.port}/echo", content=b"x" * 100)
    assert response.status_code == 413


async def test_garbage_gets_a_400_not_a_crash(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"NONSENSE\r\n\r\n")
    await writer.drain()
    assert (await asyncio.wait_for(reader.read(4096), 5)).startswith(b"HTTP/1.1 400")
    writer.close()
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        assert (await client.post(f"http://127.0.0.1:{server.port}/echo")).status_code == 200
