"""The snapshot agent: verify a member's snapshot, store it, prune old ones.

It runs in a short-lived pod with the operator's own image (``kustos etcd snapshot``),
so snapshot bytes never pass through the operator and a slow upload never holds up a
reconcile. In the operator's agent pods ``etcdctl snapshot save`` (gRPC, in an init
container of the etcd image) has already written the file and this only verifies and
stores it (``store_snapshot``); by hand, ``take_snapshot`` streams it through etcd's
JSON gateway first (about 4x slower). Either way a snapshot is stored only once etcd's
own checksum has been verified: a bucket or volume never holds a partial snapshot under
a final name. The last line printed is the result, for the operator to read from the
pod's log.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kustos.etcd.agent_report import RESULT_MARKER, SnapshotResult
from kustos.etcd.bolt import BoltError, snapshot_revision
from kustos.etcd.client import SNAPSHOT_SHA256_SIZE, EtcdClient, EtcdTLS
from kustos.runtime.times import rfc3339

if TYPE_CHECKING:
    from obstore.store import S3Store

SNAPSHOT_SUFFIX = ".db"
UPLOAD_PART = 8 * 1024 * 1024
UPLOAD_CONCURRENCY = 4
READ_CHUNK = 1024 * 1024
VERIFY_CHUNK = 8 * 1024 * 1024


def scheduled_name(cluster: str, moment: datetime) -> str:
    """The name of a scheduled backup: sorts by time, and retention recognises it."""
    return f"{cluster}-{moment.astimezone(UTC):%Y%m%d-%H%M%S}"


def to_prune(names: list[str], cluster: str, keep: int) -> list[str]:
    """Scheduled snapshots of ``cluster`` beyond the newest ``keep``; on-demand ones are never pruned."""
    pattern = re.compile(rf"^{re.escape(cluster)}-\d{{8}}-\d{{6}}{re.escape(SNAPSHOT_SUFFIX)}$")
    scheduled = sorted(n for n in names if pattern.match(n))
    return scheduled[: max(0, len(scheduled) - keep)]


class Destination(Protocol):
    """Where verified snapshots are kept (a directory on a PVC, or a bucket)."""

    async def store(self, spooled: Path, name: str) -> str: ...

    async def names(self) -> list[str]: ...

    async def delete(self, names: list[str]) -> None: ...


@dataclass
class DirectoryDestination:
    """Files in a directory (on the backup PVC): written as .part, renamed once complete."""

    root: Path
    location_prefix: str = ""  # like pvc://<claim>/<dir>: the agent's own paths mean nothing outside

    async def store(self, spooled: Path, name: str) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / name
        try:  # on the same volume (etcdctl saved it on the claim): storing is a rename
            spooled.replace(final)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
            # another filesystem: copy as .part, then rename
            partial = self.root / (name + ".part")
            with spooled.open("rb") as source, partial.open("wb") as target:
                while chunk := source.read(READ_CHUNK):
                    target.write(chunk)
                target.flush()
                os.fsync(target.fileno())
            partial.replace(final)
        _fsync_directory(self.root)
        return f"{self.location_prefix}/{name}" if self.location_prefix else str(final)

    async def names(self) -> list[str]:
        return sorted(p.name for p in self.root.glob(f"*{SNAPSHOT_SUFFIX}")) if self.root.is_dir() else []

    async def delete(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)


def _fsync_directory(path: Path) -> None:
    """Make a rename into ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class S3Destination:
    """Objects under a prefix of a bucket, uploaded in parts of bounded size."""

    store_: S3Store
    bucket: str
    prefix: str

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    async def store(self, spooled: Path, name: str) -> str:
        import obstore

        await obstore.put_async(
            self.store_, self._key(name), spooled, chunk_size=UPLOAD_PART, max_concurrency=UPLOAD_CONCURRENCY
        )
        return f"s3://{self.bucket}/{self._key(name)}"

    async def names(self) -> list[str]:
        import obstore

        found: list[str] = []
        async for batch in obstore.list(self.store_, prefix=self.prefix or None):
            found += [str(item["path"]).rsplit("/", 1)[-1] for item in batch]
        return sorted(n for n in found if n.endswith(SNAPSHOT_SUFFIX))

    async def delete(self, names: list[str]) -> None:
        import obstore

        if names:
            await obstore.delete_async(self.store_, [self._key(n) for n in names])


