"""Rolling etcd upgrades (F-ETCD-9) between the two real etcd versions the dev cluster builds."""

from __future__ import annotations

from typing import Any

import pytest

from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.etcd.versions import image_version
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    etcd_cluster,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess

OLD, NEW = (v.lstrip("v") for v in ETCD_VERSIONS)


def pod_versions(kubectl: Kubectl, name: str) -> dict[str, str]:
    pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    return {p["metadata"]["name"]: str(image_version(p["spec"]["containers"][0]["image"])) for p in pods}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


@pytest.mark.parametrize("storage", ["emptyDir", "pvc"])
async def test_upgrade_one_member_at_a_time_leader_last_keeping_every_write(
    storage: str, kubectl: Kubectl, operator: OperatorProcess
) -> None:
    name = f"up-{storage.lower()}"
    kubectl.apply(etcd_cluster(name, 3, version=OLD, storage={"type": storage}))
    status = await wait_healthy(kubectl, name, 3)
    leader = next(m["name"] for m in status["members"] if m["leader"])
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    seen: list[dict[str, Any]] = []
    try:

        async def writing() -> bool:
            return len(writer.acknowledged) >= 20

        await wait_until(writing, "the writer to get going", timeout=30)
        before = len(writer.acknowledged)
        kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{NEW}"}}}}')

        async def upgraded() -> bool:
            current = status_of(kubectl, name)
            writer.update(current)
            seen.append(current)
            members = current.get("members") or []
            return (
                current.get("currentVersion") == NEW and current.get("phase") == "Running"
                and len(members) == 3 and all(m["healthy"] for m in members)
            )  # fmt: skip

        await wait_until(upgraded, f"{name} on etcd {NEW}", timeout=240, cluster=kubectl.cluster,
                         namespace=kubectl.namespace)  # fmt: skip
        during = len(writer.acknowledged) - before
    finally:
        await writer.stop()
    status = await wait_healthy(kubectl, name, 3)
    assert set(pod_versions(kubectl, name).values()) == {NEW}
    assert {m["version"] for m in status["members"]} == {NEW}
    # Never more than one member away from its place at any moment.
    assert all(len(s.get("members") or []) <= 4 for s in seen)
    assert all(sum(1 for m in s.get("members") or [] if not m["healthy"]) <= 1 for s in seen)
    # The first leader was the last member on the old version.
    last_old = [
        {m["name"] for m in s.get("members") or [] if m.get("version") == OLD} for s in seen
    ]  # fmt: skip
    last_non_empty = [names for names in last_old if names][-1]
    assert last_non_empty == {leader}, last_old
    assert "Upgrading" in {s.get("phase") for s in seen}
    assert_consistent(kubectl, name, 3, status)
    assert during > 0, f"no write was acknowledged during the upgrade ({writer.failures} failed)"
    assert await writer.missing(status["members"][0]["clientUrl"]) == []
    events = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")
    assert "Upgraded" in events


async def test_a_downgrade_or_a_skipped_minor_is_refused_without_touching_the_cluster(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    kubectl.apply(etcd_cluster("down", 1, version=NEW))
    await wait_healthy(kubectl, "down", 1)
    before = kubectl.get("pods", "-l", "kustos.dev/cluster=down")["items"]
    major, minor, _ = NEW.split(".")
    for wanted, why in ((OLD, "downgrading"), (f"{major}.{int(minor) + 2}.0", "skips a minor version")):
        kubectl("patch", "etcdcluster", "down", "--type=merge", "-p", f'{{"spec":{{"version":"{wanted}"}}}}')

        async def refused(why: str = why) -> dict[str, Any] | None:
            accepted = condition(status_of(kubectl, "down"), "VersionAccepted")
            return accepted if accepted.get("status") == "False" and why in accepted["message"] else None

        await wait_until(refused, f"{wanted} refused", timeout=30)
        events = kubectl(
            "get", "events", "--field-selector", "involvedObject.name=down,reason=UpgradeRefused"
        )
        assert why in events
    status = await wait_healthy(kubectl, "down", 1)
    after = kubectl.get("pods", "-l", "kustos.dev/cluster=down")["items"]
    assert [p["metadata"]["uid"] for p in after] == [p["metadata"]["uid"] for p in before]
    assert status["currentVersion"] == NEW
    # Back to the running version: accepted again.
    kubectl("patch", "etcdcluster", "down", "--type=merge", "-p", f'{{"spec":{{"version":"{NEW}"}}}}')

    async def accepted() -> bool:
        return condition(status_of(kubectl, "down"), "VersionAccepted").get("status") == "True"

    await wait_until(accepted, "the running version accepted again", timeout=30)
