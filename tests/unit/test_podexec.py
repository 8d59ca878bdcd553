"""The exec subresource's WebSocket frames, decoded (runtime/podexec.py): pure."""

from __future__ import annotations

import json

import pytest

from kustos.runtime.podexec import PROTOCOLS, Streams, exec_url, exit_code


def status(**fields: object) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, **fields}).encode()


def test_stdout_stderr_and_success() -> None:
    streams = Streams()
    for message in (
        b"\x01",
        b"\x02",
        b"\x01hello ",
        b"\x02warn",
        b"\x01world",
        b"\x03" + status(status="Success"),
    ):
        streams.feed(message)
    result = streams.result()
    assert (result.code, result.stdout, result.stderr) == (0, "hello world", "warn")


def test_non_zero_exit_code_from_the_status_causes() -> None:
    failure = status(
        status="Failure",
        message="command terminated with non-zero exit code: error executing command [ceph], exit code 2",
        reason="NonZeroExitCode",
        details={"causes": [{"reason": "ExitCode", "message": "2"}]},
    )
    assert exit_code(failure) == 2


def test_v5_close_frames_are_recorded_not_data() -> None:
    streams = Streams()
    streams.feed(b"\xff\x01")
    streams.feed(b"\x01out")
    streams.feed(b"\x03" + status(status="Success"))
    assert streams.closed == {1}
    assert streams.result().stdout == "out"


def test_a_status_split_over_frames_is_joined() -> None:
    body = status(status="Success")
    streams = Streams()
    streams.feed(b"\x03" + body[:10])
    streams.feed(b"\x03" + body[10:])
    assert streams.result().code == 0


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (b"", "closed without a status"),
        (b"container not found", "container not found"),
        (
            status(status="Failure", message='container "x" not found', reason="BadRequest"),
            'container "x" not found',
        ),
        (status(status="Failure", reason="NonZeroExitCode", details={"causes": []}), "NonZeroExitCode"),
    ],
)
def test_a_command_that_did_not_run_is_an_error_naming_why(error: bytes, said: str) -> None:
    with pytest.raises(ValueError, match=said):
        exit_code(error)


def test_unexpected_frames_are_refused() -> None:
    with pytest.raises(ValueError, match="text message"):
        Streams().feed("text")
    with pytest.raises(ValueError, match="channel 9"):
        Streams().feed(b"\x09x")


def test_output_is_bounded() -> None:
    streams = Streams()
    chunk = b"\x01" + b"x" * (1 << 19)
    for _ in range(4):
        streams.feed(chunk)
    assert len(streams.stdout) == 1 << 20


def test_exec_url() -> None:
    url = exec_url("https://127.0.0.1:6443/", "rook-ceph", "tools-1", ["ceph", "osd", "purge", "3"], "box")
    assert url == (
        "wss://127.0.0.1:6443/api/v1/namespaces/rook-ceph/pods/tools-1/exec"
        "?command=ceph&command=osd&command=purge&command=3&stdout=true&stderr=true&container=box"
    )
    assert exec_url("http://h:8080", "n", "p", ["ls"]).startswith("ws://h:8080/")
    with pytest.raises(ValueError, match="argv"):
        exec_url("https://h", "n", "p", [])
    with pytest.raises(ValueError, match="neither"):
        exec_url("unix:///x", "n", "p", ["ls"])


async def test_the_token_of_the_kubeconfig_is_sent() -> None:
    from kustos.runtime.kubeconfig import KubeAccess
    from kustos.runtime.podexec import _auth_headers

    config = KubeAccess(server="https://k8s:6443", token="s3cr3t")
    assert await _auth_headers(config, "wss://k8s:6443/api") == {"Authorization": "Bearer s3cr3t"}
    assert await _auth_headers(KubeAccess(server="https://k8s"), "wss://k8s/api") == {}


