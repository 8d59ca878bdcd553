"""kustos.etcd.client against real etcd processes, for every etcd version the dev cluster pins.

No Kubernetes here: members run as plain processes on their own loopback
addresses (127.77.x.y) with free ports and data under tmp_path, and are killed in
fixture teardown. Nothing skips: missing etcd binaries are built first.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import io
import ipaddress
import json
import os
import random
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kustos.devcluster.binaries import ETCD_VERSIONS, binary_path
from kustos.devcluster.ports import free_port
from kustos.etcd.client import (
    AuthFailed,
    AuthRequired,
    BadLeaderTransferee,
    Compacted,
    EtcdClient,
    EtcdCredentials,
    EtcdError,
    EtcdTLS,
    EtcdTLSError,
    EtcdUnavailable,
    FutureRevision,
    LearnerNotReady,
    MemberNotFound,
    MemberNotLearner,
    NoSpace,
    NotLeader,
    NotSupportedForLearner,
    PeerURLExists,
    PermissionDenied,
    RolePermission,
    Status,
    TooManyLearners,
    UnhealthyCluster,
    cluster_health,
    prefix_end,
)
from tests.integration.etcd_support import build_missing_etcd_binaries
from tests.integration.kube import wait_until

T = TypeVar("T")

each_version = pytest.mark.parametrize("version", ETCD_VERSIONS)


def _storage_version(version: str) -> str:
    """What a 3.6+ member reports its data is written for: its own minor ("3.7.0" on v3.7.3)."""
    return ".".join(version.lstrip("v").split(".")[:2]) + ".0"


@pytest.fixture(scope="module", autouse=True)
def etcd_binaries() -> None:
    """Build whichever etcd binaries are missing (a missing binary fails, never skips)."""
    build_missing_etcd_binaries()


# --------------------------------------------------------------------------- processes


def _subnet() -> str:
    """A loopback /24 of our own, so parallel sessions and other tests do not collide."""
    return f"127.77.{random.randint(1, 254)}"


@dataclass
class EtcdProcess:
    name: str
    version: str
    ip: str
    data_dir: Path
    client_scheme: str = "http"
    client_host: str = ""
    client_port: int = 0
    peer_port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=Path)

    def __post_init__(self) -> None:
        self.client_port = self.client_port or free_port(self.ip)
        self.peer_port = self.peer_port or free_port(self.ip)
        self.client_host = self.client_host or self.ip
        self.log = self.data_dir.with_suffix(".log")

    @property
    def client_url(self) -> str:
        return f"{self.client_scheme}://{self.client_host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.ip}:{self.peer_port}"

    def start(self, initial_cluster: str, state: str = "new", extra: tuple[str, ...] = ()) -> None:
        command = [
            str(binary_path("etcd", self.version)),
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_scheme}://{self.ip}:{self.client_port}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            f"--initial-cluster-state={state}",
            "--initial-cluster-token=kustos-test",
            *extra,
        ]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


class Launcher:
    """Creates members and guarantees they are killed when the test ends."""

    def __init__(self, tmp_path: Path, version: str, host: str = "") -> None:
        """``host``: one address for every member (each on its own ports), e.g. the dev
        cluster's pod gateway so that pods can reach them; a loopback /24 of our own else."""
        self.tmp_path = tmp_path
        self.version = version
        self.subnet = _subnet()
        self.host = host
        self.members: list[EtcdProcess] = []

    def member(
        self, index: int, ip: str = "", client_scheme: str = "http", client_host: str = ""
    ) -> EtcdProcess:
        member = EtcdProcess(
            f"m{index}", self.version, ip or self.host or f"{self.subnet}.{index + 1}",
            self.tmp_path / f"m{index}",
            client_scheme=client_scheme, client_host=client_host,
        )  # fmt: skip
        self.members.append(member)
        return member

    def cluster(self, size: int) -> list[EtcdProcess]:
        members = [self.member(i) for i in range(size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
        for m in members:
            m.start(initial)
        return members

    def stop_all(self) -> None:
        for member in self.members:
            member.stop()


@pytest.fixture
def launcher(tmp_path: Path, version: str) -> Iterator[Launcher]:
    launch = Launcher(tmp_path, version)
    try:
        yield launch
    finally:
        launch.stop_all()


async def eventually(
    call: Callable[[], Awaitable[T]],
    what: str,
    retry_on: tuple[type[Exception], ...] = (EtcdError,),
    timeout: float = 30.0,
    members: list[EtcdProcess] | None = None,
) -> T:
    """Retry ``call`` while it raises one of ``retry_on``; on timeout, show the member logs."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except retry_on as err:
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {m.name} log:\n{m.log_tail()}" for m in members or ())
                raise AssertionError(f"timed out after {timeout:.0f}s: {what}: {err!r}\n{logs}") from err
            for m in members or ():
                if m.process is not None and m.process.poll() is not None:
                    raise AssertionError(
                        f"{m.name} exited while waiting for {what}:\n{m.log_tail()}"
                    ) from err
            await asyncio.sleep(0.2)


async def wait_ready(member: EtcdProcess, tls: EtcdTLS | None = None, voter: bool = True) -> Status:
    """Until the member answers status and knows a leader."""

    async def ready() -> Status:
        async with EtcdClient(member.client_url, tls, timeout=2.0) as client:
            status = await client.status()
        if not status.has_leader:
            raise EtcdUnavailable("no leader yet")
        if voter and status.is_learner:
            raise EtcdUnavailable("still a learner")
        return status

    return await eventually(ready, f"{member.name} ready", members=[member])


@pytest.fixture
async def single(launcher: Launcher) -> AsyncIterator[tuple[EtcdProcess, EtcdClient]]:
    (member,) = launcher.cluster(1)
    await wait_ready(member)
    async with EtcdClient(member.client_url) as client:
        yield member, client


def _etcdutl(version: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary_path("etcdutl", version)), *args], capture_output=True, text=True, timeout=60, check=False
    )


# --------------------------------------------------------------------------- single member


@each_version
async def test_kv(single: tuple[EtcdProcess, EtcdClient], version: str) -> None:
    _, client = single
    first = await client.put("a/1", "one")
    second = await client.put(b"a/2", b"\xff\x00binary")
    await client.put("b", "other")
    assert second == first + 1

    kv = await client.get(b"a/2")
    assert kv is not None
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (
        b"a/2", b"\xff\x00binary", second, second, 1, 0,
    )  # fmt: skip
    assert await client.get("missing") is None

    prefixed = await client.range("a/", prefix=True)
    assert [k.key for k in prefixed.kvs] == [b"a/1", b"a/2"]
    assert (prefixed.count, prefixed.more, prefixed.revision) == (2, False, second + 1)
    limited = await client.range("a/", prefix=True, limit=1)
    assert (len(limited.kvs), limited.count, limited.more) == (1, 2, True)
    counted = await client.range("a/", prefix=True, count_only=True)
    assert (counted.kvs, counted.count) == ([], 2)
    keys = await client.range("a/", prefix=True, keys_only=True)
    assert [(k.key, k.value) for k in keys.kvs] == [(b"a/1", b""), (b"a/2", b"")]
    everything = await client.range(b"\x00", range_end=b"\x00")
    assert [k.key for k in everything.kvs] == [b"a/1", b"a/2", b"b"]
    assert (await client.range("", prefix=True)).kvs == everything.kvs
    assert [k.key for k in (await client.range("a/2", range_end="c")).kvs] == [b"a/2", b"b"]
    assert (await client.range("a/", prefix=True, serializable=True)).count == 2

    overwritten = await client.put("a/1", "uno")
    assert (await client.get("a/1")) == (await client.range("a/1", revision=overwritten)).kvs[0]
    old = (await client.range("a/1", revision=first)).kvs[0]
    assert (old.value, old.version) == (b"one", 1)
    assert (await client.get("a/1")).version == 2  # type: ignore[union-attr]

    # A lease travels as a 64-bit ID; grant one through the gateway directly.
    async with httpx.AsyncClient(base_url=client.endpoint) as raw:
        lease = int((await raw.post("/v3/lease/grant", json={"TTL": 60})).json()["ID"])
    await client.put("leased", "v", lease=lease)
    assert (await client.get("leased")).lease == lease  # type: ignore[union-attr]

    assert await client.delete("a/", prefix=True) == 2
    assert await client.delete("a/1") == 0
    assert await client.delete("b") == 1

    current = (await client.status()).revision
    await client.compact(overwritten, physical=True)
    with pytest.raises(Compacted):
        await client.range("a/1", revision=first)
    with pytest.raises(Compacted):
        await client.compact(overwritten)
    with pytest.raises(FutureRevision):
        await client.compact(current + 100)


@each_version
async def test_maintenance(single: tuple[EtcdProcess, EtcdClient], version: str) -> None:
    _, client = single
    status = await client.status()
    assert status.version == version.lstrip("v")
    assert status.member_id == status.leader_id and status.is_leader
    assert status.cluster_id != 0 and status.raft_term >= 2
    assert status.raft_index >= status.raft_applied_index > 0
    assert status.db_size >= status.db_size_in_use > 0
    assert (status.is_learner, status.errors) == (False, ())
    if version.startswith("v3.5"):
        assert (status.storage_version, status.db_size_quota) == ("", 0)
    else:
        # etcd writes its storage version once it has decided the cluster version, from its own
        # loop (monitorStorageVersion: on that change, else every 4 s): a status read right
        # after the start may still name the older schema it began with.
        async def storage_version() -> str | None:
            found = (await client.status()).storage_version
            return found if found == _storage_version(version) else None

        await wait_until(storage_version, f"storage version {_storage_version(version)}", timeout=20)
        assert status.db_size_quota > 0
    assert await client.health() and await client.health(serializable=True)

    for i in range(50):
        await client.put(f"k/{i}", os.urandom(1024))
    hashed = await client.hash_kv()
    assert hashed.revision == (await client.status()).revision and hashed.hash > 0
    assert hashed == await client.hash_kv()
    await client.compact(hashed.revision - 10)
    again = await client.hash_kv(hashed.revision - 5)
    assert (again.compact_revision, again.revision) == (hashed.revision - 10, hashed.revision)

    await client.delete("k/", prefix=True)
    await client.compact((await client.status()).revision, physical=True)
    before = await client.status()
    await client.defragment()
    after = await client.status()
    assert after.db_size < before.db_size and after.db_size_in_use <= after.db_size

    # NOSPACE, raised by hand: status and health report it, writes fail, disarm clears it.
    assert await client.alarm_list() == []
    async with httpx.AsyncClient(base_url=client.endpoint) as raw:
        activate = {"action": "ACTIVATE", "memberID": str(status.member_id), "alarm": "NOSPACE"}
        assert (await raw.post("/v3/maintenance/alarm", json=activate)).status_code == 200
    (alarm,) = await client.alarm_list()
    assert (alarm.member_id, alarm.alarm) == (status.member_id, "NOSPACE")
    # The alarm in etcd's text format, whose spacing differs by version (3.7 prints protobuf's
    # text format, which varies it on purpose): kustos matches the word, so does this.
    [error] = (await client.status()).errors
    assert error.split() == [f"memberID:{status.member_id}", "alarm:NOSPACE"]
    assert not await client.health()
    with pytest.raises(NoSpace):
        await client.put("x", "y")
    assert await client.alarm_disarm(status.member_id, "NOSPACE") == [alarm]
    assert await client.alarm_list() == []
    assert await client.health()
    await client.put("x", "y")


@pytest.mark.parametrize("version", ["v3.6.16", "v3.7.3"])
async def test_downgrade_api(single: tuple[EtcdProcess, EtcdClient], version: str) -> None:
    """The downgrade API (3.6 and later): validate, enable (seen in status), cancel; two minors
    back is refused."""
    member, client = single
    running = ".".join(version.lstrip("v").split(".")[:2])  # "3.7"

    # Right after start, etcd's leader has not yet decided a cluster version, and the
    # downgrade API refuses with "cluster version not found" until it has.
    async def decided() -> str:
        if not (cluster_version := await client.cluster_version()):
            raise EtcdUnavailable("no cluster version yet")
        return cluster_version

    assert (await eventually(decided, "cluster version decided", members=[member])).startswith(running)
    major, minor = (int(p) for p in running.split("."))
    previous, two_back = f"{major}.{minor - 1}", f"{major}.{minor - 2}"
    assert await client.downgrade("VALIDATE", previous) == running
    assert not (await client.status()).downgrade_enabled
    assert await client.downgrade("ENABLE", previous) == running
    status = await client.status()
    assert (status.downgrade_enabled, status.downgrade_target) == (True, f"{previous}.0")
    with pytest.raises(EtcdError, match="invalid downgrade target version"):
        await client.downgrade("VALIDATE", two_back)
    assert await client.downgrade("CANCEL") == running
    assert not (await client.status()).downgrade_enabled
    with pytest.raises(ValueError, match="downgrade action"):
        await client.downgrade("FORCE", previous)


@each_version
async def test_auth(single: tuple[EtcdProcess, EtcdClient], version: str, tmp_path: Path) -> None:
    """Users, roles and tokens as the operator uses them; a password change drops old tokens."""
    member, admin = single
    await admin.role_add("root")
    await admin.user_add("root", "root-pw")
    await admin.user_grant_role("root", "root")
    await admin.user_add("cert-only", None)
    await admin.role_add("app")
    app_range = RolePermission("READWRITE", b"/app/", prefix_end(b"/app/"))
    await admin.role_grant_permission("app", app_range)
    await admin.user_add("app", "app-pw")
    await admin.user_grant_role("app", "app")
    assert sorted(await admin.user_list()) == ["app", "cert-only", "root"]
    assert await admin.role_permissions("app") == [app_range]
    await admin.auth_enable()

    root = (EtcdCredentials("root", "wrong"), EtcdCredentials("root", "root-pw"))  # the second is right
    async with EtcdClient(member.client_url, credentials=root) as client:
        assert (await client.auth_status()).enabled
        await client.status()  # 3.6 and later want a token even for this: it logs in first
        assert client.logged_in_as == root[1]
        await client.put("/anything", "x")
        with io.BytesIO() as sink:
            await client.snapshot(sink)
        await client.user_change_password("root", "root-pw-2")  # etcd drops root's tokens
        with pytest.raises(AuthFailed):
            await client.put("/anything", "y")  # a new login with the old passwords fails
    async with EtcdClient(member.client_url, credentials=(EtcdCredentials("app", "app-pw"),)) as app:
        await app.put("/app/x", "1")
        with pytest.raises(PermissionDenied):
            await app.put("/other", "1")
    async with EtcdClient(member.client_url) as anonymous:
        with pytest.raises(AuthRequired):
            await anonymous.put("/app/x", "2")
    root2 = (EtcdCredentials("root", "root-pw-2"),)
    async with EtcdClient(member.client_url, credentials=root2) as client:
        await client.role_revoke_permission("app", app_range.key, app_range.range_end)
        await client.user_revoke_role("app", "app")
        await client.user_delete("app")
        await client.role_delete("app")
        assert sorted(await client.user_list()) == ["cert-only", "root"]
        await client.auth_disable()
    assert (await admin.auth_status()).enabled is False


@each_version
async def test_snapshot(single: tuple[EtcdProcess, EtcdClient], version: str, tmp_path: Path) -> None:
    _, client = single
    for i in range(100):  # about 200 KiB: several 32 KiB stream messages
        await client.put(f"snap/{i:03}", os.urandom(2048))
    revision = (await client.status()).revision

    path = tmp_path / "db.snapshot"
    with path.open("wb") as sink:
        info = await client.snapshot(sink)
    data = path.read_bytes()
    assert info.size == len(data) == info.db_size + 32
    assert info.db_size > 4 * 32 * 1024
    assert hashlib.sha256(data[:-32]).hexdigest() == data[-32:].hex() == info.sha256
    assert info.revision == revision
    assert info.storage_version == ("" if version.startswith("v3.5") else _storage_version(version))

    chunks: list[bytes] = []

    async def collect(chunk: bytes) -> None:
        chunks.append(chunk)

    streamed = await client.snapshot(collect)
    assert len(chunks) > 4
    # The same revision, whole; not byte for byte the first: etcd 3.7 may grow its file by a
    # page between the two without a new revision (CI saw 438,272 then 442,368 bytes).
    assert streamed.size == streamed.db_size + 32 and streamed.revision == revision
    assert len(b"".join(chunks)) == streamed.size

    # etcd's own tools accept the file: status reads it, restore checks the SHA-256 trailer.
    result = _etcdutl(version, "snapshot", "status", "--write-out", "json", str(path))
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    assert described["revision"] == revision
    assert described["totalSize"] == info.db_size
    assert described["totalKey"] >= 100
    restored = tmp_path / "restored"
    result = _etcdutl(version, "snapshot", "restore", str(path), "--data-dir", str(restored))
    assert result.returncode == 0, result.stderr
    assert (restored / "member" / "snap" / "db").is_file()

    # A corrupted trailer is what restore rejects, so the same file without it must fail the check.
    broken = tmp_path / "broken.snapshot"
    broken.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    result = _etcdutl(version, "snapshot", "restore", str(broken), "--data-dir", str(tmp_path / "r2"))
    assert result.returncode != 0


# --------------------------------------------------------------------------- three members


@each_version
async def test_three_members(launcher: Launcher, version: str) -> None:
    members = launcher.cluster(3)
    statuses = [await wait_ready(m) for m in members]
    clients = [EtcdClient(m.client_url) for m in members]
    try:
        await _membership(launcher, members, clients, statuses)
    finally:
        for c in clients:
            await c.aclose()


async def _membership(
    launcher: Launcher, members: list[EtcdProcess], clients: list[EtcdClient], statuses: list[Status]
) -> None:
    cluster_id = statuses[0].cluster_id
    ids = {s.member_id for s in statuses}
    assert len(ids) == 3 and {s.cluster_id for s in statuses} == {cluster_id}

    for member, client, status in zip(members, clients, statuses, strict=True):
        listed = await client.member_list()
        assert (listed.cluster_id, listed.member_id) == (cluster_id, status.member_id)
        assert {m.id for m in listed.members} == ids
        me = listed.by_id(status.member_id)
        assert me is not None and me == listed.by_name(member.name)
        assert (me.peer_urls, me.client_urls, me.is_learner, me.is_started) == (
            (member.peer_url,), (member.client_url,), False, True,
        )  # fmt: skip
        assert (await client.member_list(linearizable=False)).members == listed.members
    assert {m.name for m in listed.members} == {"m0", "m1", "m2"}

    health = await cluster_health([m.client_url for m in members] + ["http://127.0.0.1:1"], timeout=2.0)
    observed = [health[m.client_url] for m in members]
    assert all(isinstance(s, Status) for s in observed)
    assert len({s.leader_id for s in observed if isinstance(s, Status)}) == 1
    assert isinstance(health["http://127.0.0.1:1"], EtcdUnavailable)

    voter = next(iter(ids))
    bogus = 0x1234
    with pytest.raises(MemberNotFound):
        await clients[0].member_remove(bogus)
    with pytest.raises(MemberNotFound):
        await clients[1].member_promote(bogus)

    # etcd weighs the member's replication progress before its role: a voter a few entries
    # behind the leader (just after start) is "not in sync" before it is "not a learner".
    async def promote_a_voter() -> None:
        with pytest.raises(MemberNotLearner):
            await clients[1].member_promote(voter)

    await eventually(promote_a_voter, "promote a voter", retry_on=(LearnerNotReady,), members=members)
    updated = await clients[2].member_update(voter, listed.by_id(voter).peer_urls)  # type: ignore[union-attr]
    assert {m.id for m in updated} == ids

    # Add a learner. Right after start, etcd refuses membership changes until it has
    # been connected to its peers for 5 s ("unhealthy cluster").
    new = launcher.member(3)
    added = await eventually(
        lambda: clients[0].member_add([new.peer_url], is_learner=True), "member_add",
        retry_on=(UnhealthyCluster,), members=members,
    )  # fmt: skip
    learner_id = added.member.id
    assert (added.member.name, added.member.peer_urls, added.member.client_urls) == ("", (new.peer_url,), ())
    assert added.member.is_learner and not added.member.is_started
    assert {m.id for m in added.members} == ids | {learner_id}
    listed = await clients[1].member_list()
    assert listed.by_id(learner_id) == added.member and [m.id for m in listed.learners] == [learner_id]

    with pytest.raises(TooManyLearners):
        await clients[0].member_add([f"http://{launcher.subnet}.9:2380"], is_learner=True)
    with pytest.raises(PeerURLExists):
        await clients[0].member_add([new.peer_url])
    with pytest.raises(LearnerNotReady):  # not started: nothing replicated yet
        await clients[0].member_promote(learner_id)

    initial = ",".join(f"{m.name}={m.peer_url}" for m in [*members, new])
    new.start(initial, state="existing")
    learner_status = await wait_ready(new, voter=False)
    assert learner_status.is_learner and learner_status.member_id == learner_id
    async with EtcdClient(new.client_url) as learner:
        with pytest.raises(NotSupportedForLearner):
            await learner.member_list()
        with pytest.raises(NotSupportedForLearner):
            await learner.member_list(linearizable=False)
        with pytest.raises(NotSupportedForLearner):
            await learner.put("k", "v")
        assert await learner.health()
        await learner.range("k", serializable=True)
        chunks: list[bytes] = []

        async def collect(chunk: bytes) -> None:
            chunks.append(chunk)

        taken = await learner.snapshot(collect)  # learners serve snapshots: backups need no voter
        assert taken.size == len(b"".join(chunks)) > taken.db_size
        promoted = await eventually(
            lambda: clients[2].member_promote(learner_id), "promote", retry_on=(LearnerNotReady,),
            members=[*members, new],
        )  # fmt: skip
        assert not next(m for m in promoted if m.id == learner_id).is_learner

        # The member applies its own promotion when the conf change reaches its log: a moment
        # after the leader answered.
        async def applied_here() -> None:
            assert (await learner.status()).is_learner is False

        await eventually(applied_here, "m3 to apply its own promotion", retry_on=(AssertionError,),
                         timeout=10, members=[*members, new])  # fmt: skip
        listed = await learner.member_list()
        assert listed.by_id(learner_id).name == "m3" and listed.learners == []  # type: ignore[union-attr]
    members.append(new)
    clients.append(EtcdClient(new.client_url))
    ids.add(learner_id)

    # Leadership moves only when asked of the leader.
    status = await clients[0].status()
    by_id = {
        s.member_id: (m, c)
        for m, c, s in zip(members, clients, [await c.status() for c in clients], strict=True)
    }
    leader = by_id[status.leader_id][1]
    followers = [i for i in ids if i != status.leader_id]
    target = followers[0]
    with pytest.raises(NotLeader):
        await by_id[followers[1]][1].move_leader(target)
    with pytest.raises(BadLeaderTransferee):
        await leader.move_leader(bogus)
    await leader.move_leader(target)
    moved = await by_id[target][1].status()
    assert moved.leader_id == target and moved.is_leader

    # Remove a follower of the new leader, then stop its process.
    victim = followers[1]
    new_leader = by_id[target][1]
    remaining = await eventually(
        lambda: new_leader.member_remove(victim),
        "member_remove",
        retry_on=(UnhealthyCluster,),
        members=members,
    )
    assert {m.id for m in remaining} == ids - {victim}
    by_id[victim][0].stop()
    assert {m.id for m in (await new_leader.member_list()).members} == ids - {victim}
    with pytest.raises(MemberNotFound):
        await new_leader.member_remove(victim)


# --------------------------------------------------------------------------- failures


async def test_unreachable() -> None:
    """Refused and silent endpoints both fail as EtcdUnavailable, within the timeout."""
    ip = f"{_subnet()}.1"
    refused = f"http://{ip}:{free_port(ip)}"
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind((ip, 0))
        silent.listen(8)
        hanging = f"http://{ip}:{silent.getsockname()[1]}"
        for endpoint in (refused, hanging):
            async with EtcdClient(endpoint, timeout=0.5) as client:
                started = time.monotonic()
                with pytest.raises(EtcdUnavailable) as caught:
                    await client.status()
                assert time.monotonic() - started < 3
                assert caught.value.endpoint == endpoint and caught.value.code is None
                assert not await client.health()
        health = await cluster_health([refused, hanging], timeout=0.5)
        assert all(isinstance(v, EtcdUnavailable) for v in health.values())


# --------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _write_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return key


def _make_certs(directory: Path, server_client_auth: bool = True) -> Certs:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = _write_key(directory / "ca.key")
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kustos test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))

    def leaf(name: str, usages: list[x509.ObjectIdentifier], sans: list[x509.GeneralName]) -> None:
        key = _write_key(directory / f"{name}.key")
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    # The server certificate needs clientAuth too: with --client-cert-auth, etcd's
    # gateway dials its own gRPC server presenting it as a client certificate.
    leaf(
        "server",
        [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if server_client_auth else [])],
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    leaf("client", [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    return Certs(
        directory / "ca.crt", directory / "server.crt", directory / "server.key",
        directory / "client.crt", directory / "client.key",
    )  # fmt: skip


@each_version
async def test_tls(launcher: Launcher, version: str, tmp_path: Path) -> None:
    """Mutual TLS to a DNS name (localhost): works with a client certificate, fails clearly without."""
    certs = _make_certs(tmp_path)
    member = launcher.member(0, ip="127.0.0.1", client_scheme="https", client_host="localhost")
    member.start(
        f"m0={member.peer_url}",
        extra=(
            "--client-cert-auth",
            f"--trusted-ca-file={certs.ca}",
            f"--cert-file={certs.server_cert}",
            f"--key-file={certs.server_key}",
        ),
    )
    tls = EtcdTLS(certs.ca, certs.client_cert, certs.client_key)
    status = await wait_ready(member, tls)
    assert member.client_url.startswith("https://localhost:")

    async with EtcdClient(member.client_url, tls) as client:
        revision = await client.put("secure", "yes")
        assert (await client.get("secure")).value == b"yes"  # type: ignore[union-attr]
        listed = await client.member_list()
        assert listed.members[0].client_urls == (member.client_url,)
        assert await client.health()
        chunks: list[bytes] = []

        async def collect(chunk: bytes) -> None:
            chunks.append(chunk)

        info = await client.snapshot(collect)
        assert info.revision == revision and len(b"".join(chunks)) == info.size
    health = await cluster_health([member.client_url], tls)
    assert isinstance(health[member.client_url], Status)
    assert health[member.client_url].member_id == status.member_id  # type: ignore[union-attr]

    for wrong in (EtcdTLS(certs.ca), EtcdTLS(), EtcdTLS(certs.ca, certs.server_cert, certs.server_key)):
        async with EtcdClient(member.client_url, wrong, timeout=2.0) as client:
            if wrong.cert_file == certs.server_cert:
                # A certificate from the same CA is a valid client certificate.
                assert (await client.status()).member_id == status.member_id
                continue
            with pytest.raises(EtcdTLSError) as caught:
                await client.status()
            assert "TLS" in str(caught.value) and member.client_url in str(caught.value)
            assert not await client.health()
    async with EtcdClient(f"https://127.0.0.1:{member.client_port}", tls) as by_ip:
        assert (await by_ip.status()).member_id == status.member_id


@each_version
async def test_tls_server_certificate_without_client_auth(
    launcher: Launcher, version: str, tmp_path: Path
) -> None:
    """etcd's gateway presents the server certificate to its own gRPC server: without the
    clientAuth usage every /v3 call fails (while /health still passes), as an EtcdTLSError.
    """
    certs = _make_certs(tmp_path, server_client_auth=False)
    member = launcher.member(0, ip="127.0.0.1", client_scheme="https", client_host="localhost")
    member.start(
        f"m0={member.peer_url}",
        extra=(
            "--client-cert-auth",
            f"--trusted-ca-file={certs.ca}",
            f"--cert-file={certs.server_cert}",
            f"--key-file={certs.server_key}",
        ),
    )
    async with EtcdClient(
        member.client_url, EtcdTLS(certs.ca, certs.client_cert, certs.client_key)
    ) as client:
        assert await eventually(
            lambda: _healthy(client), "/health", retry_on=(AssertionError,), members=[member]
        )

        async def refused() -> EtcdTLSError:
            try:
                await client.status()
            except EtcdTLSError as err:
                return err
            raise AssertionError("status worked with a server certificate that cannot authenticate clients")

        # Go's gRPC dial hits the same TLS 1.3 race as any client: some attempts fail with
        # only "broken pipe" (an EtcdUnavailable); the TLS error shows within a few tries.
        error = await eventually(
            refused, "the gateway's TLS error", retry_on=(EtcdUnavailable,), members=[member]
        )
        assert error.code == 14 and "must allow client auth" in str(error)


async def _healthy(client: EtcdClient) -> bool:
    assert await client.health()
    return True
