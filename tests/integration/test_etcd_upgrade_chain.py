"""Changes of spec.version across several minors in one change (issue 22 item 2): 3.5 -> 3.7
through the newest proven 3.6 under a writer, across an operator restart; 3.7 -> 3.5 back one
minor at a time through etcd's downgrade; a step that cannot run, halted with a condition; and
a path kustos cannot walk, refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster.binaries import ETCD_VERSIONS
from kustos.devcluster.cluster import DevClusterError
from kustos.images import DEFAULT_ETCD_REPOSITORY, etcd_image
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    Writer,
    assert_consistent,
    etcd_cluster,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess, start_chart_operator
from tests.integration.test_etcd_upgrade import condition, pod_versions
from tests.integration.test_maintenance_extras import policy

pytestmark = pytest.mark.process_runner(
    "chained minors across an operator restart are kustos's plan; one minor on runc: lifecycle"
)

OLDEST, OLD, NEW = (v.lstrip("v") for v in ETCD_VERSIONS)


def events(kubectl: Kubectl, name: str) -> str:
    return kubectl("get", "events", "--field-selector", f"involvedObject.name={name}")


def start_operator_again(kubectl: Kubectl, log_dir: Path, attempts: int = 3) -> OperatorProcess:
    """The test's operator, as ``running_operator`` starts it; on a machine so loaded that it
    does not serve /healthz within 30 s, tried again (the slow one is killed first)."""
    for attempt in range(attempts):
        try:
            return start_chart_operator(
                kubectl.cluster, log_dir / str(attempt), "--namespace", kubectl.namespace
            )
        except AssertionError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


async def walk(
    kubectl: Kubectl, name: str, writer: Writer, to: str, seen: list[dict[str, Any]], timeout: float = 360
) -> dict[str, Any]:
    """Until every member runs ``to``, healthy, and no path is recorded any more."""

    async def arrived() -> dict[str, Any] | None:
        current = status_of(kubectl, name)
        writer.update(current)
        seen.append(current)
        members = current.get("members") or []
        done = (
            current.get("currentVersion") == to and current.get("phase") == "Running"
            and "versionPath" not in current and len(members) == 3
            and all(m["healthy"] and m.get("version") == to for m in members)
        )  # fmt: skip
        return current if done else None

    return await wait_until(arrived, f"{name} on etcd {to}", timeout=timeout, interval=0.5,
                            cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip


@pytest.mark.timeout(900)
async def test_35_to_37_in_one_change_walks_36_keeps_every_write_and_survives_an_operator_restart(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    name = "chain-up"
    seen: list[dict[str, Any]] = []
    first = start_operator_again(kubectl, tmp_path / "a")
    try:
        kubectl.apply(etcd_cluster(name, 3, version=OLDEST))
        status = await wait_healthy(kubectl, name, 3)
        writer = Writer([m["clientUrl"] for m in status["members"]])
        writer.start()
        try:

            async def writing() -> bool:
                return len(writer.acknowledged) >= 20

            await wait_until(writing, "the writer to get going", timeout=30)
            began = time.monotonic()
            kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{NEW}"}}}}')

            async def mid_first_step() -> dict[str, Any] | None:
                current = status_of(kubectl, name)
                writer.update(current)
                seen.append(current)
                on_36 = [v for v in pod_versions(kubectl, name).values() if v == OLD]
                return current if on_36 and (current.get("versionPath") or {}).get("step") == OLD else None

            mid = await wait_until(mid_first_step, f"a member of {name} on etcd {OLD}", timeout=120,
                                   cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
            assert mid["versionPath"]["steps"] == [OLD, NEW] and mid["versionPath"]["source"] == OLDEST
            # The operator goes away in the middle of the first step (off the event loop: the
            # writer keeps writing meanwhile).
            await asyncio.to_thread(first.stop)
        except BaseException:
            await writer.stop()
            raise
    finally:
        if first.alive():
            first.stop()
    try:
        second = await asyncio.to_thread(start_operator_again, kubectl, tmp_path / "b")
        try:
            status = await walk(kubectl, name, writer, NEW, seen)
            seconds = time.monotonic() - began
        finally:
            second.stop()
    finally:
        await writer.stop()
    # Every member ran 3.6 at once before any ran 3.7: the steps did not overlap.
    assert any(s.get("currentVersion") == OLD for s in seen), "the cluster never ran etcd 3.6 as a whole"
    assert set(pod_versions(kubectl, name).values()) == {NEW}
    assert all(len(s.get("members") or []) <= 4 for s in seen)
    # Quorum was never lost (a member slow to answer under load may look unhealthy for a moment).
    assert not any(s.get("phase") in ("QuorumLost", "Failed") for s in seen)
    assert_consistent(kubectl, name, 3, status)
    lost = await writer.missing(status["members"][0]["clientUrl"])
    assert lost == [] and len(writer.acknowledged) > 20
    said = events(kubectl, name)
    for reason in ("VersionPathStarted", "VersionStepStarted", "Upgraded"):
        assert reason in said, said
    print(
        f"{name}: {OLDEST} -> {NEW} through {OLD} in {seconds:.1f} s (operator restarted mid-step), "
        f"{len(writer.acknowledged)} writes acknowledged, {len(lost)} lost, "
        f"longest write outage {writer.longest_outage():.2f} s"
    )


@pytest.mark.timeout(900)
async def test_37_to_35_in_one_change_rolls_back_one_minor_at_a_time_through_etcds_downgrade(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    operator = start_operator_again(kubectl, tmp_path / "operator")
    try:
        await rolled_back_from_37_to_35(kubectl)
    finally:
        operator.stop()


async def rolled_back_from_37_to_35(kubectl: Kubectl) -> None:
    name = "chain-down"
    kubectl.apply(etcd_cluster(name, 3, version=NEW, storage={"type": "pvc"}))
    status = await wait_healthy(kubectl, name, 3)
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"]
                   for p in kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]}  # fmt: skip
    writer = Writer([m["clientUrl"] for m in status["members"]])
    writer.start()
    seen: list[dict[str, Any]] = []
    try:
        began = time.monotonic()
        kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{OLDEST}"}}}}')
        status = await walk(kubectl, name, writer, OLDEST, seen)
        seconds = time.monotonic() - began
    finally:
        await writer.stop()
    assert any(s.get("currentVersion") == OLD for s in seen), "the cluster never ran etcd 3.6 as a whole"
    # In place, as every rollback: the same pods, each restarted once per step.
    pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} == pods_before
    assert set(pod_versions(kubectl, name).values()) == {OLDEST}
    assert_consistent(kubectl, name, 3, status)
    lost = await writer.missing(status["members"][0]["clientUrl"])
    assert lost == []
    said = events(kubectl, name)
    assert said.count("DowngradeEnabled") >= 1 and "VersionStepStarted" in said and "Downgraded" in said
    print(
        f"{name}: {NEW} -> {OLDEST} through {OLD} in {seconds:.1f} s, {len(writer.acknowledged)} writes "
        f"acknowledged, {len(lost)} lost, longest write outage {writer.longest_outage():.2f} s"
    )


async def test_a_path_through_a_minor_kustos_proves_no_patch_of_is_refused_naming_spec_version(
    kubectl: Kubectl, operator: OperatorProcess
) -> None:
    name = "chain-refused"
    kubectl.apply(etcd_cluster(name, 1, version=NEW))
    await wait_healthy(kubectl, name, 1)
    major, minor, _ = NEW.split(".")
    skipped = f"{major}.{int(minor) + 2}.0"  # through the next minor, which no test proves
    with pytest.raises(DevClusterError) as refusal:
        kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{skipped}"}}}}')
    message = str(refusal.value)
    # The CRD's CEL rule answers first (the API server checks the schema before admission).
    assert "spec.version" in message and "newest patch kustos proves" in message, message
    assert kubectl.get("etcdcluster", name)["spec"]["version"] == NEW
    status = await wait_healthy(kubectl, name, 1)
    assert status["currentVersion"] == NEW and "versionPath" not in status
    assert condition(status, "VersionAccepted").get("status") == "True"


@pytest.mark.timeout(600)
async def test_a_step_whose_image_cannot_be_pulled_halts_the_chain_and_the_cluster_keeps_serving(
    crds: None, kubectl: Kubectl, tmp_path: Path
) -> None:
    """3.5 -> 3.7 where the middle version's image is not there: the user's mirror (a pod image
    override, the product's own) lacks etcd 3.6. The first member rolled onto 3.6 never comes
    back; the chain stops at that step with a condition that says so and how to go on, and the two
    members still on 3.5 keep quorum and every acknowledged write."""
    name = "chain-halt"
    middle = etcd_image(DEFAULT_ETCD_REPOSITORY, OLD)
    missing = f"mirror.invalid/etcd:v{OLD}"
    operator = start_operator_again(kubectl, tmp_path / "operator")
    kubectl.cluster.kubectl(
        "apply", "-f", "-", input_text=yaml.safe_dump(policy(podImageOverrides=[f"{middle}={missing}"]))
    )
    try:

        async def overriding() -> bool:
            found = kubectl.cluster.kubectl(
                "get", "mutatingwebhookconfiguration", "-o", "jsonpath={..webhooks[*].name}"
            )
            return "overrides.pod.kustos.dev" in found

        await wait_until(overriding, "the pod image override webhook", timeout=60)
        kubectl.apply(etcd_cluster(name, 3, version=OLDEST, storage={"type": "pvc"}))
        status = await wait_healthy(kubectl, name, 3)
        writer = Writer([m["clientUrl"] for m in status["members"]])
        writer.start()
        seen: list[dict[str, Any]] = []
        try:
            kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"version":"{NEW}"}}}}')

            async def halted() -> dict[str, Any] | None:
                current = status_of(kubectl, name)
                writer.update(current)
                seen.append(current)
                return current if condition(current, "Degraded").get("reason") == "UpgradeHalted" else None

            status = await wait_until(halted, "the chain halted", timeout=240, interval=0.5,
                                      cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
            written_at_halt = len(writer.acknowledged)
            await asyncio.sleep(5)  # still serving, on the members that kept 3.5
            assert len(writer.acknowledged) > written_at_halt
        finally:
            await writer.stop()
        message = condition(status, "Degraded")["message"]
        assert OLD in message and "spec.version" in message, message
        assert status["versionPath"]["step"] == OLD
        # The member that stopped the chain is the one the mirror could not serve: no etcd came
        # back in its pod (the dev cluster's node leaves a pod of an image it cannot run empty).
        pods = kubectl.get("pods", "-l", f"kustos.dev/cluster={name}")["items"]
        stopped = [p["metadata"]["name"] for p in pods if p["spec"]["containers"][0]["image"] == missing]
        assert len(stopped) == 1 and stopped[0] in message, (stopped, message)
        assert [m["name"] for m in status["members"] if not m["healthy"]] == stopped, status["members"]
        assert [v for v in pod_versions(kubectl, name).values() if v == OLDEST], "no member kept 3.5"
        assert not any(s.get("phase") == "QuorumLost" for s in seen)
        lost = await writer.missing(next(m["clientUrl"] for m in status["members"] if m["healthy"]))
        assert lost == [] and len(writer.acknowledged) > 10
        print(f"\n{name}: halted at step {OLD} with: {message}; {len(writer.acknowledged)} writes, 0 lost")
    finally:
        operator.stop()
        kubectl.cluster.kubectl("delete", "maintenancepolicy", "default", "--ignore-not-found")
