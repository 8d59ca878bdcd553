"""Read the one figure the backup record needs from a snapshot file: its store revision.

An etcd snapshot is a bbolt database (etcd's storage) followed by a 32-byte SHA-256 of
it. The store revision is the main part of the last key of the ``key`` bucket (keys are
``<main:8 bytes big-endian>_<sub:8 bytes>`` with an optional tombstone marker), which is
how ``etcdutl snapshot status`` computes it. Finding it takes one walk down the right
edge of two B+trees, a handful of page reads whatever the database's size; nothing is
written and nothing else of bbolt is needed.

bbolt's on-disk format (stable since 2014, bbolt's ``page.go``/``meta.go``):

* every page starts with ``id:u64 flags:u16 count:u16 overflow:u32``;
* pages 0 and 1 are meta pages: ``magic:u32 version:u32 pageSize:u32 flags:u32
  root:(pgid:u64 sequence:u64) freelist:u64 pgid:u64 txid:u64 checksum:u64``, the valid
  one with the higher txid is current;
* a branch page has ``count`` elements ``pos:u32 ksize:u32 pgid:u64``, a leaf page
  ``flags:u32 pos:u32 ksize:u32 vsize:u32``; ``pos`` is relative to the element;
* a bucket is a leaf value with flag 1: ``root:u64 sequence:u64``, and when root is 0
  an inline page follows in the value itself.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = 0xED0CDAED
PAGE_HEADER = struct.Struct("<QHHI")
META = struct.Struct("<IIII QQ QQQ Q")
BRANCH_ELEMENT = struct.Struct("<IIQ")
LEAF_ELEMENT = struct.Struct("<IIII")
BUCKET_HEADER = struct.Struct("<QQ")
BRANCH_PAGE, LEAF_PAGE, META_PAGE = 0x01, 0x02, 0x04
BUCKET_LEAF = 0x01
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
MAX_DEPTH = 64  # a B+tree of 64 levels would not fit in any file: a loop means corruption


class BoltError(Exception):
    """The file is not a bbolt database this reader understands."""


@dataclass(frozen=True)
class _Meta:
    page_size: int
    root: int
    txid: int


def _fnv64a(data: bytes) -> int:
    value = FNV_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return value


def _meta(page: bytes) -> _Meta | None:
    """A meta page's fields, or None when its magic or checksum is wrong."""
    if len(page) < PAGE_HEADER.size + META.size:
        return None
    fields = META.unpack_from(page, PAGE_HEADER.size)
    magic, _version, page_size, _flags, root, _sequence, _freelist, _pgid, txid, checksum = fields
    body = page[PAGE_HEADER.size : PAGE_HEADER.size + META.size - 8]
    if magic != MAGIC or checksum != _fnv64a(body) or page_size < 512:
        return None
    return _Meta(page_size=page_size, root=root, txid=txid)


class _Reader:
    def __init__(self, file: BinaryIO, size: int) -> None:
        self.file = file
        self.size = size
        first = self._read(0, 4096)
        meta0 = _meta(first)
        if meta0 is None:  # the first meta page may be torn; its twin tells the page size too
            for guess in (4096, 8192, 16384, 65536, 1024, 2048, 512):
                meta1 = _meta(self._read(guess, guess))
                if meta1 is not None and meta1.page_size == guess:
                    break
            else:
                raise BoltError("neither meta page is valid: not a bbolt database")
            self.meta = meta1
        else:
            meta1 = _meta(self._read(meta0.page_size, meta0.page_size))
            self.meta = meta1 if meta1 is not None and meta1.txid > meta0.txid else meta0
        self.page_size = self.meta.page_size

    def _read(self, offset: int, length: int) -> bytes:
        self.file.seek(offset)
        return self.file.read(length)

    def page(self, pgid: int) -> bytes:
        offset = pgid * self.page_size
        if pgid < 2 or offset + PAGE_HEADER.size > self.size:
            raise BoltError(f"page {pgid} is outside the database")
        head = self._read(offset, self.page_size)
        page_id, _flags, _count, overflow = PAGE_HEADER.unpack_from(head)
        if page_id != pgid:
            raise BoltError(f"page {pgid} claims to be page {page_id}")
        if overflow:
            head += self._read(offset + self.page_size, overflow * self.page_size)
        return head


def _elements(page: bytes) -> tuple[int, int]:
    _pgid, flags, count, _overflow = PAGE_HEADER.unpack_from(page)
    return flags, count


def _branch(page: bytes, index: int) -> tuple[bytes, int]:
    at = PAGE_HEADER.size + index * BRANCH_ELEMENT.size
    pos, ksize, child = BRANCH_ELEMENT.unpack_from(page, at)
    return page[at + pos : at + pos + ksize], child


def _leaf(page: bytes, index: int) -> tuple[int, bytes, bytes]:
    at = PAGE_HEADER.size + index * LEAF_ELEMENT.size
    flags, pos, ksize, vsize = LEAF_ELEMENT.unpack_from(page, at)
    key = page[at + pos : at + pos + ksize]
    return flags, key, page[at + pos + ksize : at + pos + ksize + vsize]


def _bucket_root(reader: _Reader, value: bytes) -> bytes:
    """The root page of a bucket, from its value in the parent leaf (inline when root is 0)."""
    root, _sequence = BUCKET_HEADER.unpack_from(value)
    return value[BUCKET_HEADER.size :] if root == 0 else reader.page(root)


def _find_bucket(reader: _Reader, page: bytes, name: bytes) -> bytes | None:
    for _ in range(MAX_DEPTH):
        flags, count = _elements(page)
        if flags & BRANCH_PAGE:
            chosen = 0  # the last child whose first key is <= name
            for index in range(count):
                key, _child = _branch(page, index)
                if key > name:
                    break
                chosen = index
            page = reader.page(_branch(page, chosen)[1])
            continue
        if not flags & LEAF_PAGE:
            raise BoltError(f"unexpected page flags {flags:#x}")
        for index in range(count):
            leaf_flags, key, value = _leaf(page, index)
            if key == name:
                return _bucket_root(reader, value) if leaf_flags & BUCKET_LEAF else None
        return None
    raise BoltError("the tree is deeper than any real database")


def _last_key(reader: _Reader, page: bytes) -> bytes | None:
    for _ in range(MAX_DEPTH):
        flags, count = _elements(page)
        if count == 0:
            return None
        if flags & BRANCH_PAGE:
            page = reader.page(_branch(page, count - 1)[1])
            continue
        if not flags & LEAF_PAGE:
            raise BoltError(f"unexpected page flags {flags:#x}")
        return _leaf(page, count - 1)[1]
    raise BoltError("the tree is deeper than any real database")


def snapshot_revision(path: Path) -> int:
    """The store revision of an etcd snapshot (or data file): 0 for a store never written."""
    with path.open("rb") as file:
        reader = _Reader(file, path.stat().st_size)
        try:
            keys = _find_bucket(reader, reader.page(reader.meta.root), b"key")
            if keys is None:
                raise BoltError("no 'key' bucket: not an etcd database")
            last = _last_key(reader, keys)
        except struct.error as err:  # an element that points past the end of its page
            raise BoltError(f"a damaged page: {err}") from None
    if last is None:
        return 0
    if len(last) < 8:
        raise BoltError(f"a revision key of {len(last)} bytes")
    return int.from_bytes(last[:8], "big")
