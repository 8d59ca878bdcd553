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
from kustos.etcd.client import EtcdClient, EtcdTLS
from kustos.maintenance.planner import OUT_OF_SERVICE_TAINT
from kustos.proof.catalogue import PROCESS_RUNNER_ACTIONS, Action, action, coverage_table
from kustos.proof.check import Verdict, acknowledged_writes_missing, check_history, report_table, state_at
from kustos.proof.history import History, load_history
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
from tests.integration.test_etcd_ca_rotation import secret_data
from tests.integration.test_etcd_client import Launcher
from tests.integration.test_etcd_maintenance import fill_and_free
from tests.integration.test_etcd_recovery import kill_members, take_backup, wait_recovered
from tests.integration.test_etcd_upgrade import NEW, OLD, OLDEST
from tests.integration.test_maintenance import (  # noqa: F401  (fixture: the default MaintenancePolicy)
    fence,
    last_message,
    maintenance,
    restored,
    taint_keys,
)
from tests.integration.test_partition import STAY, node_of
from tests.mount_support import write_mounted

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
    actions: tuple[Action, ...] = PROCESS_RUNNER_ACTIONS
    """The catalogue's entries this module's coverage table lists."""

    def text(self) -> str:
        parts = [report_table(self.verdicts), "", "Operator actions:", "",
                 coverage_table(self.verdicts, self.actions)]  # fmt: skip
        return "\n".join(parts + (["", *self.notes] if self.notes else []))


@pytest.fixture(scope="module")
def report() -> Iterator[Report]:
    """Every scenario's verdict; the report is printed (and written) once the module ends."""
    yield from module_report("proof report")


def module_report(
    title: str, section: str | None = None, actions: tuple[Action, ...] = PROCESS_RUNNER_ACTIONS
) -> Iterator[Report]:
    """A proof module's report fixture body: the Report its scenarios fill, published once the
    module ends."""
    kept = Report(actions=actions)
    yield kept
    publish(kept, title, section)


def publish(report: Report, title: str, section: str | None = None) -> None:
    """Print a module's report and write it to $KUSTOS_PROOF_REPORT: test_proof.py's replaces
    the file (`make proof` runs it first), a later module's is appended under ``section``."""
    if not report.verdicts:
        return
    text = report.text()
    print(f"\n\n{title} (profile {profile_name()}):\n{text}\n")
    write_report(text, section)


def write_report(text: str, section: str | None = None) -> None:
    """Into $KUSTOS_PROOF_REPORT when set: the first module's ``text`` replaces the file, a later
    one's is appended under ``section``."""
    target = os.environ.get("KUSTOS_PROOF_REPORT")
    if target:
        with Path(target).open("a" if section else "w", encoding="utf-8") as out:
            out.write((f"\n{section}:\n\n" if section else "") + text + "\n")


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
    await member_pod_deleted(kubectl, "proof", status, histories, checker, report)


async def member_pod_deleted(
    kubectl: Kubectl, name: str, status: dict[str, Any], histories: Path, checker: Path, report: Report,
    key: str = "pod-deleted",
) -> str:  # fmt: skip
    """One member's pod deleted a third into the run, the member replaced by the operator
    within it (``key``: the catalogue's entry the history is recorded under). The member."""
    victim = str(sorted(m["name"] for m in status["members"])[1])

    async def delete_a_pod() -> None:
        await asyncio.sleep(profile().duration / 3)
        await asyncio.to_thread(kubectl, "delete", "pod", victim, "--wait=false")

    load = workload(member_urls(status), key)
    recording = await proven(
        load, histories / "pod-deleted.jsonl", "1 member pod deleted", checker, report, delete_a_pod()
    )
    assert felt(recording), "the deletion was never felt"
    await replaced(kubectl, name, victim)
    return victim


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
    await member_container_killed(kubectl, "crash", status, histories, checker, report)


async def member_container_killed(
    kubectl: Kubectl, name: str, status: dict[str, Any], histories: Path, checker: Path, report: Report,
    key: str = "container-killed",
) -> str:  # fmt: skip
    """One member's etcd SIGKILLed in its pod a third into the run, restarted in place: the
    same members serve on (the failure timeout must outlast a restart). The member."""
    members: list[str] = sorted(m["name"] for m in status["members"])
    victim = members[1]

    async def kill_the_container() -> None:
        await asyncio.sleep(profile().duration / 3)
        await asyncio.to_thread(
            kubectl.cluster.crash_container, kubectl.namespace, victim, "etcd", stay_down=False
        )

    load = workload(member_urls(status), key)
    recording = await proven(
        load,
        histories / "container-killed.jsonl",
        "1 etcd container SIGKILLed",
        checker,
        report,
        kill_the_container(),
    )
    assert felt(recording), "the kill was never felt"
    status = await wait_healthy(kubectl, name, 3)
    assert sorted(m["name"] for m in status["members"]) == members
    return victim


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


