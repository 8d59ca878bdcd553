"""Exec in a pod through the API server: the ``pods/exec`` subresource over WebSocket.

What ``kubectl exec`` does since Kubernetes 1.30 (client-go tools/remotecommand, WebSocket
executor): a GET upgraded to a WebSocket with the subprotocol ``v5.channel.k8s.io`` (else
``v4.channel.k8s.io``). Every binary message starts with a channel byte: 0 stdin, 1 stdout,
2 stderr, 3 the error channel (a metav1.Status once the command ended: ``Success``, or
``Failure`` with reason ``NonZeroExitCode`` and the code in ``details.causes`` as
``ExitCode``), and in v5 255, a close of the channel named by the next byte.

The connection uses the same server, CA, client certificate and token as the runtime's
client (one ``KubeAccess``). Every failure to run the command at all (refused,
forbidden, no such pod or container, timed out) is a ``ReconcileError``; a command that ran
and failed is an exit code.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import quote, urlencode

import httpx2

from kustos.runtime.errors import ReconcileError
from kustos.runtime.kubeconfig import KubeAccess

if TYPE_CHECKING:
    from websockets.typing import Subprotocol

# websockets (~1 MiB resident) is imported by the first exec: only Rook's StorageCluster runs one.
PROTOCOLS = cast("tuple[Subprotocol, ...]", ("v5.channel.k8s.io", "v4.channel.k8s.io"))
STDIN, STDOUT, STDERR, ERROR, CLOSE = 0, 1, 2, 3, 255
DEFAULT_TIMEOUT = 60.0
# What is kept of a command's output; more is cut (a Ceph command prints little).
MAX_OUTPUT = 1 << 20


@dataclass
class ExecResult:
    code: int
    stdout: str
    stderr: str


@dataclass
class Streams:
    """The frames of one exec, decoded (pure: fed message by message)."""

    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    error: bytearray = field(default_factory=bytearray)
    closed: set[int] = field(default_factory=set)

    def feed(self, message: bytes | str) -> None:
        if isinstance(message, str):  # the API server sends binary frames only
            raise ValueError("unexpected text message on an exec stream")
        if not message:
            return
        channel, data = message[0], message[1:]
        if channel == CLOSE:
            if data:
                self.closed.add(data[0])
            return
        target = {STDOUT: self.stdout, STDERR: self.stderr, ERROR: self.error}.get(channel)
        if target is None:
            raise ValueError(f"unexpected channel {channel} on an exec stream")
        # Zero-length frames (sent when a stream opens) carry nothing.
        room = MAX_OUTPUT - len(target)
        if room > 0:
            target += data[:room]

    def result(self) -> ExecResult:
        return ExecResult(
            exit_code(bytes(self.error)),
            self.stdout.decode(errors="replace"),
            self.stderr.decode(errors="replace"),
        )


def exit_code(error: bytes) -> int:
    """The exit code the error channel says; a ``ValueError`` naming what it said when the
    command did not run at all (or ended without a status)."""
    if not error.strip():
        raise ValueError("the exec stream closed without a status")
    try:
        status: dict[str, Any] = json.loads(error)
    except json.JSONDecodeError:
        # v1 and v2 wrote a bare error message here; v4+ a Status.
        raise ValueError(error.decode(errors="replace").strip()) from None
    if status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                try:
                    return int(cause.get("message", ""))
                except ValueError:
                    break
    raise ValueError(str(status.get("message") or status.get("reason") or "exec failed"))


def exec_url(server: str, namespace: str, pod: str, argv: list[str], container: str | None = None) -> str:
    """The ``wss://`` URL of the exec subresource (``ws://`` for a plain-HTTP server)."""
    if not argv:
        raise ValueError("argv must not be empty")
    scheme, _, rest = server.partition("://")
    ws_scheme = {"https": "wss", "http": "ws"}.get(scheme)
    if ws_scheme is None:
        raise ValueError(f"cluster server {server!r} is neither https:// nor http://")
    query: list[tuple[str, str]] = [("command", arg) for arg in argv]
    query += [("stdout", "true"), ("stderr", "true")]
    if container:
        query.append(("container", container))
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/exec"
    return f"{ws_scheme}://{rest.rstrip('/')}{path}?{urlencode(query)}"


async def _auth_headers(config: KubeAccess, url: str) -> dict[str, str]:
    """The Authorization header the runtime's client would send (token, token file, exec
    plugin, basic); client certificates travel in the TLS context instead."""
    auth = config.auth()
    if auth is None:
        return {}
    request = httpx2.Request("GET", url.replace("wss://", "https://", 1).replace("ws://", "http://", 1))
    flow = auth.async_auth_flow(request)
    try:
        request = await flow.__anext__()
    finally:
        await flow.aclose()
    value = request.headers.get("Authorization")
    return {"Authorization": value} if value else {}


def _tls(config: KubeAccess, url: str) -> ssl.SSLContext | None:
    if not url.startswith("wss://"):
        return None
    return config.ssl_context()


async def exec_in_pod(
    config: KubeAccess,
    namespace: str,
    pod: str,
    argv: list[str],
    container: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> ExecResult:
    """Run ``argv`` in ``namespace/pod`` (its first container unless ``container``) and wait
    for it, at most ``timeout`` seconds in all."""
    import websockets
    from websockets.asyncio.client import connect

    where = f"exec in pod {namespace}/{pod}"
    streams = Streams()
    try:
        url = exec_url(config.server, namespace, pod, argv, container)
        headers = await _auth_headers(config, url)
        async with asyncio.timeout(timeout):
            async with connect(
                url,
                ssl=_tls(config, url),
                additional_headers=headers,
                subprotocols=list(PROTOCOLS),
                open_timeout=timeout,
                compression=None,
                max_size=None,
            ) as socket:
                try:
                    async for message in socket:
                        streams.feed(message)
                except websockets.ConnectionClosedError:
                    # Closed without a close frame: the status, once it came, is the answer.
                    if not streams.error:
                        raise
        return streams.result()
    except websockets.InvalidStatus as err:
        response = err.response
        body = response.body.decode(errors="replace") if response.body else ""
        try:
            message = json.loads(body).get("message") or body
        except (json.JSONDecodeError, AttributeError):
            message = body
        reason = "Forbidden" if response.status_code == 403 else "ExecFailed"
        raise ReconcileError(
            f"{where}: HTTP {response.status_code}: {message.strip()[:300]}", reason
        ) from err
    except TimeoutError as err:
        raise ReconcileError(f"{where}: no answer within {timeout:g}s", "ExecTimeout") from err
    except ValueError as err:
        said = streams.stderr.decode(errors="replace").strip()
        tail = f" (stderr: {said[-300:]})" if said else ""
        raise ReconcileError(f"{where}: {err}{tail}", "ExecFailed") from err
    except (OSError, websockets.WebSocketException) as err:
        raise ReconcileError(f"{where}: {type(err).__name__}: {err}", "ExecFailed") from err


__all__ = ["PROTOCOLS", "ExecResult", "Streams", "exec_in_pod", "exec_url", "exit_code"]
