"""The proof suite (issue 25): recorded histories under failures, checked for linearizability.

Each scenario loads a real etcd cluster with the recorder's clients and watchers, injects one
failure mid-run, and checks the history: linearizable (porcupine), watch guarantees kept, no
acknowledged write lost. Every scenario adds a row to the report (printed at the end of the
module, and written to $KUSTOS_PROOF_REPORT when set: `make proof`).

$KUSTOS_PROOF_PROFILE picks the load: ``short`` (the default, what `make test` runs) or
``full`` (`make proof`'s documented run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import binaries
from kustos.devcluster.s3 import S3Server
from kustos.etcd.client import EtcdClient
from kustos.proof.catalogue import action, coverage_table
from kustos.proof.check import Verdict, acknowledged_writes_missing, check_history, report_table, state_at
from kustos.proof.history import load_history
from kustos.proof.recorder import Recording, Workload, record
from kustos.proof.soak import Sample, sample_of, soak_summary, what_grew
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    assert_consistent,
    build_missing_etcd_binaries,
    endpoint_status,
    etcd_cluster,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_backup import s3, s3_secret, s3_storage  # noqa: F401  (fixture)
from tests.integration.test_etcd_client import Launcher
from tests.integration.test_etcd_maintenance import fill_and_free
from tests.integration.test_etcd_recovery import kill_members, take_backup, wait_recovered
from tests.integration.test_etcd_upgrade import NEW, OLD, OLDEST
from tests.integration.test_partition import STAY, node_of

pytestmark = pytest.mark.process_runner(
    "histories under injected failures, many scenarios; the runner starts a member in 0.8 s"
)


@dataclass(frozen=True)
class Profile:
    clients: int
    watchers: int
    rate: float
    duration: float
    checker_timeout: float
    soak: float  # seconds of scenarios in a loop (the soak's length)
    sample_every: float  # seconds between samples of the operator's metrics in the soak


PROFILES = {
    "short": Profile(
        clients=4, watchers=2, rate=150, duration=15, checker_timeout=60, soak=60, sample_every=5
    ),
    "full": Profile(
        clients=8, watchers=3, rate=300, duration=60, checker_timeout=600, soak=600, sample_every=10
    ),
    "nightly": Profile(
        clients=8, watchers=3, rate=300, duration=60, checker_timeout=600, soak=3600, sample_every=20
    ),
}


def profile_name() -> str:
    name = os.environ.get("KUSTOS_PROOF_PROFILE", "short")
    if name not in PROFILES:
        raise ValueError(f"KUSTOS_PROOF_PROFILE: {name!r} is not one of {', '.join(PROFILES)}")
    return name


def profile() -> Profile:
    """The chosen profile; $KUSTOS_PROOF_SOAK (seconds) overrides its soak's length."""
    chosen = PROFILES[profile_name()]
    soak = os.environ.get("KUSTOS_PROOF_SOAK")
    if soak is None:
        return chosen
    try:
        seconds = float(soak)
    except ValueError:
        raise ValueError(f"KUSTOS_PROOF_SOAK: {soak!r} is not a number of seconds") from None
    return replace(chosen, soak=seconds)


# The full profile's scenarios (`make proof`): too long for `make test`, whose short profile
# leaves them out at collection (conftest: deselected, never skipped).
full_profile_only = pytest.mark.proof_full


@pytest.fixture(scope="module")
def checker() -> Path:
    """The linearizability checker `kustos dev build` makes (built here when missing)."""
    return binaries.ensure_built(binaries.linearizability_checker())


@pytest.fixture
def histories(tmp_path: Path) -> Path:
    """Where histories (and porcupine's pictures of failures) go: $KUSTOS_PROOF_DIR to keep them."""
    kept = os.environ.get("KUSTOS_PROOF_DIR")
    return Path(kept) if kept else tmp_path


@dataclass
class Report:
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        parts = [report_table(self.verdicts), "", "Operator actions:", "", coverage_table(self.verdicts)]
        return "\n".join(parts + (["", *self.notes] if self.notes else []))