# The soak's own length and a round past it, on top of the suite's 300 s: the full profile's
# 600 s soak was cut short by the suite's timeout in stop 28's `make proof`.
@pytest.mark.timeout(300 + 2 * profile().soak)
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
    await member_node_stopped(kubectl, "stop", status, histories, checker, report)


async def member_node_stopped(
    kubectl: Kubectl, name: str, status: dict[str, Any], histories: Path, checker: Path, report: Report,
    key: str = "node-stopped",
) -> str:  # fmt: skip
    """A follower's node stops a third into the run; the member is replaced on another node
    (members one per node, a spare free). The node, up again after."""
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    node = node_of(kubectl, victim)

    async def stop_the_node() -> None:
        await asyncio.sleep(profile().duration / 3)
        await asyncio.to_thread(kubectl.cluster.take_node_down, node)

    try:
        load = workload(member_urls(status), key)
        recording = await proven(
            load, histories / "node-stopped.jsonl", f"node of {victim} stopped", checker, report,
            stop_the_node(),
        )  # fmt: skip
        assert felt(recording), "the stop was never felt"
        await replaced(kubectl, name, victim)
        status = await wait_healthy(kubectl, name, 3)
        assert node not in {node_of(kubectl, m["name"]) for m in status["members"]}
    finally:
        kubectl.cluster.bring_node_up(node)
    assert_consistent(kubectl, name, 3, status)
    return node


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


