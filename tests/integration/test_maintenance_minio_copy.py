"""MinIO's data copy (maintenance/minio_copy.py) between two real S3 servers, interrupted and resumed.

Two versitygw processes on 127.0.0.1 stand for the old and the new MinIO (the copy speaks
plain S3 to both; the whole move runs real MinIO, test_maintenance_minio_real_nodes.py).
A pass whose time budget runs out leaves objects behind; the next pass copies only what is
missing and then verifies every key's checksum. A corrupted copy on the target is found
by its checksum and copied again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import binaries
from kustos.devcluster.s3 import S3Server, S3ServerConfig
from kustos.maintenance import minio_copy

BUCKETS = ("registry", "kotsadm")


@pytest.fixture(scope="module", autouse=True)
def versitygw_binary() -> None:
    binaries.build_missing("versitygw")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[S3Server, S3Server]]:
    old = S3Server(S3ServerConfig(data_dir=tmp_path / "old", buckets=BUCKETS))
    new = S3Server(S3ServerConfig(data_dir=tmp_path / "new"))
    with old, new:
        yield old, new


def client(server: S3Server) -> Any:
    return minio_copy.client(server.endpoint, server.config.access_key, server.config.secret_key)


def contents(s3: Any) -> dict[str, str]:
    """bucket/key -> SHA-256 of the body, for every object."""
    found = {}
    for bucket in (b["Name"] for b in s3.list_buckets()["Buckets"]):
        for key in minio_copy.listing(s3, bucket):
            body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            found[f"{bucket}/{key}"] = hashlib.sha256(body).hexdigest()
    return found


def test_an_interrupted_copy_resumes_and_verifies(servers: tuple[S3Server, S3Server]) -> None:
    old, new = servers
    source, target = client(old), client(new)
    for index in range(40):
        bucket = BUCKETS[index % 2]
        source.put_object(Bucket=bucket, Key=f"dir/{index:03d}", Body=os.urandom(1000 + index * 97))
    source.put_object(Bucket="registry", Key="big", Body=os.urandom(3 << 20))
    written = contents(source)

    # No time at all: one object per pass, never the verification.
    first = minio_copy.copy_pass(source, target, budget=0.0)
    assert not first.verified and first.objects == 41 and first.in_place == 1
    passes = 1
    while True:
        result = minio_copy.copy_pass(source, target, budget=0.05)
        passes += 1
        if result.verified:
            break
        assert passes < 200, result.message
    assert passes > 2, "the small budget should have interrupted the copy"
    assert result.objects == result.in_place == 41
    assert contents(target) == written

    # A copy corrupted behind our back (same size, other bytes) is caught by its checksum and
    # copied again.
    damaged = bytearray(target.get_object(Bucket="kotsadm", Key="dir/001")["Body"].read())
    damaged[0] ^= 0xFF
    target.put_object(Bucket="kotsadm", Key="dir/001", Body=bytes(damaged))
    again = minio_copy.copy_pass(source, target)
    assert not again.verified and "copied 1 object" in again.message
    assert minio_copy.copy_pass(source, target).verified
    assert contents(target) == written
