"""Probes: Kubernetes timing defaults, kubelet thresholds, and single probes against real sockets."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.devcluster.podspec import Invocation
from kustos.devcluster.probes import ProbeCounter, ProbeTiming, probe_once

HOST = "127.0.0.1"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes must reach the local server whatever proxy the developer's shell names."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


UNHURRIED = 10.0
"""The timeout of a probe that names none: what these tests check is the answer, and the
kubelet's 1 s default failed a probe of a server on 127.0.0.1 once, on a CI machine at load 12."""


async def probed(
    probe: dict[str, Any], container: dict[str, Any], host: str, run: Callable[[list[str]], Invocation]
) -> bool:
    return await probe_once({"timeoutSeconds": UNHURRIED, **probe}, container, host, run)


def _no_exec(command: list[str]) -> Invocation:
    raise AssertionError(f"no exec expected, got {command}")


def _run(command: list[str]) -> Invocation:
    return Invocation(argv=command, env={"PATH": "/usr/bin:/bin"}, cwd=None)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ---- timing -------------------------------------------------------------------------------


def test_probe_timing_defaults_are_the_kubernetes_defaults() -> None:
    timing = ProbeTiming.of({"tcpSocket": {"port": 2379}})

    assert timing == ProbeTiming(
        initial_delay=0.0, period=10.0, timeout=1.0, success_threshold=1, failure_threshold=3
    )
    assert ProbeTiming() == timing


def test_probe_timing_takes_the_probe_fields() -> None:
    probe = {
        "initialDelaySeconds": 5,
        "periodSeconds": 2,
        "timeoutSeconds": 3,
        "successThreshold": 2,
        "failureThreshold": 8,
    }

    assert ProbeTiming.of(probe) == ProbeTiming(
        initial_delay=5.0, period=2.0, timeout=3.0, success_threshold=2, failure_threshold=8
    )


# ---- thresholds ---------------------------------------------------------------------------


def test_readiness_passes_after_success_threshold_consecutive_successes() -> None:
    counter = ProbeCounter(ProbeTiming(success_threshold=3))

    assert [counter.record(True) for _ in range(2)] == [False, False]
    assert not counter.passing
    assert counter.record(True) is True
    assert counter.passing
    assert counter.record(True) is False


def test_a_failure_resets_the_success_streak() -> None:
    counter = ProbeCounter(ProbeTiming(success_threshold=2))

    counter.record(True)
    counter.record(False)
    assert counter.record(True) is False
    assert not counter.passing
    assert counter.record(True) is True


def test_a_passing_probe_fails_after_failure_threshold_consecutive_failures() -> None:
    counter = ProbeCounter(ProbeTiming(failure_threshold=3), passing=True)

    assert [counter.record(False) for _ in range(2)] == [False, False]
    assert counter.passing
    assert counter.record(False) is True
    assert not counter.passing
    assert counter.record(False) is False


def test_a_success_resets_the_failure_streak() -> None:
    counter = ProbeCounter(ProbeTiming(failure_threshold=2), passing=True)

    counter.record(False)
    counter.record(True)
    assert counter.record(False) is False
    assert counter.passing
    assert counter.record(False) is True


def test_failures_before_the_first_success_change_nothing() -> None:
    counter = ProbeCounter(ProbeTiming(failure_threshold=1))

    assert counter.record(False) is False
    assert not counter.passing


def _replay(counter: ProbeCounter, results: list[bool]) -> list[bool]:
    return [counter.record(ok) for ok in results]


@given(
    success_threshold=st.integers(1, 5),
    failure_threshold=st.integers(1, 5),
    start_passing=st.booleans(),
    results=st.lists(st.booleans(), max_size=60),
)
def test_probe_counter_matches_the_kubelet_rule(
    success_threshold: int, failure_threshold: int, start_passing: bool, results: list[bool]
) -> None:
    counter = ProbeCounter(
        ProbeTiming(success_threshold=success_threshold, failure_threshold=failure_threshold)
    )
    counter.passing = start_passing
    verdict = start_passing
    streak_ok, streak = None, 0
    for ok in results:
        streak = streak + 1 if ok == streak_ok else 1
        streak_ok = ok
        before = verdict
        if ok and streak >= success_threshold:
            verdict = True
        if not ok and streak >= failure_threshold:
            verdict = False

        changed = counter.record(ok)

        assert counter.passing == verdict
        assert changed == (verdict != before)


# ---- tcpSocket ----------------------------------------------------------------------------