async def spread_over_three_nodes(
    kubectl: Kubectl, name: str, placement: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Three members, one per node, that outlast a partition (a failure timeout longer than it,
    their node's NoExecute taints tolerated); ``placement`` (``spec.pod``) says which nodes."""
    placement = placement or {}
    pod = {**placement, "antiAffinity": "required", "tolerations": [*placement.get("tolerations", []), *STAY]}
    kubectl.apply(etcd_cluster(name, 3, memberFailureTimeout="300s", pod=pod))
    return await wait_healthy(kubectl, name, 3, timeout=180)


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
    await follower_node_partitioned(kubectl, "part", status, histories, checker, report)


async def follower_node_partitioned(
    kubectl: Kubectl, name: str, status: dict[str, Any], histories: Path, checker: Path, report: Report,
    key: str = "node-partitioned",
) -> None:  # fmt: skip
    """A follower's node cut off for half the run, then healed (``spread_over_three_nodes``'s
    members outlast it): the same members serve on."""
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    load = workload(member_urls(status), key)
    recording = await proven(
        load, histories / "node-partitioned.jsonl", f"node of {victim} partitioned, healed", checker,
        report, partition_for_a_while(kubectl, node_of(kubectl, victim)),
    )  # fmt: skip
    await assert_the_same_members_rejoined(kubectl, name, status, recording)


@full_profile_only
async def test_the_leaders_node_partitioned_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: Report
) -> None:
    """The etcd leader's node cut off: the other two elect a leader and serve on; the old
    leader, healed, rejoins as a follower."""
    status = await spread_over_three_nodes(kubectl, "lead")
    await leader_node_partitioned(kubectl, "lead", status, histories, checker, report)


async def leader_node_partitioned(
    kubectl: Kubectl, name: str, status: dict[str, Any], histories: Path, checker: Path, report: Report,
    key: str = "leader-partitioned",
) -> None:  # fmt: skip
    """The leader's node cut off for half the run: the other two elect a leader within it;
    healed, the same members serve on."""
    leader = next(m for m in status["members"] if m["leader"])
    others = [m for m in status["members"] if not m["leader"]]

    async def new_leader() -> None:
        async def elected() -> bool:
            views = await asyncio.to_thread(endpoint_status, {"members": others})
            leaders = {v["Status"]["leader"] for v in views}
            return len(leaders) == 1 and int(leader["id"], 16) not in leaders

        await wait_until(elected, "a new leader among the connected members", timeout=60)

    load = workload(member_urls(status), key)
    recording = await proven(
        load, histories / "leader-partitioned.jsonl", f"leader {leader['name']}'s node partitioned, healed",
        checker, report, partition_for_a_while(kubectl, node_of(kubectl, leader["name"]), new_leader),
    )  # fmt: skip
    await assert_the_same_members_rejoined(kubectl, name, status, recording)


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


class MountedSecret:
    """A Secret as a pod sees it mounted: its keys as files that change together whenever the
    Secret does (``sync``, as the kubelet's periodic sync), for a client that re-reads them."""

    def __init__(self, kubectl: Kubectl, name: str, directory: Path) -> None:
        self.kubectl, self.name, self.directory = kubectl, name, directory
        self.data: dict[str, bytes] = {}
        self.versions = 0

    def sync(self) -> None:
        data = secret_data(self.kubectl, self.name)
        if data != self.data:
            self.versions += 1
            write_mounted(self.directory, str(self.versions), data)
            self.data = data

    @property
    def client_tls(self) -> EtcdTLS:
        return EtcdTLS(self.directory / "ca.crt", self.directory / "tls.crt", self.directory / "tls.key")


def writes_acknowledged_after(history: History, moment: float, recording: Recording) -> int:
    """Puts (plain, or a transaction's that succeeded) invoked after ``moment`` (time.monotonic())
    that etcd acknowledged."""
    after = (moment - recording.clock_zero) * 1e9
    wrote = (op for op in history.operations if op.kind == "put" or (op.kind == "txn" and op.succeeded))
    return sum(1 for op in wrote if op.outcome == "ok" and op.call > after)


CA_ROTATION_LOAD = 150.0  # seconds of load at least: three rolls of three members, and after


@full_profile_only
async def test_a_ca_rotation_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl,
    operator: OperatorProcess,
    tmp_path: Path,
    histories: Path,
    checker: Path,
    report: Report,
) -> None:
    """A TLS EtcdCluster's CA rotated (Trust, Reissue, Drop: each a roll of the three members)
    while the clients load it over TLS with the operator-issued client Secret, mounted as a pod
    would mount it: they take each new certificate from its files mid-run, and keep writing
    after the old CA is dropped (when the old certificate is refused)."""
    kubectl.apply(etcd_cluster("rot", 3, tls={}, storage={"type": "pvc", "size": "64Mi"},
                               memberFailureTimeout="60s"))  # fmt: skip
    status = await wait_healthy(kubectl, "rot", 3, timeout=180)
    old_ca = secret_data(kubectl, "rot-ca")["ca.crt"]
    secret = MountedSecret(kubectl, "rot-client-tls", tmp_path / "client-tls")
    secret.sync()
    completed: list[float] = []
    began: list[float] = []

    async def rotate_the_ca() -> None:
        await asyncio.sleep(profile().duration / 6)
        began.append(time.monotonic())
        rotate = [sys.executable, "-m", "kustos.cli", "etcd", "rotate-ca", "rot", "-n", kubectl.namespace,
                  "--kubeconfig", str(kubectl.cluster.kubeconfig)]  # fmt: skip
        asked = await asyncio.to_thread(subprocess.run, rotate, capture_output=True, text=True, check=False)
        assert asked.returncode == 0, asked.stderr

        async def rotated() -> bool:
            await asyncio.to_thread(secret.sync)
            current = await asyncio.to_thread(status_of, kubectl, "rot")
            rotation = (current.get("tls") or {}).get("caRotation") or {}
            return bool(
                rotation.get("completed") and not rotation.get("phase") and current.get("ready") == "3/3"
            )

        await wait_until(rotated, "the CA rotation to complete", timeout=CA_ROTATION_LOAD, interval=1.0)
        completed.append(time.monotonic())
        while True:  # the kubelet keeps the mount in sync while the load goes on
            await asyncio.sleep(1.0)
            await asyncio.to_thread(secret.sync)

    duration = max(profile().duration, CA_ROTATION_LOAD)
    load = replace(
        workload(member_urls(status), "ca-rotation"),
        duration=duration,
        max_operations=int(profile().rate * duration * 1.5),
        follow_members=True,  # a member restarted on its volume comes back at a new pod IP
        tls=secret.client_tls,
    )
    history = histories / "ca-rotation.jsonl"
    recording = await proven(
        load, history, "CA rotated: Trust, Reissue, Drop", checker, report, rotate_the_ca()
    )
    assert completed, f"the rotation did not complete within the {duration:.0f} s of load"
    assert felt(recording), "the rotation was never felt"
    # The clients kept writing once the members refused the old CA's certificates.
    after = writes_acknowledged_after(load_history(history), completed[0], recording)
    assert after > 0, "no write acknowledged after the old CA was dropped"
    new_ca = secret_data(kubectl, "rot-ca")["ca.crt"]
    assert new_ca != old_ca and secret.data["ca.crt"] == new_ca
    await wait_healthy(kubectl, "rot", 3)
    report.notes.append(
        f"CA rotated in {completed[0] - began[0]:.1f} s under load (9 member restarts); the clients "
        f"took {recording.tls_reloads} changes of the mounted client Secret and had {after} writes "
        "acknowledged after the old CA was dropped."
    )


