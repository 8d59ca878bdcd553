"""The recorder takes a changed client certificate while it records (a renewal, a CA rotation).

An HTTPS endpoint on loopback stands in for etcd's JSON gateway (its range answer: revision 1,
no keys) and notes which client certificate each request came with; the recorder reads its
files from a directory laid out as the kubelet mounts a Secret (``ca.crt -> ..data/ca.crt``,
``..data`` swapped at once), or written a file at a time.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from kustos.cli import app
from kustos.etcd import tls
from kustos.etcd.client import EtcdTLS
from kustos.proof.history import Operation, load_history
from kustos.proof.recorder import TLS_RELOAD_EVERY, Recording, Workload, record
from tests.mount_support import write_mounted

NOW = datetime.now(UTC)
DAY = timedelta(days=1)


def serial(cert: bytes) -> str:
    return tls.info(cert).serial


@asynccontextmanager
async def gateway(directory: Path, client_cas: bytes) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTPS endpoint that requires a client certificate of ``client_cas`` and answers every
    request as etcd's gateway answers a range of nothing; yields its URL and the serial of the
    client certificate of each request, in order."""
    server_ca = tls.new_ca("server-ca", NOW)
    leaf = tls.issue(server_ca, "etcd", NOW, DAY, ips=("127.0.0.1",))
    for name, pem in (("server-ca.crt", server_ca.cert), ("server.crt", leaf.cert), ("server.key", leaf.key),
                      ("client-cas.crt", client_cas)):  # fmt: skip
        (directory / name).write_bytes(pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "server.crt", directory / "server.key")
    context.load_verify_locations(directory / "client-cas.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []
    handlers: set[asyncio.Task[None]] = set()
    body = json.dumps({"header": {"revision": "1"}}).encode()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        presented = serial(ssl.DER_cert_to_PEM_cert(peer).encode())
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )  # fmt: skip
                await reader.readexactly(length)
                seen.append(presented)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
                )  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"https://127.0.0.1:{port}", seen
    finally:
        server.close()
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


def mounted(directory: Path, version: str, ca: bytes, client: tls.KeyPair) -> None:
    write_mounted(directory, version, {"ca.crt": ca, "tls.crt": client.cert, "tls.key": client.key})


LOAD = 4.0  # seconds of reads by two clients, 40 a second


async def recorded(url: str, client_files: EtcdTLS, history: Path, during: Callable[[], None]) -> Recording:
    """The load's history; ``during`` changes the files a second in."""
    load = Workload((url,), clients=2, watchers=0, keys=1, rate=40, duration=LOAD, mix={"get": 1},
                    tls=client_files)  # fmt: skip

    async def change() -> None:
        await asyncio.sleep(1.0)
        during()

    changing = asyncio.create_task(change())
    recording = await record(load, history, settle=5.0)
    await changing
    return recording


def calls(history: Path) -> list[Operation]:
    return load_history(history).operations


def mount_files(directory: Path) -> EtcdTLS:
    return EtcdTLS(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")


async def test_a_renewed_client_certificate_is_presented_from_the_next_calls_on_and_no_call_fails(
    tmp_path: Path,
) -> None:
    old_ca, new_ca = tls.new_ca("old", NOW), tls.new_ca("new", NOW)
    old = tls.issue(old_ca, "client", NOW, DAY, server=False)
    new = tls.issue(new_ca, "client", NOW, DAY, server=False)
    server_dir, mount = tmp_path / "server", tmp_path / "mount"
    server_dir.mkdir()
    mount.mkdir()
    async with gateway(server_dir, old_ca.cert + new_ca.cert) as (url, seen):
        # The bundle holds the stand-in's CA too: the recorder checks the server it talks to.
        trusted = (server_dir / "server-ca.crt").read_bytes()
        mounted(mount, "1", trusted + old_ca.cert, old)
        recording = await recorded(
            url, mount_files(mount), tmp_path / "h.jsonl",
            lambda: mounted(mount, "2", trusted + old_ca.cert + new_ca.cert, new),
        )  # fmt: skip
    assert all(op.outcome == "ok" for op in calls(tmp_path / "h.jsonl")), "a call failed across the renewal"
    assert seen[0] == serial(old.cert)
    # Once taken, the renewed certificate is the only one presented: the last calls (after the
    # change and a reload period) all came with it.
    switched = seen.index(serial(new.cert))
    assert set(seen[switched + 2 :]) == {serial(new.cert)}
    assert len(seen) - switched > 10
    assert recording.tls_reloads == 1


async def test_files_written_one_at_a_time_are_taken_once_they_agree(tmp_path: Path) -> None:
    """A certificate written before its key does not load: the recorder keeps the last good set
    (no call fails) and takes the new one once the key follows."""
    ca = tls.new_ca("ca", NOW)
    old = tls.issue(ca, "client", NOW, DAY, server=False)
    new = tls.issue(ca, "client", NOW, DAY, server=False)
    server_dir, files = tmp_path / "server", tmp_path / "files"
    server_dir.mkdir()
    files.mkdir()
    async with gateway(server_dir, ca.cert) as (url, seen):
        (files / "ca.crt").write_bytes((server_dir / "server-ca.crt").read_bytes())
        (files / "tls.crt").write_bytes(old.cert)
        (files / "tls.key").write_bytes(old.key)
        client_files = EtcdTLS(files / "ca.crt", files / "tls.crt", files / "tls.key")

        async def key_later() -> None:
            await asyncio.sleep(1.5 * TLS_RELOAD_EVERY)  # the mismatched pair is read meanwhile
            (files / "tls.key").write_bytes(new.key)

        later: list[asyncio.Task[None]] = []

        def certificate_first() -> None:
            (files / "tls.crt").write_bytes(new.cert)
            later.append(asyncio.create_task(key_later()))

        await recorded(url, client_files, tmp_path / "h.jsonl", certificate_first)
        await asyncio.gather(*later)
    assert all(op.outcome == "ok" for op in calls(tmp_path / "h.jsonl"))
    assert seen[0] == serial(old.cert) and seen[-1] == serial(new.cert)


def test_record_refuses_a_key_without_its_certificate_and_files_that_do_not_load(tmp_path: Path) -> None:
    base = ["proof", "record", "--endpoint", "https://127.0.0.1:2379", "--out", str(tmp_path / "h.jsonl")]
    result = CliRunner().invoke(app, [*base, "--key", str(tmp_path / "k")])
    assert result.exit_code == 2 and "--key needs --cert" in result.output
    (tmp_path / "c").write_text("not a certificate")
    (tmp_path / "k").write_text("not a key")
    result = CliRunner().invoke(app, [*base, "--cert", str(tmp_path / "c"), "--key", str(tmp_path / "k")])
    assert result.exit_code == 2 and "--cacert/--cert/--key" in result.output
