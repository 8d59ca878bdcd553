"""Verifying a snapshot file etcdctl saved: etcd's SHA-256 trailer, and its revision read from
the bbolt database (against databases built here, page by page, in bbolt's documented format;
tests/integration/test_etcd_snapshot_save.py checks real etcd snapshots against etcdutl)."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kustos.etcd import bolt
from kustos.etcd.agent_report import parse_result
from kustos.etcd.snapshot import DirectoryDestination, SnapshotCorrupt, store_snapshot, verify_snapshot

PAGE = 4096


def _page(pgid: int, flags: int, count: int, body: bytes, overflow: int = 0) -> bytes:
    return bolt.PAGE_HEADER.pack(pgid, flags, count, overflow) + body


def _leaf(pgid: int, items: list[tuple[int, bytes, bytes]]) -> bytes:
    """A leaf page of (flags, key, value) elements: headers first, then keys and values."""
    headers, data = b"", b""
    base = len(items) * bolt.LEAF_ELEMENT.size
    for index, (flags, key, value) in enumerate(items):
        pos = base + len(data) - index * bolt.LEAF_ELEMENT.size
        headers += bolt.LEAF_ELEMENT.pack(flags, pos, len(key), len(value))
        data += key + value
    return _page(pgid, bolt.LEAF_PAGE, len(items), headers + data)


def _branch(pgid: int, children: list[tuple[bytes, int]]) -> bytes:
    headers, data = b"", b""
    base = len(children) * bolt.BRANCH_ELEMENT.size
    for index, (key, child) in enumerate(children):
        pos = base + len(data) - index * bolt.BRANCH_ELEMENT.size
        headers += bolt.BRANCH_ELEMENT.pack(pos, len(key), child)
        data += key
    return _page(pgid, bolt.BRANCH_PAGE, len(children), headers + data)


def _meta(pgid: int, root: int, txid: int, high: int) -> bytes:
    fields = [bolt.MAGIC, 2, PAGE, 0, root, 0, 2, high, txid]
    body = struct.pack("<IIII QQ QQQ", *fields)
    return _page(pgid, bolt.META_PAGE, 0, body + struct.pack("<Q", bolt._fnv64a(body)))


def rev_key(main: int, sub: int = 0, tombstone: bool = False) -> bytes:
    return main.to_bytes(8, "big") + b"_" + sub.to_bytes(8, "big") + (b"t" if tombstone else b"")


def database(keys: list[bytes], per_leaf: int = 3, inline: bool = False, torn_meta: bool = False) -> bytes:
    """A bbolt file with buckets alarm, key, meta: ``key`` holds ``keys`` (sorted), in leaves of
    ``per_leaf`` under one or two levels of branch pages, or inline in its parent's value."""
    keys = sorted(keys)
    pages: dict[int, bytes] = {2: _page(2, 0x10, 0, b"")}  # the freelist: never read
    empty_inline = bolt.BUCKET_HEADER.pack(0, 0) + _leaf(0, [])
    if inline:
        key_bucket = bolt.BUCKET_HEADER.pack(0, 0) + _leaf(0, [(0, k, b"v") for k in keys])
    else:
        level: list[tuple[bytes, int]] = []
        next_id = 4
        for start in range(0, max(1, len(keys)), per_leaf):
            chunk = keys[start : start + per_leaf]
            pages[next_id] = _leaf(next_id, [(0, k, b"value") for k in chunk])
            level.append((chunk[0] if chunk else b"", next_id))
            next_id += 1
        while len(level) > 1:  # branch levels of at most per_leaf children, up to one root
            upper: list[tuple[bytes, int]] = []
            for start in range(0, len(level), per_leaf):
                pages[next_id] = _branch(next_id, level[start : start + per_leaf])
                upper.append((level[start][0], next_id))
                next_id += 1
            level = upper
        key_bucket = bolt.BUCKET_HEADER.pack(level[0][1], 0)
    buckets = [(1, b"alarm", empty_inline), (1, b"key", key_bucket), (1, b"meta", empty_inline)]
    pages[3] = _leaf(3, buckets)
    high = max(pages) + 1
    pages[0] = _meta(0, 3, 7, high)
    pages[1] = _meta(1, 3, 6, high)
    if torn_meta:
        pages[0] = b"\0" * PAGE
    return b"".join(pages[i].ljust(PAGE, b"\0") for i in range(high))


def snapshot_file(path: Path, db: bytes) -> Path:
    path.write_bytes(db + hashlib.sha256(db).digest())
    return path


