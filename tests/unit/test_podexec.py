"""The exec subresource's WebSocket frames, decoded (runtime/podexec.py): pure."""

from __future__ import annotations

import json

import pytest

from kustos.runtime.podexec import Streams, exec_url, exit_code


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