async def test_exec_in_pod_against_a_websocket_server() -> None:
    """The client end to end against a local server speaking the exec protocol: the command
    in the query, v5 chosen, output and exit code back; a 403 is a ReconcileError naming it."""
    from http import HTTPStatus

    from websockets.asyncio.server import ServerConnection, serve
    from websockets.datastructures import Headers
    from websockets.http11 import Request, Response

    from kustos.runtime.errors import ReconcileError
    from kustos.runtime.kubeconfig import KubeAccess
    from kustos.runtime.podexec import exec_in_pod

    seen: list[tuple[str, str | None]] = []

    async def handler(socket: ServerConnection) -> None:
        assert socket.request is not None
        seen.append((socket.request.path, socket.subprotocol))
        await socket.send(b"\x01")
        await socket.send(b"\x01osd.3 up\n")
        await socket.send(b"\x02slow\n")
        failure = status(
            status="Failure",
            reason="NonZeroExitCode",
            details={"causes": [{"reason": "ExitCode", "message": "22"}]},
        )
        await socket.send(b"\x03" + failure)

    def refuse(_: ServerConnection, request: Request) -> Response | None:
        if "/forbidden/" not in request.path:
            return None
        body = json.dumps({"kind": "Status", "message": 'pods "p" is forbidden: no'}).encode()
        return Response(HTTPStatus.FORBIDDEN, "Forbidden", Headers(), body)

    async with serve(handler, "127.0.0.1", 0, subprotocols=list(PROTOCOLS), process_request=refuse) as server:
        port = server.sockets[0].getsockname()[1]
        config = KubeAccess(server=f"http://127.0.0.1:{port}")
        result = await exec_in_pod(config, "rook", "tools", ["ceph", "osd", "ls"], timeout=10)
        assert (result.code, result.stdout, result.stderr) == (22, "osd.3 up\n", "slow\n")
        assert seen == [
            ("/api/v1/namespaces/rook/pods/tools/exec?command=ceph&command=osd&command=ls&stdout=true&stderr=true",
             "v5.channel.k8s.io")
        ]  # fmt: skip
        with pytest.raises(ReconcileError, match='HTTP 403: pods "p" is forbidden: no') as refused:
            await exec_in_pod(config, "forbidden", "p", ["ls"], timeout=10)
        assert refused.value.reason == "Forbidden"


async def test_no_status_and_no_answer_are_errors() -> None:

    from websockets.asyncio.server import ServerConnection, serve

    from kustos.runtime.errors import ReconcileError
    from kustos.runtime.kubeconfig import KubeAccess
    from kustos.runtime.podexec import exec_in_pod

    async def handler(socket: ServerConnection) -> None:
        assert socket.request is not None
        await socket.send(b"\x01partial")
        if "hang" in socket.request.path:
            await socket.wait_closed()

    async with serve(handler, "127.0.0.1", 0, subprotocols=list(PROTOCOLS)) as server:
        port = server.sockets[0].getsockname()[1]
        config = KubeAccess(server=f"http://127.0.0.1:{port}")
        with pytest.raises(ReconcileError, match="closed without a status"):
            await exec_in_pod(config, "n", "p", ["ls"], timeout=10)
        with pytest.raises(ReconcileError, match=r"no answer within 0\.2s") as hung:
            await exec_in_pod(config, "n", "hang", ["ls"], timeout=0.2)
        assert hung.value.reason == "ExecTimeout"


async def test_a_server_that_speaks_only_v4_is_used_with_v4() -> None:
    from websockets.asyncio.server import ServerConnection, serve
    from websockets.typing import Subprotocol

    from kustos.runtime.kubeconfig import KubeAccess
    from kustos.runtime.podexec import exec_in_pod

    chosen: list[str | None] = []

    async def handler(socket: ServerConnection) -> None:
        chosen.append(socket.subprotocol)
        await socket.send(b"\x01v4 out")
        await socket.send(b"\x03" + status(status="Success"))

    async with serve(handler, "127.0.0.1", 0, subprotocols=[Subprotocol("v4.channel.k8s.io")]) as server:
        port = server.sockets[0].getsockname()[1]
        config = KubeAccess(server=f"http://127.0.0.1:{port}")
        result = await exec_in_pod(config, "n", "p", ["ls"], timeout=10)
    assert (result.code, result.stdout, chosen) == (0, "v4 out", ["v4.channel.k8s.io"])