revisions = st.lists(st.integers(1, 2**40), min_size=1, max_size=60, unique=True)


@settings(max_examples=60, deadline=None)
@given(mains=revisions, per_leaf=st.integers(2, 5), inline=st.booleans(), torn=st.booleans())
def test_the_revision_is_the_newest_key_of_the_key_bucket(
    tmp_path_factory: pytest.TempPathFactory, mains: list[int], per_leaf: int, inline: bool, torn: bool
) -> None:
    keys = [rev_key(m, sub=i % 3, tombstone=i % 4 == 0) for i, m in enumerate(mains)]
    path = tmp_path_factory.mktemp("bolt") / "db"
    path.write_bytes(database(keys, per_leaf, inline, torn_meta=torn))
    assert bolt.snapshot_revision(path) == max(mains)


def test_a_store_never_written_is_at_revision_zero(tmp_path: Path) -> None:
    path = tmp_path / "db"
    path.write_bytes(database([], inline=True))
    assert bolt.snapshot_revision(path) == 0
    path.write_bytes(database([]))
    assert bolt.snapshot_revision(path) == 0


def test_what_is_not_an_etcd_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "db"
    path.write_bytes(b"x" * 3 * PAGE)
    with pytest.raises(bolt.BoltError, match="meta page"):
        bolt.snapshot_revision(path)
    no_key_bucket = database([rev_key(5)]).replace(b"key", b"kez")
    path.write_bytes(no_key_bucket)
    with pytest.raises(bolt.BoltError, match="no 'key' bucket"):
        bolt.snapshot_revision(path)
    truncated = database([rev_key(i) for i in range(1, 30)])[: 5 * PAGE]
    path.write_bytes(truncated)
    with pytest.raises(bolt.BoltError, match="outside the database"):
        bolt.snapshot_revision(path)
    damaged = bytearray(database([rev_key(i) for i in range(1, 30)]))
    count_at = len(damaged) - PAGE + 10  # the element count of the key bucket's root (the last page)
    damaged[count_at : count_at + 2] = (0xFFFF).to_bytes(2, "little")  # elements past the page's end
    path.write_bytes(bytes(damaged))
    with pytest.raises(bolt.BoltError, match="damaged page"):
        bolt.snapshot_revision(path)


def test_verify_checks_etcds_trailer_and_hashes_the_whole_file(tmp_path: Path) -> None:
    db = database([rev_key(i) for i in (3, 9, 41)])
    path = snapshot_file(tmp_path / "s.db", db)
    verified = verify_snapshot(path)
    assert verified.revision == 41 and verified.size == len(db) + 32
    assert verified.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_bytes(db[:-1] + b"\1" + hashlib.sha256(db).digest())  # one byte flipped
    with pytest.raises(SnapshotCorrupt, match="trailer does not match"):
        verify_snapshot(path)
    path.write_bytes(db + hashlib.sha256(db).digest()[:-1])  # the stream was cut short
    with pytest.raises(SnapshotCorrupt, match="not a database plus a SHA-256 trailer"):
        verify_snapshot(path)
    junk = b"y" * PAGE
    snapshot_file(path, junk)  # a right trailer on something that is not a database
    with pytest.raises(SnapshotCorrupt, match="meta page"):
        verify_snapshot(path)


async def test_a_saved_snapshot_is_renamed_into_place_and_a_corrupt_one_removed(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    claim.mkdir()
    spooled = snapshot_file(claim / ".incoming_prod_main_nightly.db", database([rev_key(12)]))
    inode = spooled.stat().st_ino
    destination = DirectoryDestination(claim / "prod" / "main", "pvc://main-backups/prod/main")
    result = await store_snapshot(spooled, "main-1", "nightly", destination, "main")
    stored = claim / "prod" / "main" / "nightly.db"
    assert stored.stat().st_ino == inode, "on the same volume storing is a rename, not a copy"
    assert not spooled.exists() and result.location == "pvc://main-backups/prod/main/nightly.db"
    assert (result.revision, result.size) == (12, stored.stat().st_size)
    assert result.sha256 == hashlib.sha256(stored.read_bytes()).hexdigest()
    assert parse_result(result.line()) == result

    bad = claim / ".incoming_prod_main_broken.db"
    bad.write_bytes(database([rev_key(3)]) + b"\0" * 32)
    with pytest.raises(SnapshotCorrupt):
        await store_snapshot(bad, "main-1", "broken", destination, "main")
    assert not bad.exists() and not (claim / "prod" / "main" / "broken.db").exists()