@pytest.fixture(scope="module")
def report() -> Iterator[Report]:
    """Every scenario's verdict; the report is printed (and written) once the module ends."""
    kept = Report()
    yield kept
    if not kept.verdicts:
        return
    text = kept.text()
    print(f"\n\nproof report (profile {profile_name()}):\n{text}\n")
    target = os.environ.get("KUSTOS_PROOF_REPORT")
    if target:
        Path(target).write_text(text + "\n")


def workload(endpoints: Iterable[str], key: str) -> Workload:
    load = profile()
    return Workload(
        tuple(endpoints),
        clients=load.clients,
        watchers=load.watchers,
        rate=load.rate,
        duration=load.duration,
        scenario=action(key).title,
    )


def member_urls(status: dict[str, Any]) -> list[str]:
    return [m["clientUrl"] for m in status.get("members") or [] if m.get("clientUrl")]


async def run_scenario(
    workload: Workload, history: Path, failure: str, inject: asyncio.Task[None] | None = None
) -> Recording:
    """Record while ``inject`` does its harm; the injection's own errors fail the test."""
    try:
        recording = await record(workload, history)
    finally:
        if inject is not None:
            if not inject.done():
                inject.cancel()
            await asyncio.gather(inject, return_exceptions=True)
    if inject is not None and not inject.cancelled() and inject.exception() is not None:
        raise AssertionError(f"injecting {failure} failed") from inject.exception()
    return recording


def felt(recording: Recording) -> bool:
    """The failure happened while the recording ran: some call or watch met it."""
    return recording.failed + recording.indeterminate + recording.watch_resumes > 0


def assert_proven(verdict: Verdict, recording: Recording) -> None:
    assert verdict.linearizability.result == "Ok", (
        f"not linearizable: see {verdict.linearizability.visualization or recording.path}"
    )
    assert verdict.watch_problems == [], verdict.watch_problems[:20]
    assert verdict.writes_lost == 0
    assert recording.watch_events > 0


async def proven(
    workload: Workload,
    history: Path,
    failure: str,
    checker: Path,
    report: Report,
    inject: Coroutine[Any, Any, None] | None = None,
) -> Recording:
    """Record one scenario while ``inject`` runs, check it, add its row, and fail unless proven."""
    task = asyncio.create_task(inject) if inject is not None else None
    recording = await run_scenario(workload, history, failure, task)
    verdict = check_history(
        history, checker, failure, profile().checker_timeout, history.with_suffix(".html")
    )
    report.verdicts.append(verdict)
    assert_proven(verdict, recording)
    return recording


async def test_a_member_killed_under_load_leaves_a_linearizable_history(
    tmp_path: Path, histories: Path, checker: Path, report: Report
) -> None:
    """etcd processes on loopback, one SIGKILLed mid-run: the recorder's own proof, no operator."""
    build_missing_etcd_binaries()
    launcher = Launcher(tmp_path, binaries.ETCD_VERSIONS[-1])
    members = launcher.cluster(3)

    async def kill_one() -> None:
        await asyncio.sleep(profile().duration / 3)
        members[1].stop()

    try:
        load = workload((m.client_url for m in members), "etcd-killed")
        recording = await proven(
            load, histories / "killed.jsonl", "1 member SIGKILLed", checker, report, kill_one()
        )
    finally:
        launcher.stop_all()
    assert felt(recording), "the kill was never felt"


