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
import time
from collections.abc import Coroutine, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import binaries
from kustos.proof.catalogue import action, coverage_table
from kustos.proof.check import Verdict, check_history, report_table
from kustos.proof.recorder import Recording, Workload, record
from kustos.proof.soak import Sample, sample_of, soak_summary, what_grew
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import (
    assert_consistent,
    build_missing_etcd_binaries,
    etcd_cluster,
    running_operator,
    status_of,
    wait_healthy,
)
from tests.integration.kube import wait_until
from tests.integration.operator import OperatorProcess
from tests.integration.test_etcd_client import Launcher

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
