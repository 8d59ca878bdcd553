"""What the backup agent checks in a snapshot ``etcdctl snapshot save`` wrote, against real etcd.

For every etcd version the dev cluster pins: a real member (a plain process on a loopback
address of its own), the same version's etcdctl saving over gRPC, and etcd's own etcdutl as
the referee: ``verify_snapshot`` must report the revision ``etcdutl snapshot status`` reports,
for a fresh store, a store with overwrites, deletes and a multi-level B+tree, and a data
file restored with bumped revisions; and it must refuse what ``etcdutl snapshot restore``
refuses.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path
from kustos.devcluster.ports import free_port
from kustos.etcd.bolt import snapshot_revision
from kustos.etcd.client import EtcdClient
from kustos.etcd.snapshot import SnapshotCorrupt, verify_snapshot
from tests.integration.etcd_support import build_missing_etcd_binaries, put_all


@pytest.fixture(scope="module", autouse=True)
def etcd_binaries() -> None:
    build_missing_etcd_binaries()


@pytest.fixture(params=ETCD_VERSIONS)
def member(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(version, client URL) of a one-member etcd on a loopback address of its own."""
    version: str = request.param
    ip = f"127.78.{random.randint(1, 254)}.{random.randint(2, 254)}"
    client, peer = f"http://{ip}:{free_port(ip)}", f"http://{ip}:{free_port(ip)}"
    log = (tmp_path / "etcd.log").open("wb")
    process = subprocess.Popen(
        [str(binary_path("etcd", version)), "--name=snap", f"--data-dir={tmp_path / 'data'}",
         f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
         f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
         f"--initial-cluster=snap={peer}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while etcdctl(version, client, "endpoint", "health").returncode != 0:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "etcd.log").read_text()
            time.sleep(0.2)
        yield version, client
    finally:
        process.kill()
        process.wait()
        log.close()


def etcdctl(version: str, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary_path("etcdctl", version)), f"--endpoints={endpoint}", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def etcdutl(version: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary_path("etcdutl", version)), *args], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def save(version: str, endpoint: str, path: Path) -> Path:
    result = etcdctl(version, endpoint, "snapshot", "save", str(path))
    assert result.returncode == 0, result.stderr
    return path


def etcdutl_status(version: str, path: Path) -> dict[str, Any]:
    result = etcdutl(version, "snapshot", "status", str(path), "-w", "json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


async def test_verify_agrees_with_etcdutl_on_real_snapshots(member: tuple[str, str], tmp_path: Path) -> None:
    version, endpoint = member
    fresh = verify_snapshot(save(version, endpoint, tmp_path / "fresh.db"))
    assert fresh.revision == etcdutl_status(version, tmp_path / "fresh.db")["revision"]

    async with EtcdClient(endpoint) as client:
        # Thousands of keys: the key bucket is a multi-level tree.
        await put_all(client, ((f"/k/{i:05d}", "v" * 200) for i in range(3000)))
        for i in range(0, 300, 3):
            await client.put(f"/k/{i:05d}", "overwritten")
        for i in range(1, 300, 7):
            await client.delete(f"/k/{i:05d}")
        last = await client.put("/last", "x")
        await client.delete("/last")  # the newest entry in the store is a tombstone
        revision = last + 1
    path = save(version, endpoint, tmp_path / "busy.db")
    verified = verify_snapshot(path)
    described = etcdutl_status(version, path)
    assert verified.revision == described["revision"] == revision
    assert verified.size == path.stat().st_size == described["totalSize"] + 32

    # A data file restored with bumped revisions (as recovery does): the bump is what it reports.
    restored = tmp_path / "restored"
    result = etcdutl(version, "snapshot", "restore", str(path), f"--data-dir={restored}",
                     "--bump-revision=1000000000", "--mark-compacted")  # fmt: skip
    assert result.returncode == 0, result.stderr
    db = restored / "member" / "snap" / "db"
    assert snapshot_revision(db) == etcdutl_status(version, db)["revision"] >= revision + 1000000000

    # What restore refuses, verify refuses: one flipped byte in the database.
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    broken = tmp_path / "broken.db"
    broken.write_bytes(bytes(data))
    assert (
        etcdutl(version, "snapshot", "restore", str(broken), f"--data-dir={tmp_path / 'r2'}").returncode != 0
    )
    with pytest.raises(SnapshotCorrupt, match="trailer does not match"):
        verify_snapshot(broken)