async def test_create_and_resize_under_load_leave_linearizable_histories(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """Three histories on one EtcdCluster: recorded on its seed while the other two members join,
    then while it grows to 5, then while it shrinks back to 3."""
    kubectl.apply(etcd_cluster("grow", 3))

    async def seeded() -> list[str] | None:
        return member_urls(status_of(kubectl, "grow"))[:1] or None

    seed = await wait_until(
        seeded,
        "the seed member's client URL",
        timeout=90,
        cluster=kubectl.cluster,
        namespace=kubectl.namespace,
    )

    # The operator adds and promotes the other two while the clients load the seed.
    await proven(workload(seed, "create"), histories / "create.jsonl", "2 members join", checker, report)
    status = await wait_healthy(kubectl, "grow", 3)

    async def resize(size: int) -> None:
        await asyncio.sleep(profile().duration / 5)
        patch = f'{{"spec":{{"size":{size}}}}}'
        await asyncio.to_thread(kubectl, "patch", "etcdcluster", "grow", "--type=merge", "-p", patch)

    await proven(
        workload(member_urls(status), "scale-up"),
        histories / "scale-up.jsonl",
        "size 3 -> 5",
        checker,
        report,
        resize(5),
    )
    status = await wait_healthy(kubectl, "grow", 5)
    await proven(
        workload(member_urls(status), "scale-down"),
        histories / "scale-down.jsonl",
        "size 5 -> 3",
        checker,
        report,
        resize(3),
    )
    status = await wait_healthy(kubectl, "grow", 3)
    assert_consistent(kubectl, "grow", 3, status)


async def test_a_member_pod_deleted_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """A 3-member EtcdCluster made by kustos; one member pod deleted mid-run and replaced by the
    operator while the clients keep going: the history stays linearizable, nothing acknowledged
    is lost."""
    kubectl.apply(etcd_cluster("proof", 3))
    status = await wait_healthy(kubectl, "proof", 3)

    async def delete_a_pod() -> None:
        await asyncio.sleep(profile().duration / 3)
        await asyncio.to_thread(kubectl, "delete", "pod", "proof-1", "--wait=false")

    load = workload(member_urls(status), "pod-deleted")
    recording = await proven(
        load, histories / "pod-deleted.jsonl", "1 member pod deleted", checker, report, delete_a_pod()
    )
    assert felt(recording), "the deletion was never felt"
    await replaced(kubectl, "proof", "proof-1")


async def replaced(kubectl: Kubectl, cluster: str, member: str) -> None:
    async def gone() -> bool:
        names = {m["name"] for m in status_of(kubectl, cluster).get("members") or []}
        return member not in names and len(names) == 3

    await wait_until(
        gone, f"{member} replaced", timeout=90, cluster=kubectl.cluster, namespace=kubectl.namespace
    )


async def test_a_member_container_killed_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """One member's etcd process SIGKILLed in its pod: the kubelet restarts it in place (the
    failure timeout is longer than its restart), and the same three members serve on."""
    kubectl.apply(etcd_cluster("crash", 3, memberFailureTimeout="120s"))
    status = await wait_healthy(kubectl, "crash", 3)
    members = sorted(m["name"] for m in status["members"])

    async def kill_the_container() -> None:
        await asyncio.sleep(profile().duration / 3)
        kubectl.cluster.crash_container(kubectl.namespace, "crash-1", "etcd", stay_down=False)

    load = workload(member_urls(status), "container-killed")
    recording = await proven(
        load,
        histories / "container-killed.jsonl",
        "1 etcd container SIGKILLed",
        checker,
        report,
        kill_the_container(),
    )
    assert felt(recording), "the kill was never felt"
    status = await wait_healthy(kubectl, "crash", 3)
    assert sorted(m["name"] for m in status["members"]) == members


async def test_the_operator_killed_mid_step_under_load_leaves_a_linearizable_history(
    crds: None, kubectl: Kubectl, tmp_path: Path, histories: Path, checker: Path, report: Report
) -> None:
    """The operator exits right after adding a member (the runtime's fault hook) while the
    cluster grows 3 -> 5 under load; the next operator finishes the resize."""
    with running_operator(kubectl, tmp_path / "first"):
        kubectl.apply(etcd_cluster("op", 3))
        status = await wait_healthy(kubectl, "op", 3)
    fault = {"KUSTOS_FAULT_EXIT_AFTER": "AddMember", "KUSTOS_FAULT_MARKER": str(tmp_path / "fault")}
    with contextlib.ExitStack() as operators:
        faulty = operators.enter_context(running_operator(kubectl, tmp_path / "faulty", env=fault))

        async def kill_mid_step() -> None:
            await asyncio.sleep(profile().duration / 5)
            patch = '{"spec":{"size":5}}'
            await asyncio.to_thread(kubectl, "patch", "etcdcluster", "op", "--type=merge", "-p", patch)

            async def exited() -> bool:
                return not faulty.alive()

            await wait_until(exited, "the operator to exit after AddMember", timeout=60)
            # Started in a thread: it waits for /healthz, and the recorder must not stall meanwhile.
            await asyncio.to_thread(operators.enter_context, running_operator(kubectl, tmp_path / "next"))

        load = workload(member_urls(status), "operator-killed")
        await proven(
            load,
            histories / "operator-killed.jsonl",
            "operator killed after AddMember",
            checker,
            report,
            kill_mid_step(),
        )
        assert faulty.process.returncode == 137 and (tmp_path / "fault").exists()
        status = await wait_healthy(kubectl, "op", 5)
        assert_consistent(kubectl, "op", 5, status)


async def test_a_soak_keeps_histories_linearizable_and_the_operator_flat(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """Member pods deleted one after another under load for the profile's soak (each history
    checked) while the operator's RSS, open fds, asyncio tasks and reconcile time are sampled
    from its /metrics: flat, or the test names what grew."""
    load = profile()
    kubectl.apply(etcd_cluster("soak", 3))
    status = await wait_healthy(kubectl, "soak", 3)
    samples: list[Sample] = []
    began = time.monotonic()

    async def sample() -> None:
        while True:
            metrics = await asyncio.to_thread(operator.metrics)
            samples.append(sample_of(time.monotonic() - began, metrics))
            await asyncio.sleep(load.sample_every)

    async def delete(pod: str) -> None:
        await asyncio.sleep(load.duration / 3)
        await asyncio.to_thread(kubectl, "delete", "pod", pod, "--wait=false")

    sampler: asyncio.Task[None] | None = None
    rounds = 0
    try:
        while rounds < 2 or time.monotonic() - began < load.soak:
            victim = status["members"][rounds % 3]["name"]
            history = histories / f"soak-{rounds}.jsonl"
            await proven(
                workload(member_urls(status), "soak"),
                history,
                f"pod {victim} deleted",
                checker,
                report,
                delete(victim),
            )
            await replaced(kubectl, "soak", victim)
            status = await wait_healthy(kubectl, "soak", 3)
            rounds += 1
            if sampler is None:  # the first round warms the operator up (imports, caches, pools)
                began = time.monotonic()
                sampler = asyncio.create_task(sample())
    finally:
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    assert operator.alive(), operator.log()[-3000:]
    summary = soak_summary(samples)
    report.notes.append(f"Soak ({rounds} rounds of a member pod deleted under load): {summary}.")
    grown = what_grew(samples)
    assert grown == [], f"the operator grew during the soak: {'; '.join(grown)} ({summary})"


def leader_of(status: dict[str, Any]) -> str:
    return str(next(m["name"] for m in status["members"] if m["leader"]))


async def prefix_state(endpoint: str, prefix: str) -> dict[str, str]:
    """The recorder's keys as one member answers them now (a linearizable read)."""
    async with EtcdClient(endpoint, timeout=10.0) as client:
        found = await client.range(prefix, prefix=True)
    return {kv.key.decode(): kv.value.decode() for kv in found.kvs}


@full_profile_only
async def test_defragmentation_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """Every member's database mostly free space, then defragmentation turned on while the
    clients load the cluster: each member in turn stops answering while it rewrites its file."""
    defragmentation = {"enabled": False, "threshold": 0.5, "minDbSize": "4Mi", "checkInterval": "1s"}
    kubectl.apply(etcd_cluster("defrag", 3, maintenance={"defragmentation": defragmentation}))
    status = await wait_healthy(kubectl, "defrag", 3)
    await fill_and_free(status["members"][0]["clientUrl"])

    def records() -> list[dict[str, Any]]:
        done = (status_of(kubectl, "defrag").get("maintenance") or {}).get("defragmentations") or []
        return [r for r in done if r.get("completedAt")]

    async def turn_it_on() -> None:
        await asyncio.sleep(profile().duration / 5)
        patch = '{"spec":{"maintenance":{"defragmentation":{"enabled":true}}}}'
        await asyncio.to_thread(kubectl, "patch", "etcdcluster", "defrag", "--type=merge", "-p", patch)

    load = workload(member_urls(status), "defragmentation")
    await proven(
        load, histories / "defragmentation.jsonl", "3 members defragmented", checker, report, turn_it_on()
    )

    async def all_three() -> list[dict[str, Any]] | None:
        done = await asyncio.to_thread(records)
        return done if len(done) >= 3 else None

    done = await wait_until(all_three, "three defragmentations", timeout=60,
                            cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert all(r.get("error") is None and r["dbSizeAfter"] < r["dbSizeBefore"] for r in done), done
    # The load ran through them: every defragmentation ended before the recording did.
    assert sorted(r["member"] for r in done) == sorted(m["name"] for m in status["members"])


@full_profile_only
async def test_a_member_node_stopped_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """A member's node stops (heartbeat gone, its processes killed): the operator replaces the
    member on another node while the clients keep going."""
    kubectl.apply(etcd_cluster("stop", 3, pod={"antiAffinity": "required"}))
    status = await wait_healthy(kubectl, "stop", 3)
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    node = node_of(kubectl, victim)

    async def stop_the_node() -> None:
        await asyncio.sleep(profile().duration / 3)
        await asyncio.to_thread(kubectl.cluster.take_node_down, node)

    try:
        load = workload(member_urls(status), "node-stopped")
        recording = await proven(
            load, histories / "node-stopped.jsonl", f"node of {victim} stopped", checker, report,
            stop_the_node(),
        )  # fmt: skip
        assert felt(recording), "the stop was never felt"
        await replaced(kubectl, "stop", victim)
        status = await wait_healthy(kubectl, "stop", 3)
        assert node not in {node_of(kubectl, m["name"]) for m in status["members"]}
    finally:
        kubectl.cluster.bring_node_up(node)
    assert_consistent(kubectl, "stop", 3, status)


async def partition_for_a_while(kubectl: Kubectl, node: str, until: Any = None) -> None:
    """Cut ``node`` off a quarter into the load, heal it at three quarters (after ``until``
    holds, when given)."""
    await asyncio.sleep(profile().duration / 4)
    await asyncio.to_thread(kubectl.cluster.partition_node, node)
    try:
        await asyncio.sleep(profile().duration / 2)
        if until is not None:
            await until()
    finally:
        await asyncio.to_thread(kubectl.cluster.heal_node, node)


async def spread_over_three_nodes(kubectl: Kubectl, name: str) -> dict[str, Any]:
    """Three members, one per node, that outlast a partition (a failure timeout longer than it)."""
    kubectl.apply(etcd_cluster(name, 3, memberFailureTimeout="300s",
                               pod={"antiAffinity": "required", "tolerations": STAY}))  # fmt: skip
    return await wait_healthy(kubectl, name, 3)


async def assert_the_same_members_rejoined(
    kubectl: Kubectl, name: str, before: dict[str, Any], recording: Recording
) -> None:
    """The partition was felt, and once healed the same members serve: nothing replaced."""
    assert felt(recording), "the partition was never felt"
    healed = await wait_healthy(kubectl, name, 3, timeout=120)
    assert sorted(m["name"] for m in healed["members"]) == sorted(m["name"] for m in before["members"])
    assert_consistent(kubectl, name, 3, healed)


@full_profile_only
async def test_a_member_node_partitioned_and_healed_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """A follower's node cut off for half the load (shorter than the failure timeout), then
    healed: the same member rejoins, nothing is replaced."""
    status = await spread_over_three_nodes(kubectl, "part")
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    load = workload(member_urls(status), "node-partitioned")
    recording = await proven(
        load, histories / "node-partitioned.jsonl", f"node of {victim} partitioned, healed", checker,
        report, partition_for_a_while(kubectl, node_of(kubectl, victim)),
    )  # fmt: skip
    await assert_the_same_members_rejoined(kubectl, "part", status, recording)


@full_profile_only
async def test_the_leaders_node_partitioned_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """The etcd leader's node cut off: the other two elect a leader and serve on; the old
    leader, healed, rejoins as a follower."""
    status = await spread_over_three_nodes(kubectl, "lead")
    leader = next(m for m in status["members"] if m["leader"])
    others = [m for m in status["members"] if not m["leader"]]

    async def new_leader() -> None:
        async def elected() -> bool:
            views = await asyncio.to_thread(endpoint_status, {"members": others})
            leaders = {v["Status"]["leader"] for v in views}
            return len(leaders) == 1 and int(leader["id"], 16) not in leaders

        await wait_until(elected, "a new leader among the connected members", timeout=60)

    load = workload(member_urls(status), "leader-partitioned")
    recording = await proven(
        load, histories / "leader-partitioned.jsonl", f"leader {leader['name']}'s node partitioned, healed",
        checker, report, partition_for_a_while(kubectl, node_of(kubectl, leader["name"]), new_leader),
    )  # fmt: skip
    await assert_the_same_members_rejoined(kubectl, "lead", status, recording)


@full_profile_only
async def test_a_backup_under_load_restored_elsewhere_holds_every_write_acknowledged_before_it(
    kubectl: Kubectl,
    operator: OperatorProcess,
    s3: S3Server,  # noqa: F811
    histories: Path,
    checker: Path,
    report: Report,
) -> None:
    """An EtcdBackup to S3 taken mid-load, restored into a new cluster: it holds exactly the
    recorded keys as they were at the snapshot's revision (replayed from the watches), and that
    revision is at least one read before the backup was asked for, so every write acknowledged
    before it is in it."""
    s3_secret(kubectl, s3)
    kubectl.apply(etcd_cluster("bk", 3))
    status = await wait_healthy(kubectl, "bk", 3)
    taken: list[tuple[int, dict[str, Any]]] = []

    async def back_up() -> None:
        await asyncio.sleep(profile().duration / 3)
        async with EtcdClient(member_urls(status)[0], timeout=10.0) as client:
            asked_at = (await client.range("/proof-backup-mark")).revision  # linearizable
        backup = await take_backup(kubectl, "bk-mid", "bk", storage=s3_storage(s3))
        taken.append((asked_at, backup))

    history = histories / "backup.jsonl"
    load = workload(member_urls(status), "backup")
    await proven(load, history, "EtcdBackup to S3 mid-run", checker, report, back_up())
    assert taken, "the backup did not finish while the load ran"
    asked_at, backup = taken[0]
    assert backup["revision"] >= asked_at, f"snapshot at {backup['revision']}, asked for at {asked_at}"

    kubectl.apply(etcd_cluster("bk-copy", 1, restore={"backup": "bk-mid"}))
    copy = await wait_healthy(kubectl, "bk-copy", 1, timeout=180)
    restored = await prefix_state(copy["members"][0]["clientUrl"], load.prefix)
    assert restored == state_at(load_history(history), backup["revision"])


@full_profile_only
async def test_quorum_loss_waits_for_approval_and_the_approved_rebuild_keeps_every_acknowledged_write(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """Both followers killed under load (kept down): the leader alone cannot commit, and without
    automatic recovery the operator destroys nothing and says it waits for `kustos etcd
    recover`. Approved, it rebuilds from the surviving leader (which holds every committed
    write): a second history on the rebuilt cluster starts from every write the first one
    acknowledged."""
    kubectl.apply(etcd_cluster("ql", 3))
    status = await wait_healthy(kubectl, "ql", 3)
    survivor = leader_of(status)
    followers = [m["name"] for m in status["members"] if m["name"] != survivor]
    pods_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.get("pods")["items"]}

    async def lose_quorum() -> None:
        await asyncio.sleep(profile().duration / 3)
        await asyncio.to_thread(kill_members, kubectl, followers, False)

    lost = histories / "quorum-lost.jsonl"
    recording = await proven(
        workload(member_urls(status), "quorum-rebuild-unapproved"), lost,
        "2 of 3 members killed, no approval", checker, report, lose_quorum(),
    )  # fmt: skip
    assert felt(recording), "the quorum loss was never felt"

    async def waiting_for_approval() -> dict[str, Any] | None:
        current = status_of(kubectl, "ql")
        degraded = next((c for c in current.get("conditions") or [] if c["type"] == "Degraded"), {})
        asks = "kustos etcd recover ql" in degraded.get("message", "")
        return degraded if current.get("phase") == "QuorumLost" and asks else None

    degraded = await wait_until(waiting_for_approval, "QuorumLost asking for approval", timeout=60,
                                cluster=kubectl.cluster, namespace=kubectl.namespace)  # fmt: skip
    assert f"member {survivor}" in degraded["message"], degraded
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in kubectl.get("pods")["items"]} == pods_before
    assert "recovery" not in status_of(kubectl, "ql"), "rebuilt without approval"

    approve = [sys.executable, "-m", "kustos.cli", "etcd", "recover", "ql", "-n", kubectl.namespace,
               "--kubeconfig", str(kubectl.cluster.kubeconfig)]  # fmt: skip
    approved = subprocess.run(approve, capture_output=True, text=True, check=False)
    assert approved.returncode == 0, approved.stderr
    status = await wait_recovered(kubectl, "ql", 3)
    assert status["recovery"]["source"] == survivor, status["recovery"]

    rebuilt = histories / "quorum-rebuilt.jsonl"
    await proven(
        workload(member_urls(status), "quorum-rebuild"), rebuilt, "rebuilt from the leader, approved",
        checker, report,
    )  # fmt: skip
    after = {key: read.value for key, read in load_history(rebuilt).header.initial.items()}
    assert acknowledged_writes_missing(load_history(lost), after) == []


ROLL_LOAD = 90.0  # seconds of load at least around a one-minor change: a whole roll fits in it


async def version_changed_under_load(
    kubectl: Kubectl, name: str, start: str, to: str, key: str, load_seconds: float,
    histories: Path, checker: Path, report: Report,
) -> dict[str, Any]:  # fmt: skip
    """spec.version changed a sixth into a history at least ``load_seconds`` long, whose
    clients follow etcd's member list (a roll may replace every address they started with);
    the whole roll must end inside it. The cluster's status after."""
    status = status_of(kubectl, name)
    seconds: list[float] = []

    async def change_version() -> None:
        await asyncio.sleep(profile().duration / 6)
        patch = f'{{"spec":{{"version":"{to}"}}}}'
        await asyncio.to_thread(kubectl, "patch", "etcdcluster", name, "--type=merge", "-p", patch)
        began = time.monotonic()

        async def rolled() -> bool:
            current = await asyncio.to_thread(status_of, kubectl, name)
            members = current.get("members") or []
            return (
                current.get("currentVersion") == to and current.get("phase") == "Running"
                and len(members) == 3 and all(m["healthy"] and m.get("version") == to for m in members)
            )  # fmt: skip

        await wait_until(rolled, f"{name} on etcd {to}", timeout=load_seconds * 2)
        seconds.append(time.monotonic() - began)

    load = profile()
    duration = max(load.duration, load_seconds)
    roll_load = replace(
        workload(member_urls(status), key),
        duration=duration,
        max_operations=int(load.rate * duration * 1.5),
        follow_members=True,
    )
    recording = await proven(
        roll_load, histories / f"{name}-to-{to}.jsonl", f"etcd {start} -> {to}", checker, report,
        change_version(),
    )  # fmt: skip
    assert seconds, f"the roll to {to} did not finish within the {duration:.0f} s of load"
    assert felt(recording), "the roll was never felt"
    status = await wait_healthy(kubectl, name, 3)
    assert {m["version"] for m in status["members"]} == {to}
    report.notes.append(f"etcd {start} -> {to} rolled in {seconds[0]:.1f} s under load.")
    return status


@full_profile_only
async def test_an_upgrade_then_a_rollback_under_load_leave_linearizable_histories(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """A 3-member cluster upgraded to the next minor (each member replaced by one of the new
    version, followers first) and then rolled back through etcd's downgrade (in place), each
    change whole inside one history."""
    kubectl.apply(etcd_cluster("roll", 3, version=OLD))
    await wait_healthy(kubectl, "roll", 3)
    for start, to in ((OLD, NEW), (NEW, OLD)):
        status = await version_changed_under_load(
            kubectl, "roll", start, to, "upgrade-rollback", ROLL_LOAD, histories, checker, report
        )
    assert_consistent(kubectl, "roll", 3, status)


@full_profile_only
async def test_a_chained_upgrade_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """3.5 -> 3.7 in one change: kustos walks it through 3.6, one minor (one roll) at a time,
    inside one history."""
    kubectl.apply(etcd_cluster("chain", 3, version=OLDEST))
    await wait_healthy(kubectl, "chain", 3)
    status = await version_changed_under_load(
        kubectl, "chain", OLDEST, NEW, "chained-upgrade", 2 * ROLL_LOAD, histories, checker, report
    )
    assert_consistent(kubectl, "chain", 3, status)
