"""spec.maintenance (issue 5): automatic compaction flags and defragmentation, on real etcd members."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from kustos.etcd.client import Compacted, EtcdClient, EtcdTLS, NoSpace
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_rejected,
    endpoint_status,
    etcd_cluster,
    put_all,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_tls import user_client_certificate

pytestmark = pytest.mark.process_runner(
    "compaction and defragmentation are etcd's, driven by kustos's client"
)

MiB = 2**20
VALUE = b"x" * (64 * 1024)
BULK_KEYS = 200  # about 13 MB of values that are then deleted
KEEP_KEYS = 50


def maintenance(enabled: bool) -> dict[str, Any]:
    return {
        "autoCompaction": {"mode": "periodic", "retention": "3s"},
        "defragmentation": {"enabled": enabled, "threshold": 0.5, "minDbSize": "4Mi", "checkInterval": "1s"},
    }


async def fill_and_free(endpoint: str, tls: EtcdTLS | None = None) -> None:
    """Write bulk data and keys to keep, delete the bulk, compact: most of each database is free."""
    async with EtcdClient(endpoint, tls, timeout=10.0) as client:
        for i in range(KEEP_KEYS):
            await client.put(f"/keep/{i:03d}", f"value-{i}")
        await put_all(client, ((f"/bulk/{i:04d}", VALUE) for i in range(BULK_KEYS)))
        assert await client.delete("/bulk/", prefix=True) == BULK_KEYS
        revision = await client.put("/keep/last", "last")
        with contextlib.suppress(Compacted):  # the periodic auto-compaction may get there first
            await client.compact(revision, physical=True)


def sizes(status: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(dbSize, dbSizeInUse) per client URL, as etcdctl endpoint status reports them."""
    return {
        s["Endpoint"]: (int(s["Status"]["dbSize"]), int(s["Status"].get("dbSizeInUse", 0)))
        for s in endpoint_status(status)
    }


def process_args(kubectl: Kubectl, pod: str) -> list[str]:
    pid = kubectl.cluster.container_pid(kubectl.namespace, pod, "etcd")
    assert pid is not None, f"no etcd process for {pod}"
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


