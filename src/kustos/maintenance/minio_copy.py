"""Copy every object of one S3 server to another, resumably, and verify (MinIO's move).

Blocking (boto3): the controller runs it in a thread. One call copies what a time budget
allows and says how far it got; what is already on the target with the same size and
checksum is skipped, so an interrupted copy (a crash, a restart, a failed request) resumes
from the objects themselves. Once nothing is left to copy, the same call verifies: every
key of the source is on the target with an equal checksum: the ETag where both are a plain
MD5 (a single-part upload), else a SHA-256 of both bodies.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

CHUNK = 1 << 20
MULTIPART_THRESHOLD = 64 << 20


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str


@dataclass(frozen=True)
class CopyResult:
    objects: int
    """Objects on the source."""
    in_place: int
    """Of those, on the target with the same size (and ETag, where comparable)."""
    verified: bool
    message: str


def client(endpoint: str, access_key: str, secret_key: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3},
                      connect_timeout=5, read_timeout=60),
    )  # fmt: skip


def _plain(etag: str) -> bool:
    """A single-part upload's ETag is the body's MD5; a multipart one ends in -<parts>."""
    return "-" not in etag


def _same(source: ObjectInfo, target: ObjectInfo | None) -> bool:
    if target is None or target.size != source.size:
        return False
    return source.etag == target.etag if _plain(source.etag) and _plain(target.etag) else True


def listing(s3: Any, bucket: str) -> dict[str, ObjectInfo]:
    found: dict[str, ObjectInfo] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents") or []:
            found[item["Key"]] = ObjectInfo(int(item["Size"]), str(item["ETag"]).strip('"'))
    return found


def _sha256(s3: Any, bucket: str, key: str) -> str:
    digest = hashlib.sha256()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(CHUNK), b""):
        digest.update(chunk)
    return digest.hexdigest()


def copy_pass(source: Any, target: Any, budget: float = 10.0) -> CopyResult:
    """Copy for up to ``budget`` seconds; verify when nothing is left to copy."""
    from boto3.s3.transfer import TransferConfig

    transfer = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD)
    deadline = time.monotonic() + budget
    buckets = [b["Name"] for b in source.list_buckets().get("Buckets") or []]
    existing = {b["Name"] for b in target.list_buckets().get("Buckets") or []}
    total = in_place = copied = 0
    listings: dict[str, tuple[dict[str, ObjectInfo], dict[str, ObjectInfo]]] = {}
    out_of_time = False
    for bucket in buckets:
        if bucket not in existing:
            target.create_bucket(Bucket=bucket)
        theirs, ours = listing(source, bucket), listing(target, bucket)
        listings[bucket] = (theirs, ours)
        total += len(theirs)
        for key, info in sorted(theirs.items()):
            if _same(info, ours.get(key)):
                in_place += 1
                continue
            # At least one object per pass, whatever the budget: every pass makes progress.
            if out_of_time or (copied and time.monotonic() > deadline):
                out_of_time = True
                continue
            body = source.get_object(Bucket=bucket, Key=key)
            extra = {"ContentType": body["ContentType"]} if body.get("ContentType") else {}
            target.upload_fileobj(body["Body"], bucket, key, ExtraArgs=extra, Config=transfer)
            copied += 1
            in_place += 1
    if copied or out_of_time:
        return CopyResult(total, in_place, False, (
            f"copied {copied} object(s) this pass; {in_place} of {total} in place"
        ))  # fmt: skip
    mismatched: list[str] = []
    for bucket, (theirs, ours) in listings.items():
        for key, info in sorted(theirs.items()):
            mine = ours[key]
            if _plain(info.etag) and _plain(mine.etag):
                equal = info.etag == mine.etag
            else:
                equal = _sha256(source, bucket, key) == _sha256(target, bucket, key)
            if not equal:
                # Removed, so that the next pass copies it again.
                target.delete_object(Bucket=bucket, Key=key)
                mismatched.append(f"{bucket}/{key}")
    if mismatched:
        raise VerificationFailed(f"checksums differ for {', '.join(mismatched[:5])}"
                                 f"{' ...' if len(mismatched) > 5 else ''}: copying again")  # fmt: skip
    return CopyResult(total, in_place, True, (
        f"verified: {total} object(s) in {len(buckets)} bucket(s), every key on the new MinIO with an "
        "equal checksum"
    ))  # fmt: skip


class VerificationFailed(Exception):
    """An object differs after the copy (it is copied again on the next pass)."""