def s3_store(endpoint: str, bucket: str, region: str, path_style: bool) -> S3Store:
    """An S3 client for one bucket; credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY."""
    from obstore.store import S3Store

    return S3Store(
        bucket,
        endpoint=endpoint,
        access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
        secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
        region=region,
        virtual_hosted_style_request=not path_style,
        client_options={"allow_http": endpoint.startswith("http://"), "timeout": "300s"},
    )


async def take_snapshot(
    endpoint: str,
    member: str,
    name: str,
    destination: Destination,
    scratch: Path,
    cluster: str,
    keep: int | None = None,
    tls: EtcdTLS | None = None,
) -> SnapshotResult:
    """Spool, verify, store, then prune scheduled snapshots beyond ``keep``."""
    started_at = datetime.now(UTC)
    started = time.monotonic()
    file_name = name + SNAPSHOT_SUFFIX
    scratch.mkdir(parents=True, exist_ok=True)
    spooled = scratch / (file_name + ".part")
    digest = hashlib.sha256()
    with spooled.open("wb") as sink:

        async def write(chunk: bytes) -> None:
            digest.update(chunk)
            sink.write(chunk)

        async with EtcdClient(endpoint, tls, timeout=30.0) as client:
            before = await client.status()
            info = await client.snapshot(write, timeout=3600)  # raises unless etcd's checksum matches
        sink.flush()
        os.fsync(sink.fileno())
    try:
        location = await destination.store(spooled, file_name)
    finally:
        spooled.unlink(missing_ok=True)
    pruned = await _prune(destination, cluster, keep)
    return SnapshotResult(
        location=location,
        member=member,
        revision=info.revision if info.revision is not None else before.revision,
        size=info.size,
        sha256=digest.hexdigest(),
        start_time=rfc3339(started_at),
        completion_time=rfc3339(datetime.now(UTC)),
        duration_seconds=round(time.monotonic() - started, 3),
        pruned=pruned,
    )


async def _prune(destination: Destination, cluster: str, keep: int | None) -> list[str]:
    """Delete the cluster's scheduled snapshots beyond ``keep`` (None: keep all); their names."""
    if keep is None:
        return []
    pruned = to_prune(await destination.names(), cluster, keep)
    await destination.delete(pruned)
    return pruned


class SnapshotCorrupt(Exception):
    """A snapshot file that etcd's own checks would refuse."""


@dataclass(frozen=True)
class VerifiedSnapshot:
    size: int
    """Bytes of the file: the database and etcd's 32-byte SHA-256 trailer."""
    sha256: str
    """Hex SHA-256 of the whole file, as it is stored."""
    revision: int
    """The store revision in the database (what ``etcdutl snapshot status`` reports)."""


def verify_snapshot(path: Path) -> VerifiedSnapshot:
    """What ``etcdutl snapshot restore`` checks (the trailer is the SHA-256 of the database
    before it), the stored file's SHA-256 from the same single read, and its revision."""
    size = path.stat().st_size
    database = size - SNAPSHOT_SHA256_SIZE
    if database <= 0 or database % 512:  # etcdctl's own test: a bolt file is whole pages
        raise SnapshotCorrupt(f"{path.name}: {size} bytes is not a database plus a SHA-256 trailer")
    digest = hashlib.sha256()
    buffer = bytearray(VERIFY_CHUNK)
    view = memoryview(buffer)
    with path.open("rb", buffering=0) as file:
        remaining = database
        while remaining:
            got = file.readinto(view[: min(VERIFY_CHUNK, remaining)])
            if not got:
                raise SnapshotCorrupt(f"{path.name} shrank while it was read")
            digest.update(view[:got])
            remaining -= got
        trailer = file.read(SNAPSHOT_SHA256_SIZE)
    whole = digest.copy()
    whole.update(trailer)
    if trailer != digest.digest():
        raise SnapshotCorrupt(f"{path.name}: etcd's SHA-256 trailer does not match the database")
    try:
        revision = snapshot_revision(path)
    except BoltError as err:
        raise SnapshotCorrupt(f"{path.name}: {err}") from err
    return VerifiedSnapshot(size=size, sha256=whole.hexdigest(), revision=revision)