async def test_compaction_flags_and_defragmentation_one_member_at_a_time_leader_last(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("m", 3, maintenance=maintenance(enabled=False)))
    status = await wait_healthy(kubectl, "m", 3)
    urls = {m["name"]: m["clientUrl"] for m in status["members"]}

    # The compaction settings reach the running etcd processes ...
    for pod in urls:
        args = process_args(kubectl, pod)
        assert "--auto-compaction-mode=periodic" in args and "--auto-compaction-retention=3s" in args

    # ... and etcd compacts by itself: an old revision soon becomes unreadable.
    async with EtcdClient(urls["m-0"]) as client:
        old = await client.put("/probe", "1")
        await client.put("/probe", "2")

        async def compacted() -> bool:
            try:
                await client.range("/probe", revision=old)
            except Compacted:
                return True
            await client.put("/probe/tick", "t")  # new revisions for the compactor to move to
            return False

        await wait_until(compacted, "etcd's periodic compaction", timeout=60, interval=1)

    await fill_and_free(urls["m-0"])

    seen: list[dict[str, tuple[int, int]]] = []

    async def fragmented() -> dict[str, tuple[int, int]] | None:
        # A member counts the space in use when it commits: keep writing (and compacting) a little.
        async with EtcdClient(urls["m-0"]) as client:
            revision = await client.put("/tick", "t")
            with contextlib.suppress(Compacted):
                await client.compact(revision)
        now = sizes(status)
        seen.append(now)
        ok = all(size >= 4 * MiB and (size - used) / size > 0.5 for size, used in now.values())
        return now if ok else None

    try:
        before = await wait_until(fragmented, "every member's database mostly free", timeout=60, interval=1)
    except AssertionError as err:
        raise AssertionError(f"{err}; (dbSize, dbSizeInUse) last seen: {seen[-1:]}") from None
    leader = next(m["name"] for m in status_of(kubectl, "m")["members"] if m["leader"])
    assert not (status_of(kubectl, "m").get("maintenance") or {}).get("defragmentations")

    kubectl("patch", "etcdcluster", "m", "--type=merge", "-p",
            '{"spec":{"maintenance":{"defragmentation":{"enabled":true}}}}')  # fmt: skip

    async def defragmented() -> list[dict[str, Any]] | None:
        records = (status_of(kubectl, "m").get("maintenance") or {}).get("defragmentations") or []
        done = [r for r in records if r.get("completedAt")]
        return done if len(done) == 3 else None

    records = await wait_until(defragmented, "three defragmentations", timeout=120, interval=0.5,
                               cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip

    # Every member shrank, by etcd's own account.
    after = sizes(status_of(kubectl, "m"))
    for url, (size, _) in before.items():
        assert after[url][0] < size / 2, f"{url}: {size} -> {after[url][0]} bytes"
    for r in records:
        assert r.get("error") is None
        assert r["dbSizeAfter"] < r["dbSizeBefore"] and r["reclaimed"] == r["dbSizeBefore"] - r["dbSizeAfter"]

    # One at a time, followers first, the leader last.
    records.sort(key=lambda r: (r["startedAt"], r["completedAt"]))
    for earlier, later in itertools.pairwise(records):
        assert earlier["completedAt"] <= later["startedAt"], records
    assert [r["leader"] for r in records] == [False, False, True], records
    assert records[-1]["member"] == leader
    started = [line for line in operator.log().splitlines() if "defragmenting " in line]
    assert len(started) == 3 and f"leader {leader}:" in started[-1], started

    selector = "involvedObject.name=m,reason=Defragmented"
    events = kubectl.get("events", None, "--field-selector", selector)["items"]
    assert len(events) == 3
    assert all("bytes" in e["message"] and "reclaimed" in e["message"] for e in events)
    failures = kubectl.get("events", None, "--field-selector", "reason=DefragmentationFailed")["items"]
    assert failures == []

    # Nothing was lost, on any member.
    for url in urls.values():
        async with EtcdClient(url) as client:
            kept = await client.range("/keep/", prefix=True, serializable=True)
            bulk = await client.range("/bulk/", prefix=True, count_only=True, serializable=True)
        assert len(kept.kvs) == KEEP_KEYS + 1 and bulk.count == 0
        assert {kv.key.decode(): kv.value.decode() for kv in kept.kvs}["/keep/007"] == "value-7"

    # A settled cluster: nothing more to do, and the EtcdCluster controller's status is intact.
    await asyncio.sleep(3)
    final = status_of(kubectl, "m")
    assert final["phase"] == "Running" and final["ready"] == "3/3"
    assert final["maintenance"].get("inProgress") is None
    assert len(kubectl.get("events", None, "--field-selector", "reason=Defragmented")["items"]) == 3


async def test_a_tls_cluster_is_defragmented_with_the_operators_client_certificate(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    """Members of a TLS cluster refuse clients without a certificate from the cluster's CA:
    maintenance uses the operator's, defragments followers first and the leader last while a
    writer (trusting the CA) keeps writing, and the operator's certificate files go when it stops."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with running_operator(kubectl, tmp_path / "operator", env={"TMPDIR": str(tmpdir)}) as operator:
        kubectl.apply(etcd_cluster("mt", 3, tls={}, maintenance=maintenance(enabled=False)))
        status = await wait_healthy(kubectl, "mt", 3, timeout=180)
        urls = {m["name"]: m["clientUrl"] for m in status["members"]}
        assert all(u.startswith("https://") for u in urls.values()), urls
        user = user_client_certificate(kubectl, "mt", tmp_path / "user")
        await fill_and_free(urls["mt-0"], user)

        async def tls_sizes() -> dict[str, tuple[int, int]]:
            found = {}
            for url in urls.values():
                async with EtcdClient(url, user, timeout=5.0) as client:
                    s = await client.status()
                found[url] = (s.db_size, s.db_size_in_use)
            return found

        seen: list[dict[str, tuple[int, int]]] = []

        async def fragmented() -> dict[str, tuple[int, int]] | None:
            async with EtcdClient(urls["mt-0"], user) as client:
                revision = await client.put("/tick", "t")
                with contextlib.suppress(Compacted):
                    await client.compact(revision)
            now = await tls_sizes()
            seen.append(now)
            ok = all(size >= 4 * MiB and (size - used) / size > 0.5 for size, used in now.values())
            return now if ok else None

        try:
            before = await wait_until(
                fragmented, "every member's database mostly free", timeout=60, interval=1
            )
        except AssertionError as err:
            raise AssertionError(f"{err}; (dbSize, dbSizeInUse) last seen: {seen[-1:]}") from None

        writer = Writer(list(urls.values()), tls=user)
        writer.start()
        try:
            await asyncio.sleep(1)
            kubectl("patch", "etcdcluster", "mt", "--type=merge", "-p",
                    '{"spec":{"maintenance":{"defragmentation":{"enabled":true}}}}')  # fmt: skip

            async def defragmented() -> list[dict[str, Any]] | None:
                records = (status_of(kubectl, "mt").get("maintenance") or {}).get("defragmentations") or []
                done = [r for r in records if r.get("completedAt")]
                return done if len(done) == 3 else None

            records = await wait_until(defragmented, "three defragmentations", timeout=120, interval=0.5,
                                       cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
            await asyncio.sleep(1)
        finally:
            await writer.stop()

        # Each member was defragmented once, without error, and shrank by etcd's own account.
        assert sorted(r["member"] for r in records) == sorted(urls), records
        for r in records:
            assert r.get("error") is None, r
            assert r["dbSizeAfter"] < r["dbSizeBefore"] / 2, r
        after = await tls_sizes()
        for url, (size, _) in before.items():
            assert after[url][0] < size / 2, f"{url}: {size} -> {after[url][0]} bytes"

        # One at a time, followers first, the leader last.
        records.sort(key=lambda r: (r["startedAt"], r["completedAt"]))
        for earlier, later in itertools.pairwise(records):
            assert earlier["completedAt"] <= later["startedAt"], records
        assert [r["leader"] for r in records] == [False, False, True], records
        started = [line for line in operator.log().splitlines() if "defragmenting " in line]
        assert len(started) == 3 and f"leader {records[-1]['member']}:" in started[-1], started
        events = kubectl.get("events", None, "--field-selector", "involvedObject.name=mt,reason=Defragmented")
        assert len(events["items"]) == 3
        failures = kubectl.get("events", None, "--field-selector", "reason=DefragmentationFailed")["items"]
        assert failures == []

        # The writer, trusting the CA, lost nothing; the kept keys are on every member.
        # It kept writing through the defragmentations; how many writes fit in that window
        # depends on the machine's load (11 on a loaded CI run), so the bound is loose.
        assert len(writer.acknowledged) >= 5, writer.acknowledged
        for url in urls.values():
            assert await writer.missing(url) == [], url
            async with EtcdClient(url, user) as client:
                kept = await client.range("/keep/", prefix=True, serializable=True)
            assert len(kept.kvs) == KEEP_KEYS + 1
        final = status_of(kubectl, "mt")
        assert final["phase"] == "Running" and final["ready"] == "3/3"
        assert final["maintenance"].get("inProgress") is None

        # The client certificate lives in one private directory both controllers share ...
        workdirs = list(tmpdir.glob("kustos-etcd-tls-*"))
        assert len(workdirs) == 1, workdirs
        assert (workdirs[0] / kubectl.namespace / "mt" / "tls.key").is_file()
    # ... which is gone once the operator has stopped.
    assert operator.process.returncode == 0
    assert list(tmpdir.glob("kustos-etcd-tls-*")) == []


def test_invalid_maintenance_settings_are_refused_naming_the_field(crds: None, kubectl: Kubectl) -> None:
    revision = {"autoCompaction": {"mode": "revision", "retention": "1h"}}
    assert_rejected(
        kubectl, etcd_cluster("bad", 1, maintenance=revision), "spec.maintenance.autoCompaction.retention"
    )
    threshold = {"defragmentation": {"threshold": 1.5}}
    assert_rejected(
        kubectl, etcd_cluster("bad", 1, maintenance=threshold), "spec.maintenance.defragmentation.threshold"
    )
    size = {"defragmentation": {"minDbSize": "64 megabytes"}}
    assert_rejected(
        kubectl, etcd_cluster("bad", 1, maintenance=size), "spec.maintenance.defragmentation.minDbSize"
    )
    cron = {"defragmentation": {"schedule": "nightly"}}
    assert_rejected(
        kubectl, etcd_cluster("bad", 1, maintenance=cron), "spec.maintenance.defragmentation.schedule"
    )


async def test_an_impossible_schedule_is_reported_not_retried(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    """A schedule the guard webhook refuses, admitted while no operator answered the webhook
    (its failurePolicy is Ignore): created before the operator starts. Created after, it raced
    the operator's webhook configuration, which a CI run's operator won."""
    kubectl.apply(etcd_cluster("s", 1, maintenance={"defragmentation": {"schedule": "61 * * * *"}}))

    async def reported() -> str | None:
        message = (status_of(kubectl, "s").get("maintenance") or {}).get("message")
        return str(message) if message else None

    with running_operator(kubectl, tmp_path / "operator"):
        message = await wait_until(reported, "the schedule's error in status", timeout=60)
        assert "spec.maintenance.defragmentation.schedule" in message and "61 * * * *" in message
        events = kubectl.get("events", None, "--field-selector", "reason=MaintenanceInvalid")["items"]
        assert len(events) == 1 and events[0]["type"] == "Warning"
        await wait_healthy(kubectl, "s", 1)  # the cluster itself is not held up


async def test_a_defragmentation_interrupted_by_an_operator_restart_is_recorded(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """An operator stopped mid-defragmentation leaves status.maintenance.inProgress: the next one
    waits for that member to answer again, records the outcome, and goes on."""
    kubectl.apply(etcd_cluster("i", 1, maintenance={"defragmentation": {"enabled": False}}))
    status = await wait_healthy(kubectl, "i", 1)
    in_progress = {
        "member": "i-0",
        "startedAt": "2026-01-01T00:00:00Z",
        "dbSizeBefore": 10 * 2**30,
        "leader": True,
    }
    kubectl("patch", "etcdcluster", "i", "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"maintenance": {"inProgress": in_progress}}}))  # fmt: skip

    async def recorded() -> dict[str, Any] | None:
        maintenance = status_of(kubectl, "i").get("maintenance") or {}
        records = maintenance.get("defragmentations") or []
        return records[0] if records and not maintenance.get("inProgress") else None

    record = await wait_until(recorded, "the interrupted defragmentation recorded", timeout=60)
    async with EtcdClient(status["members"][0]["clientUrl"]) as client:
        size = (await client.status()).db_size
    assert record["member"] == "i-0" and record["completedAt"] and record.get("error") is None
    assert record["dbSizeBefore"] == 10 * 2**30 and 0 < record["dbSizeAfter"] <= size * 2
    assert record["reclaimed"] == record["dbSizeBefore"] - record["dbSizeAfter"]
    events = kubectl.get("events", None, "--field-selector", "reason=Defragmented")["items"]
    assert len(events) == 1 and "i-0" in events[0]["message"]
    final = status_of(kubectl, "i")
    assert final["phase"] == "Running" and final["ready"] == "1/1"


async def test_the_nospace_alarm_is_recovered_without_a_human(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """A small quota reached on purpose by overwriting one key: etcd raises NOSPACE and refuses
    writes; the operator compacts, defragments each member and disarms, and writes go on."""
    kubectl.apply(etcd_cluster("full", 3, extraArgs=[f"--quota-backend-bytes={16 * MiB}"],
                               maintenance={"defragmentation": {"enabled": False}}))  # fmt: skip
    status = await wait_healthy(kubectl, "full", 3)
    endpoint = status["members"][0]["clientUrl"]
    refused = False
    async with EtcdClient(endpoint, timeout=10.0) as client:
        for i in itertools.count():  # history of one key: all of it is freed by a compaction
            try:
                await client.put("/big", VALUE + str(i).encode())
            except NoSpace:
                refused = True
                break
            assert i < 2000, "the quota was never reached"
    assert refused

    async def recovered() -> bool:
        events = kubectl("get", "events", "--field-selector", "involvedObject.name=full")
        if "SpaceRecovered" not in events:
            return False
        async with EtcdClient(endpoint, timeout=5.0) as client:
            await client.put("/after", "accepted")
        return True

    await wait_until(recovered, "writes accepted again after the NOSPACE recovery", timeout=90,
                     cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    events = kubectl("get", "events", "--field-selector", "involvedObject.name=full")
    assert "NoSpace" in events and "NoSpaceRecovering" in events and "Defragmented" in events, events

    async def space_said() -> dict[str, Any] | None:
        current = status_of(kubectl, "full")
        space = next(c for c in current["conditions"] if c["type"] == "SpaceAvailable")
        return current if space["status"] == "True" else None

    current = await wait_until(space_said, "SpaceAvailable back to True", timeout=30)
    assert current["phase"] == "Running"  # never reported as a quorum loss
    assert sorted(current["maintenance"]["defragmentations"][i]["member"] for i in range(3)) == [
        m["name"] for m in sorted(current["members"], key=lambda m: m["name"])
    ]