DEAD_NODE_LOAD = 120.0  # seconds of load at least: the node unreachable, fenced, cleared, the member replaced


@full_profile_only
async def test_a_dead_node_cleared_with_a_member_on_it_under_load_leaves_a_linearizable_history(
    maintenance: Kubectl,  # noqa: F811
    histories: Path,
    checker: Path,
    report: Report,
) -> None:
    """A member's node stops under load; a fencing agent says it is off, and node maintenance
    (the default MaintenancePolicy) clears it: out-of-service, its pods deleted. The operator
    then replaces the member on another node. The member failure timeout is longer than the
    run, so the replacement is the clear's doing, not the EtcdCluster's own timeout."""
    kubectl = maintenance
    kubectl.apply(etcd_cluster("dead", 3, memberFailureTimeout="600s", pod={"antiAffinity": "required"}))
    status = await wait_healthy(kubectl, "dead", 3)
    victim = next(m["name"] for m in status["members"] if not m["leader"])
    node = node_of(kubectl, victim)
    moments: dict[str, float] = {}

    async def node_dies_and_is_cleared() -> None:
        await asyncio.sleep(profile().duration / 6)
        moments["stopped"] = time.monotonic()
        await asyncio.to_thread(kubectl.cluster.take_node_down, node)

        async def tainted(key: str) -> bool:
            return key in await asyncio.to_thread(taint_keys, kubectl, node)

        await wait_until(lambda: tainted("node.kubernetes.io/unreachable"), f"{node} unreachable", timeout=90)
        moments["unreachable"] = time.monotonic()
        await asyncio.to_thread(fence, kubectl, node)
        await wait_until(lambda: tainted(OUT_OF_SERVICE_TAINT), f"{node} cleared", timeout=90)
        moments["cleared"] = time.monotonic()

        async def replaced_elsewhere() -> bool:
            current = await asyncio.to_thread(status_of, kubectl, "dead")
            members = current.get("members") or []
            healthy = current.get("ready") == "3/3" and all(m.get("healthy") for m in members)
            return healthy and len(members) == 3 and victim not in {m["name"] for m in members}

        await wait_until(replaced_elsewhere, f"{victim} replaced", timeout=DEAD_NODE_LOAD, interval=1.0)
        moments["replaced"] = time.monotonic()

    duration = max(profile().duration, DEAD_NODE_LOAD)
    load = replace(
        workload(member_urls(status), "dead-node"),
        duration=duration,
        max_operations=int(profile().rate * duration * 1.5),
    )
    try:
        recording = await proven(
            load, histories / "dead-node.jsonl", f"node of {victim} stopped, fenced, cleared", checker,
            report, node_dies_and_is_cleared(),
        )  # fmt: skip
        assert "replaced" in moments, f"{victim} was not replaced within the {duration:.0f} s of load"
        assert felt(recording), "the node's death was never felt"
        assert "a fencing agent confirmed it down" in last_message(kubectl, "Clear")
        status = await wait_healthy(kubectl, "dead", 3)
        assert node not in {node_of(kubectl, m["name"]) for m in status["members"]}
        assert_consistent(kubectl, "dead", 3, status)
    finally:
        await restored(kubectl, node)
    report.notes.append(
        f"Dead node with a member on it: unreachable {moments['unreachable'] - moments['stopped']:.1f} s "
        f"after it stopped, cleared {moments['cleared'] - moments['unreachable']:.1f} s after it was "
        f"fenced, the member replaced {moments['replaced'] - moments['cleared']:.1f} s after the clear."
    )