async def store_snapshot(
    spooled: Path,
    member: str,
    name: str,
    destination: Destination,
    cluster: str,
    keep: int | None = None,
    started_at: datetime | None = None,
) -> SnapshotResult:
    """Verify a saved snapshot, store it as ``<name>.db``, then prune beyond ``keep``.

    ``started_at`` is when the backup began (before etcdctl saved the file): the
    recorded duration counts from it. The spooled file is gone afterwards, stored or not.
    """
    started_at = started_at or datetime.now(UTC)
    try:
        verified = verify_snapshot(spooled)
        location = await destination.store(spooled, name + SNAPSHOT_SUFFIX)
    finally:
        spooled.unlink(missing_ok=True)
    pruned = await _prune(destination, cluster, keep)
    finished = datetime.now(UTC)
    return SnapshotResult(
        location=location,
        member=member,
        revision=verified.revision,
        size=verified.size,
        sha256=verified.sha256,
        start_time=rfc3339(started_at),
        completion_time=rfc3339(finished),
        duration_seconds=round(max(0.0, (finished - started_at).total_seconds()), 3),
        pruned=pruned,
    )


@dataclass(frozen=True)
class FetchResult:
    source: str
    size: int
    sha256: str
    revision: int | None

    def line(self) -> str:
        return RESULT_MARKER + json.dumps(asdict(self), sort_keys=True)


class ChecksumMismatch(Exception):
    """The snapshot read back is not the one the backup recorded."""


async def fetch_snapshot(
    out: Path,
    endpoint: str | None = None,
    file: Path | None = None,
    s3: tuple[S3Store, str] | None = None,
    sha256: str | None = None,
    tls: EtcdTLS | None = None,
) -> FetchResult:
    """Put a verified snapshot at ``out`` (written as .part, renamed once verified).

    From a member, etcd's own checksum is verified as it streams; from a backup, the
    SHA-256 the backup recorded. A snapshot that fails either check is never renamed.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".part")
    digest = hashlib.sha256()
    revision: int | None = None
    with partial.open("wb") as sink:

        async def write(chunk: bytes) -> None:
            digest.update(chunk)
            sink.write(chunk)

        if endpoint is not None:
            async with EtcdClient(endpoint, tls, timeout=30.0) as client:
                info = await client.snapshot(write, timeout=3600)
            revision, source = info.revision, endpoint
        elif file is not None:
            with file.open("rb") as stored:
                while chunk := stored.read(READ_CHUNK):
                    await write(chunk)
            source = str(file)
        elif s3 is not None:
            import obstore

            store, key = s3
            result = await obstore.get_async(store, key)
            async for chunk in result.stream(min_chunk_size=READ_CHUNK):
                await write(bytes(chunk))
            source = key
        else:
            raise ValueError("give an endpoint, a file or an S3 object")
        sink.flush()
        os.fsync(sink.fileno())
    found = digest.hexdigest()
    if sha256 is not None and found != sha256:
        partial.unlink(missing_ok=True)
        raise ChecksumMismatch(f"{source}: sha256 {found}, but the backup recorded {sha256}")
    partial.replace(out)
    return FetchResult(source=source, size=out.stat().st_size, sha256=found, revision=revision)
