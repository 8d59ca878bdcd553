"""Real nodes share one import of their images: links for what containerd never writes, copies
of what it does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kustos.devcluster import imagestore


@pytest.fixture
def images(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    monkeypatch.setenv("KUSTOS_CACHE", str(tmp_path / "cache"))
    archives = [tmp_path / "etcd+v3.6.16-abc.tar", tmp_path / "kustos+0.1.0-def.tar"]
    for archive in archives:
        archive.write_bytes(b"layers")
    return archives


def imported(images: list[Path]) -> Path:
    """The shared root as an import would leave it: a blob, an unpacked layer, and each plugin's
    database at the top of its directory."""
    directory = imagestore.store_dir() / imagestore.root_key(images)
    root = directory / "root"
    (root / "content" / "blobs").mkdir(parents=True)
    (root / "content" / "blobs" / "sha256-1").write_bytes(b"blob")
    (root / "overlayfs" / "snapshots" / "1" / "fs").mkdir(parents=True)
    (root / "overlayfs" / "snapshots" / "1" / "fs" / "etcd").write_bytes(b"binary")
    (root / "bolt").mkdir()
    (root / "bolt" / "meta.db").write_bytes(b"images")
    (root / "overlayfs" / "metadata.db").write_bytes(b"snapshots")
    (directory / imagestore.READY).touch()
    return root


def test_a_nodes_root_links_the_images_and_owns_its_databases(images: list[Path], tmp_path: Path) -> None:
    shared = imported(images)
    node_root = tmp_path / "node" / "root"
    assert imagestore.link_preloaded(images, node_root)

    for layer in ("content/blobs/sha256-1", "overlayfs/snapshots/1/fs/etcd"):
        assert (node_root / layer).samefile(shared / layer), layer
    for database in ("bolt/meta.db", "overlayfs/metadata.db"):
        assert not (node_root / database).samefile(shared / database), database
        assert (node_root / database).read_bytes() == (shared / database).read_bytes()
    (node_root / "bolt" / "meta.db").write_bytes(b"this node's images")
    assert (shared / "bolt" / "meta.db").read_bytes() == b"images"


def test_another_image_is_another_root_and_only_the_newest_two_are_kept(
    images: list[Path], tmp_path: Path
) -> None:
    first = imagestore.root_key(images)
    images[1].write_bytes(b"a rebuilt kustos image, of another size")
    assert imagestore.root_key(images) != first

    store = imagestore.store_dir()
    for name, made in {"oldest": 998, "previous": 999, "newest": 1000}.items():
        (store / name).mkdir(parents=True)
        (store / name / imagestore.READY).touch()
        os.utime(store / name / imagestore.READY, (made, made))
    (store / "building").mkdir()  # not ready: another session's import, left alone
    imagestore._prune(store)
    assert sorted(p.name for p in store.iterdir()) == ["building", "newest", "previous"]