@pytest.fixture
async def tcp_port() -> AsyncIterator[int]:
    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(accept, HOST, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


async def test_tcp_probe_passes_against_a_listening_port(tcp_port: int) -> None:
    assert await probed({"tcpSocket": {"port": tcp_port}}, {}, HOST, _no_exec)


async def test_tcp_probe_fails_against_a_closed_port() -> None:
    assert not await probed({"tcpSocket": {"port": _closed_port()}}, {}, HOST, _no_exec)


async def test_tcp_probe_resolves_a_named_container_port(tcp_port: int) -> None:
    container = {
        "ports": [{"name": "peer", "containerPort": 1}, {"name": "client", "containerPort": tcp_port}]
    }

    assert await probed({"tcpSocket": {"port": "client"}}, container, HOST, _no_exec)


async def test_tcp_probe_accepts_a_port_number_written_as_a_string(tcp_port: int) -> None:
    assert await probed({"tcpSocket": {"port": str(tcp_port)}}, {}, HOST, _no_exec)


async def test_probe_on_an_unknown_named_port_fails() -> None:
    container = {"ports": [{"name": "client", "containerPort": 2379}]}

    assert not await probed({"tcpSocket": {"port": "metrics"}}, container, HOST, _no_exec)


async def test_tcp_probe_host_field_wins_over_the_pod_ip(tcp_port: int) -> None:
    # 192.0.2.0/24 is reserved for documentation: nothing answers there.
    assert await probed({"tcpSocket": {"port": tcp_port, "host": HOST}}, {}, "192.0.2.1", _no_exec)


async def test_grpc_probe_passes_when_the_port_accepts_connections(tcp_port: int) -> None:
    assert await probed({"grpc": {"port": tcp_port}}, {}, HOST, _no_exec)
    assert not await probed({"grpc": {"port": _closed_port()}}, {}, HOST, _no_exec)


async def test_a_probe_of_no_known_kind_fails() -> None:
    assert not await probed({"periodSeconds": 1}, {}, HOST, _no_exec)


# ---- httpGet ------------------------------------------------------------------------------


async def _http_handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    request_line, *header_lines = head.split("\r\n")
    path = request_line.split(" ")[1]
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)}
    if path == "/hang":
        await reader.read()  # no answer until the client gives up and disconnects
    status = {
        "/healthz": "200 OK",
        "/": "204 No Content",
        "/moved": "302 Found",
        "/broken": "500 Internal Server Error",
        "/gone": "404 Not Found",
    }.get(path, "404 Not Found")
    if path == "/needs-header":
        status = "200 OK" if headers.get("x-probe") == "kustos" else "403 Forbidden"
    extra = "Location: /elsewhere\r\n" if path == "/moved" else ""
    writer.write(f"HTTP/1.1 {status}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    writer.close()


@pytest.fixture
async def http_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(_http_handler, HOST, 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    ("path", "ok"),
    [("/healthz", True), ("/moved", True), ("/broken", False), ("/gone", False), (None, True)],
)
async def test_http_probe_passes_on_2xx_and_3xx_only(http_port: int, path: str | None, ok: bool) -> None:
    http: dict[str, Any] = {"port": http_port}
    if path is not None:
        http["path"] = path

    assert await probed({"httpGet": http}, {}, HOST, _no_exec) is ok


async def test_http_probe_sends_the_configured_headers(http_port: int) -> None:
    bare = {"httpGet": {"port": http_port, "path": "/needs-header"}}
    with_header = {
        "httpGet": {
            "port": http_port,
            "path": "/needs-header",
            "httpHeaders": [{"name": "X-Probe", "value": "kustos"}],
        }
    }

    assert not await probed(bare, {}, HOST, _no_exec)
    assert await probed(with_header, {}, HOST, _no_exec)


async def test_http_probe_resolves_a_named_container_port(http_port: int) -> None:
    container = {"ports": [{"name": "metrics", "containerPort": http_port}]}

    assert await probed({"httpGet": {"port": "metrics", "path": "/healthz"}}, container, HOST, _no_exec)


async def test_http_probe_fails_against_a_closed_port() -> None:
    assert not await probed({"httpGet": {"port": _closed_port(), "path": "/"}}, {}, HOST, _no_exec)


async def test_http_probe_that_gets_no_answer_in_time_fails(http_port: int) -> None:
    probe = {"httpGet": {"port": http_port, "path": "/hang"}, "timeoutSeconds": 0.2}

    started = time.monotonic()
    assert not await probed(probe, {}, HOST, _no_exec)
    assert time.monotonic() - started < 5


async def test_http_probe_ignores_proxy_settings(http_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", f"http://{HOST}:{_closed_port()}")

    assert await probed({"httpGet": {"port": http_port, "path": "/healthz"}}, {}, HOST, _no_exec)


# ---- exec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "ok"), [(["/bin/true"], True), (["/bin/false"], False)])
async def test_exec_probe_passes_on_exit_code_zero(command: list[str], ok: bool) -> None:
    assert await probed({"exec": {"command": command}}, {}, HOST, _run) is ok


async def test_exec_probe_runs_in_the_invocation_environment_and_directory(tmp_path: Path) -> None:
    (tmp_path / "ready").touch()

    def resolve(command: list[str]) -> Invocation:
        return Invocation(argv=command, env={"PATH": "/usr/bin:/bin", "WANT": "yes"}, cwd=tmp_path)

    probe = {"exec": {"command": ["/bin/sh", "-c", 'test -f ready && test "$WANT" = yes']}}

    assert await probed(probe, {}, HOST, resolve)


async def test_exec_probe_of_a_missing_binary_fails(tmp_path: Path) -> None:
    probe = {"exec": {"command": [str(tmp_path / "no-such-binary")]}}

    assert not await probed(probe, {}, HOST, _run)


async def test_exec_probe_that_outlives_its_timeout_fails() -> None:
    probe = {"exec": {"command": ["/bin/sleep", "10"]}, "timeoutSeconds": 0.2}

    started = time.monotonic()
    assert not await probed(probe, {}, HOST, _run)
    assert time.monotonic() - started < 5
