"""The dev S3 server (versitygw) with a real S3 client, as etcd backups to S3 will use it (F-ETCD-7).

No Kubernetes here: one versitygw process on 127.0.0.1 with data under tmp_path. Nothing
skips: a missing versitygw binary is built first, and a failed build fails the test.
"""

from __future__ import annotations

import hashlib
import http.client
import os
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import PermissionDeniedError
from obstore.store import S3Store

from kustos.devcluster import binaries
from kustos.devcluster.s3 import S3Server, S3ServerConfig, S3ServerError

BUCKET = "etcd-backups"
MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def versitygw_binary() -> None:
    binaries.build_missing("versitygw")


@pytest.fixture
def s3(tmp_path: Path) -> Iterator[S3Server]:
    server = S3Server(S3ServerConfig(data_dir=tmp_path / "s3", buckets=(BUCKET,)))
    server.start(timeout=30)
    try:
        yield server
    finally:
        server.stop()


def _store(server: S3Server, bucket: str = BUCKET, secret: str | None = None) -> S3Store:
    """Path-style requests to the custom endpoint, as for any S3-compatible store."""
    return S3Store(
        bucket,
        endpoint=server.endpoint,
        access_key_id=server.config.access_key,
        secret_access_key=secret or server.config.secret_key,
        region=server.config.region,
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "timeout": "30s"},
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MiB):
            digest.update(chunk)
    return digest.hexdigest()


async def test_an_object_is_uploaded_listed_and_downloaded(s3: S3Server) -> None:
    store = _store(s3)
    snapshot = os.urandom(64 * 1024)

    await obstore.put_async(store, "example/2026-01-01T00:00:00Z.db", snapshot)
    listed = [meta async for batch in obstore.list(store, prefix="example/") for meta in batch]
    downloaded = await obstore.get_async(store, "example/2026-01-01T00:00:00Z.db")

    assert [(m["path"], m["size"]) for m in listed] == [("example/2026-01-01T00:00:00Z.db", len(snapshot))]
    assert bytes(await downloaded.bytes_async()) == snapshot
    # The posix backend keeps it as a plain file, for tests to look at directly.
    assert (s3.root / BUCKET / "example" / "2026-01-01T00:00:00Z.db").read_bytes() == snapshot


def test_a_large_file_streams_up_in_parts_and_back(s3: S3Server, tmp_path: Path) -> None:
    store = _store(s3)
    source = tmp_path / "snapshot.db"
    with source.open("wb") as f:
        for _ in range(24):
            f.write(os.urandom(MiB))

    obstore.put(store, "big/snapshot.db", source, use_multipart=True, chunk_size=5 * MiB, max_concurrency=2)
    target = tmp_path / "restored.db"
    with target.open("wb") as f:
        for chunk in obstore.get(store, "big/snapshot.db").stream(min_chunk_size=MiB):
            f.write(chunk)

    assert _sha256(target) == _sha256(source)
    # 24 MiB in 5 MiB parts: one multipart upload of five parts, completed once.
    parts = [line for line in s3.log_tail(200).splitlines() if "| PUT | /etcd-backups/big/" in line]
    assert len(parts) == 5 and all("partNumber=" in line for line in parts)


def test_a_wrong_secret_is_refused(s3: S3Server) -> None:
    with pytest.raises(PermissionDeniedError, match="SignatureDoesNotMatch"):
        obstore.put(_store(s3, secret="not-the-secret"), "x", b"x")


def test_objects_and_buckets_survive_a_restart_on_the_same_data(s3: S3Server) -> None:
    obstore.put(_store(s3), "kept", b"still here")
    first_port = s3.port
    s3.stop()

    refused = http.client.HTTPConnection("127.0.0.1", first_port, timeout=2)
    with pytest.raises(ConnectionRefusedError):
        refused.request("GET", "/health")
    refused.close()

    s3.start(timeout=30)  # creates BUCKET again: it exists already, which is fine

    assert bytes(obstore.get(_store(s3), "kept").bytes()) == b"still here"


def test_only_loopback_is_served(s3: S3Server) -> None:
    assert s3.endpoint == f"http://127.0.0.1:{s3.port}"
    assert s3.process is not None
    net = Path(f"/proc/{s3.process.pid}/net")

    def listeners(table: str) -> list[str]:
        rows = [line.split() for line in (net / table).read_text().splitlines()[1:]]
        # Columns: slot, local address:port (hex), remote, state (0A is LISTEN).
        return [row[1] for row in rows if row[3] == "0A" and row[1].endswith(f":{s3.port:04X}")]

    assert listeners("tcp") == [f"0100007F:{s3.port:04X}"]  # 127.0.0.1, little-endian hex
    assert listeners("tcp6") == []


def test_a_missing_binary_is_a_clear_error(tmp_path: Path) -> None:
    server = S3Server(S3ServerConfig(data_dir=tmp_path / "s3"), binary=tmp_path / "no-such-versitygw")

    with pytest.raises(S3ServerError, match="kustos dev build"):
        server.start(timeout=5)
