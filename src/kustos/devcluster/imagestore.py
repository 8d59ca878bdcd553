"""Real nodes' preloaded images: imported once into a containerd root, linked into each node's.

Every real node's containerd used to import every preloaded image itself: kustos's own image
(about 500 MB) written twice (its blob, then its unpacked layers) per node, four nodes at a
time, in every module that starts real nodes. On a loaded 2-core machine that was most of the
80-260 s such a module spent starting its nodes (issue 26 item 5). The import now runs once per
set of archives, into a root kept in the cache, and each node's root starts as hard links to
it. Blobs and unpacked layers are never written in place (a container writes to its own upper
directory; removing an image unlinks), so nodes may share their inodes; the bolt databases,
which containerd does write, are copied.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from kustos.devcluster import binaries
from kustos.devcluster.network import locked
from kustos.devcluster.paths import cache_root

STORE = "containerd-roots"
KEPT = 2  # roots kept: the newest, and the one a run still on the previous image may be linking
NAMESPACE = "k8s.io"  # the CRI's namespace
READY = "ready"  # written once a root holds every image


class ImageStoreError(RuntimeError):
    """The shared root could not be built (containerd would not start, an import failed)."""


def private_containerd(directory: Path) -> list[str]:
    """The settings that keep a containerd to ``directory`` (root, state, plugins' files and
    sockets: ``sock``), beside the machine's and the other nodes': TOML top-level keys, then
    tables, for a caller's own keys before and tables after."""
    socket = directory / "sock"
    return [
        f'root = "{directory / "root"}"',
        f'state = "{directory / "state"}"',
        f"[plugins.'io.containerd.internal.v1.opt']\n  path = \"{directory / 'opt'}\"",
        f'[grpc]\n  address = "{socket}"',
        f'[ttrpc]\n  address = "{socket}.ttrpc"',
        # NRI's socket is one per machine: a second containerd would take it from the first.
        "[plugins.'io.containerd.nri.v1.nri']\n  disable = true",
    ]


def store_dir() -> Path:
    return cache_root() / STORE


def root_key(images: Sequence[Path]) -> str:
    """One root per containerd version and set of archives (their names carry their digests)."""
    parts = [binaries.binary_path("containerd").name, *(f"{p.name}:{p.stat().st_size}" for p in images)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def link_preloaded(images: Sequence[Path], root: Path) -> bool:
    """Make ``root`` (a node's containerd root, not yet there) a copy of the shared root holding
    ``images``: hard links, the databases copied. Builds the shared root first if needed.
    False, and nothing done, when the cache is on another filesystem (no hard link reaches)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    store = store_dir()
    store.mkdir(parents=True, exist_ok=True)
    if store.stat().st_dev != root.parent.stat().st_dev:
        return False
    shared = shared_root(images)
    subprocess.run(["cp", "-al", str(shared), str(root)], check=True, capture_output=True)
    # Each plugin keeps its database at the top of its own directory of the root.
    for database in root.glob("*/*.db"):
        copy = database.with_name(database.name + ".copy")
        shutil.copy2(database, copy)
        copy.replace(database)
    return True


def shared_root(images: Sequence[Path]) -> Path:
    """The root holding ``images``, imported into it once (one builder at a time: sessions run
    side by side)."""
    directory = store_dir() / root_key(images)
    if (directory / READY).exists():
        return directory / "root"
    directory.parent.mkdir(parents=True, exist_ok=True)
    with locked(directory.parent / f"{directory.name}.lock"):
        if not (directory / READY).exists():
            shutil.rmtree(directory, ignore_errors=True)
            _import(images, directory)
            (directory / READY).touch()
            _prune(directory.parent)
    return directory / "root"


def _import(images: Sequence[Path], directory: Path) -> None:
    """A containerd of its own on ``directory`` (its CRI off: nothing runs here), every archive
    imported and unpacked, then stopped."""
    directory.mkdir(parents=True)
    socket = directory / "sock"
    config = directory / "containerd.toml"
    disabled = 'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"]'
    config.write_text("\n".join(["version = 3", disabled, *private_containerd(directory)]) + "\n")
    log = directory / "containerd.log"
    with log.open("ab") as sink:
        process = subprocess.Popen(
            [str(binaries.binary_path("containerd")), "--config", str(config)],
            stdout=sink, stderr=sink, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise ImageStoreError(f"containerd for the shared image root did not start; see {log}")
            time.sleep(0.1)
        for archive in images:
            result = subprocess.run(
                [str(binaries.binary_path("ctr")), "--address", str(socket), "-n", NAMESPACE,
                 "images", "import", str(archive)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if result.returncode != 0:
                raise ImageStoreError(f"ctr images import {archive.name}: {result.stderr.strip()}")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    shutil.rmtree(directory / "state", ignore_errors=True)


def _prune(store: Path) -> None:
    """Keep the ``KEPT`` newest roots: each new kustos image makes a new one (about 1 GB)."""
    roots = sorted(
        (d for d in store.iterdir() if (d / READY).exists()), key=lambda d: (d / READY).stat().st_mtime
    )
    for old in roots[:-KEPT]:
        shutil.rmtree(old, ignore_errors=True)
        (store / f"{old.name}.lock").unlink(missing_ok=True)
