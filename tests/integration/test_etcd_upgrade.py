"""Rolling etcd upgrades and rollbacks (F-ETCD-9) between the real etcd versions of the dev cluster:
the newest minor step (3.6 -> 3.7 and back) on both storage types, the older one (3.5 <-> 3.6) once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.devcluster.cluster import DevClusterError
from kustos.etcd.versions import image_version
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    etcd_cluster,
    status_of,
    wait_healthy,
    watched_statuses,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

pytestmark = pytest.mark.process_runner(
    "upgrade order over three etcd versions; 3.6 <-> 3.7 on runc: test_real_nodes_lifecycle"
)

OLDEST, OLD, NEW = (v.lstrip("v") for v in ETCD_VERSIONS)


def pod_versions(kubectl: Kubectl, name: str) -> dict[str, str]:
    pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    return {p["metadata"]["name"]: str(image_version(p["spec"]["containers"][0]["image"])) for p in pods}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


@dataclass
class Roll:
    """What a version change looked like from outside: every status stored through the roll."""

    status: dict[str, Any]
    seen: list[dict[str, Any]]
    first_leader: str
    pods_before: dict[str, str]  # name -> uid
    restarts_before: dict[str, int]  # name -> restarts of its etcd container
    written_during: int
    writer: Writer
    seconds: float  # from the spec change to every member healthy on the new version


async def roll(kubectl: Kubectl, name: str, storage: str, start: str, to: str) -> Roll:
    """Create a 3-member cluster on ``start``, then change spec.version to ``to`` under a writer."""
    kubectl.apply(etcd_cluster(name, 3, version=start, storage={"type": storage}))
    status = await wait_healthy(kubectl, name, 3)
    leader = next(m["name"] for m in status["members"] if m["leader"])
    pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods}
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    try:

        async def writing() -> bool:
            return len(writer.acknowledged) >= 20

        await wait_until(writing, "the writer to get going", timeout=30)
        before = len(writer.acknowledged)
        began = time.monotonic()
        with watched_statuses(kubectl, "etcdcluster", name) as watched:

            async def watching() -> bool:
                return bool(watched)

            await wait_until(watching, f"a watch on {name}", timeout=30)
            kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{to}"}}}}')

            async def rolled() -> bool:
                current = status_of(kubectl, name)
                writer.update(current)
                members = current.get("members") or []
                return (
                    current.get("currentVersion") == to and current.get("phase") == "Running"
                    and len(members) == 3 and all(m["healthy"] for m in members)
                )  # fmt: skip

            await wait_until(rolled, f"{name} on etcd {to}", timeout=240, cluster=kubectl.cluster,
                             namespace=kubectl.namespace)  # fmt: skip
            seconds = time.monotonic() - began
            during = len(writer.acknowledged) - before
        seen = list(watched)
    finally:
        await writer.stop()
    status = await wait_healthy(kubectl, name, 3)
    print(f"{name}: {start} -> {to} rolled in {seconds:.1f} s, {during} writes acknowledged meanwhile, "
          f"longest write outage {writer.longest_outage():.2f} s")  # fmt: skip
    return Roll(status, seen, leader, pods_before, restarts, during, writer, seconds)


async def assert_rolled_one_at_a_time_leader_last(
    kubectl: Kubectl, name: str, r: Roll, start: str, to: str
) -> None:
    assert set(pod_versions(kubectl, name).values()) == {to}
    assert {m["version"] for m in r.status["members"]} == {to}
    # Never more than one member away from its place at any moment.
    assert all(len(s.get("members") or []) <= 4 for s in r.seen)
    assert all(sum(1 for m in s.get("members") or [] if not m["healthy"]) <= 1 for s in r.seen)
    # The first leader was the last member on the old version.
    last_old = [{m["name"] for m in s.get("members") or [] if m.get("version") == start} for s in r.seen]
    last_non_empty = [names for names in last_old if names][-1]
    assert last_non_empty == {r.first_leader}, last_old
    assert "Upgrading" in {s.get("phase") for s in r.seen}
    assert_consistent(kubectl, name, 3, r.status)
    assert r.written_during > 0, f"no write was acknowledged while rolling ({r.writer.failures} failed)"
    assert await r.writer.missing(r.status["members"][0]["clientUrl"]) == []


def _short(version: str) -> str:
    return version.replace(".", "")[:2]  # 3.7.3 -> 37


@pytest.mark.parametrize(
    ("start", "to", "storage"),
    [(OLD, NEW, "emptyDir"), (OLD, NEW, "pvc"), (OLDEST, OLD, "emptyDir")],
    ids=[f"{_short(OLD)}-{_short(NEW)}-emptydir", f"{_short(OLD)}-{_short(NEW)}-pvc",
         f"{_short(OLDEST)}-{_short(OLD)}-emptydir"],
)  # fmt: skip
async def test_upgrade_one_member_at_a_time_leader_last_keeping_every_write(
    start: str, to: str, storage: str, kubectl: Kubectl, operator: OperatorProcess
) -> None:
    name = f"up{_short(to)}-{storage.lower()}"
    r = await roll(kubectl, name, storage, start, to)
    await assert_rolled_one_at_a_time_leader_last(kubectl, name, r, start, to)
    events = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")
    assert "Upgraded" in events


@pytest.mark.parametrize(
    ("start", "to", "storage"),
    [(NEW, OLD, "emptyDir"), (NEW, OLD, "pvc"), (OLD, OLDEST, "pvc")],
    ids=[f"{_short(NEW)}-{_short(OLD)}-emptydir", f"{_short(NEW)}-{_short(OLD)}-pvc",
         f"{_short(OLD)}-{_short(OLDEST)}-pvc"],
)  # fmt: skip
async def test_rollback_to_the_previous_minor_through_etcds_downgrade_keeping_every_write(
    start: str, to: str, storage: str, kubectl: Kubectl, operator: OperatorProcess
) -> None:
    name = f"back{_short(to)}-{storage.lower()}"
    r = await roll(kubectl, name, storage, start, to)
    await assert_rolled_one_at_a_time_leader_last(kubectl, name, r, start, to)
    # In place: the same pods (a new member of the older minor could not join), each restarted once.
    pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == r.pods_before
    restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods}
    assert restarts == {name: r.restarts_before[name] + 1 for name in restarts}, restarts
    events = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")
    for reason in ("DowngradeEnabled", "MemberRollingBack", "Downgraded"):
        assert reason in events, events
    # etcd finished its downgrade by itself once every member ran the old minor.
    assert r.status["members"] and all(m["version"] == to for m in r.status["members"])


@pytest.mark.parametrize("storage", ["emptyDir", "pvc"])
async def test_a_member_lost_mid_rollback_is_brought_back_and_the_rollback_finishes(
    storage: str, kubectl: Kubectl, operator: OperatorProcess
) -> None:
    """A member's pod deleted once etcd's downgrade is enabled: with a PVC it comes back on its
    volume on the version its data is for, then is rolled back in place; with emptyDir it is
    removed, the two left finish the rollback (etcd refuses any new member during its
    downgrade), and then a member of the old minor joins."""
    name = f"lost-{storage.lower()}"
    kubectl.apply(etcd_cluster(name, 3, version=NEW, storage={"type": storage}))
    status = await wait_healthy(kubectl, name, 3)
    before = {m["name"]: m["id"] for m in status["members"]}
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    try:
        kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{OLD}"}}}}')

        async def enabled() -> bool:
            return "DowngradeEnabled" in kubectl(
                "get", "events", "--field-selector", f"involvedObject.name={name}"
            )

        await wait_until(enabled, "etcd's downgrade enabled", timeout=60)
        # The follower with the highest index: the rollback restarts the lowest one first.
        followers = [m["name"] for m in status_of(kubectl, name)["members"] if not m["leader"]]
        lost = max(followers, key=lambda n: int(n.rsplit("-", 1)[1]))
        assert pod_versions(kubectl, name)[lost] == NEW, "the lost member had not been rolled back yet"
        kubectl("delete", "pod", lost, "--wait=false")

        async def rolled_back() -> dict[str, Any] | None:
            current = status_of(kubectl, name)
            writer.update(current)
            members = current.get("members") or []
            done = (
                current.get("currentVersion") == OLD and current.get("phase") == "Running"
                and len(members) == 3 and all(m["healthy"] and m["version"] == OLD for m in members)
            )  # fmt: skip
            return current if done else None

        await wait_until(rolled_back, f"{name} back to 3 members on etcd {OLD}", timeout=240,
                         cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    finally:
        await writer.stop()
    status = await wait_healthy(kubectl, name, 3)
    assert set(pod_versions(kubectl, name).values()) == {OLD}
    after = {m["name"]: m["id"] for m in status["members"]}
    pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    restarts = {p["metadata"]["name"]: p["status"]["containerStatuses"][0]["restartCount"] for p in pods}
    if storage == "pvc":
        # The same member, back on its data: recreated on the version its data was for, then
        # rolled back in place like the others (one restart).
        assert after == before
        assert restarts[lost] == 1, restarts
    else:  # one new member in its place
        assert lost not in after and len(set(after) - set(before)) == 1, (before, after, restarts)
    assert_consistent(kubectl, name, 3, status)
    assert len(writer.acknowledged) > 20 and await writer.missing(status["members"][0]["clientUrl"]) == []
    events = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")
    assert "Downgraded" in events and "UpgradeHalted" not in events


def _minor(version: str, delta: int) -> str:
    major, minor, _ = version.split(".")
    return f"{major}.{int(minor) + delta}.0"


@pytest.mark.parametrize(
    ("running", "refused"),
    [
        # Two minors down walks back through etcd's downgrade (test_etcd_upgrade_chain.py); two
        # up passes through a minor no test proves.
        (NEW, [(_minor(NEW, 2), "kustos proves")]),
        (OLDEST, [(_minor(OLDEST, -1), "has no downgrade protocol")]),
    ],
    ids=["skips", "no-downgrade-protocol"],
)
async def test_a_skip_or_an_unsupported_downgrade_is_refused_without_touching_the_cluster(
    running: str, refused: list[tuple[str, str]], kubectl: Kubectl, operator: OperatorProcess
) -> None:
    name = f"down-{running.replace('.', '')}"
    kubectl.apply(etcd_cluster(name, 1, version=running))
    await wait_healthy(kubectl, name, 1)
    before = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    for wanted, why in refused:
        # The operator's validating webhook refuses the change at the API server, naming
        # the field (the controller refuses it too, with VersionAccepted=False and an
        # UpgradeRefused event, when the webhook is unreachable: planner unit tests).
        with pytest.raises(DevClusterError) as refusal:
            kubectl(
                "patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{wanted}"}}}}'
            )
        # 3.4 is also below the supported minimum: either validator may answer first.
        assert "spec.version" in str(refusal.value)
        assert why in str(refusal.value) or "the oldest kustos supports" in str(refusal.value)
        assert kubectl.get("etcdcluster", name)["spec"]["version"] == running
    status = await wait_healthy(kubectl, name, 1)
    after = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    assert [p["metadata"]["uid"] for p in after] == [p["metadata"]["uid"] for p in before]
    assert all(s["restartCount"] == 0 for p in after for s in p["status"]["containerStatuses"])
    assert status["currentVersion"] == running
    assert condition(status_of(kubectl, name), "VersionAccepted").get("status") == "True"
