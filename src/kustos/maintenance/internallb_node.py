"""``kustos internal-lb write|idle``: the internal load balancer's side on a node.

``write`` runs in the writer DaemonSet's init container (``internallb.writer_daemonset``): it
renders HAProxy's configuration and the static pod from its arguments, replaces the files
that differ (a write then a rename, so HAProxy and the kubelet never read half a file), and,
when HAProxy already runs, asks its master process to reload through the master socket. The
master re-reads the file and starts new workers; if the new file is refused it keeps the old
workers serving, and counts a failed reload, which ``write`` reads back and turns into a
failure: the pod does not get Ready and the rollout stops on that node. ``idle`` is the pod's
main container: it only waits, so the pod's readiness says the node has the current files.

Only the standard library and the pure renderer: this runs once per node per change.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from kustos.maintenance.internallb import (
    CONFIG_FILE,
    MANIFEST_FILE,
    MASTER_SOCKET,
    ApiServer,
    manifest_text,
    render_config,
)

internal_lb = typer.Typer(help="The internal load balancer's files on a node (run by kustos's DaemonSet).")

RELOAD_TIMEOUT = 30.0
_FAILED = re.compile(r"\[failed:\s*(\d+)\]")


class ReloadFailed(RuntimeError):
    """HAProxy refused the new configuration (its old workers keep serving)."""


def replace_file(path: Path, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` unless it is there already; True when it changed."""
    with contextlib.suppress(FileNotFoundError):
        if path.read_text() == text:
            return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as out:
        out.write(text)
        out.flush()
        os.fchmod(out.fileno(), mode)
    Path(out.name).replace(path)
    return True


def master_command(socket_path: Path, command: str, timeout: float = 5.0) -> str:
    """One command on HAProxy's master CLI; its answer (the master closes after one).

    The socket is reached by a name relative to its directory: a node's path may be longer
    than the 107 bytes a Unix socket address holds."""
    here = Path.cwd()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        os.chdir(socket_path.parent)
        try:
            conn.connect(socket_path.name)
        finally:
            os.chdir(here)
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)  # no more commands: the master answers and closes
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def failed_reloads(show_proc: str) -> int | None:
    """The master's count of refused reloads in ``show proc`` (None: not said)."""
    found = _FAILED.search(show_proc)
    return int(found.group(1)) if found else None


def reload(socket_path: Path, timeout: float = RELOAD_TIMEOUT) -> str:
    """Reload a running HAProxy; raise ``ReloadFailed`` when it refused the configuration."""
    before = failed_reloads(master_command(socket_path, "show proc"))
    with contextlib.suppress(OSError):  # the master re-executes itself and drops the connection
        master_command(socket_path, "reload")
    deadline = time.monotonic() + timeout
    while True:
        try:
            after = failed_reloads(master_command(socket_path, "show proc"))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise ReloadFailed(
                    f"HAProxy's master did not answer within {timeout:.0f}s of a reload"
                ) from None
            time.sleep(0.2)
    if before is not None and after is not None and after > before:
        raise ReloadFailed("HAProxy refused the new configuration; the previous one keeps serving")
    return "reloaded"


def _reload_if_running(master: Path, wait: float = 10.0) -> str:
    """Reload the HAProxy behind ``master``. A master still starting (it may have read the old
    file) is waited for; a socket left by a stopped HAProxy is not: its next start reads the file."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return reload(master)
        except OSError as err:
            if time.monotonic() > deadline:
                return f"no running HAProxy answered at {master} ({err}); it reads the file when it starts"
            time.sleep(0.2)


def write(
    servers: list[ApiServer], port: int, bind_address: str, haproxy_image: str,
    haproxy_dir: Path, manifests_dir: Path, run_dir: Path,
) -> list[str]:  # fmt: skip
    """Put the files in place, configuration first (a static pod starting reads it), and reload
    a running HAProxy whose configuration changed. Returns what was done."""
    done = []
    if replace_file(haproxy_dir / CONFIG_FILE, render_config(servers, bind_address, port)):
        done.append(f"wrote {haproxy_dir / CONFIG_FILE}: {', '.join(map(str, servers))}")
        master = run_dir / MASTER_SOCKET
        if master.exists():
            done.append(_reload_if_running(master))
    if replace_file(manifests_dir / MANIFEST_FILE, manifest_text(haproxy_image, port, bind_address)):
        done.append(f"wrote {manifests_dir / MANIFEST_FILE}")
    return done or ["the files were current"]


@internal_lb.command("write")
def write_command(
    server: Annotated[list[str], typer.Option(help="An API server, node=host:port (repeat).")],
    port: Annotated[int, typer.Option(help="Where HAProxy listens.")] = 6444,
    bind_address: Annotated[str, typer.Option(help="The address HAProxy listens on.")] = "127.0.0.1",
    haproxy_image: Annotated[str, typer.Option(help="The static pod's image.")] = "haproxy:lts-alpine",
    haproxy_dir: Annotated[Path, typer.Option(help="The node's /etc/haproxy.")] = Path("/etc/haproxy"),
    manifests_dir: Annotated[Path, typer.Option(help="The kubelet's static pod directory.")] = Path(
        "/etc/kubernetes/manifests"
    ),
    run_dir: Annotated[Path, typer.Option(help="Where HAProxy's master socket is.")] = Path(
        "/var/run/kustos-haproxy"
    ),
) -> None:
    """Write HAProxy's configuration and static pod on this node; reload a running HAProxy."""
    try:
        servers = [ApiServer.parse(s) for s in server]
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--server") from err
    try:
        for line in write(servers, port, bind_address, haproxy_image, haproxy_dir, manifests_dir, run_dir):
            typer.echo(line)
    except ReloadFailed as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from err


@internal_lb.command("idle")
def idle_command() -> None:
    """Wait until stopped (the writer pod's main container)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        signal.pause()
