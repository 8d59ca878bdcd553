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
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kustos.devcluster import binaries
from kustos.proof.check import Verdict, check_history, report_table
from kustos.proof.recorder import Recording, Workload, record
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import build_missing_etcd_binaries, etcd_cluster, status_of, wait_healthy
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


PROFILES = {
    "short": Profile(clients=4, watchers=2, rate=150, duration=15, checker_timeout=60),
    "full": Profile(clients=8, watchers=3, rate=300, duration=60, checker_timeout=600),
}


def profile() -> Profile:
    name = os.environ.get("KUSTOS_PROOF_PROFILE", "short")
    if name not in PROFILES:
        raise ValueError(f"KUSTOS_PROOF_PROFILE: {name!r} is not one of {', '.join(PROFILES)}")
    return PROFILES[name]


@pytest.fixture(scope="module")
def checker() -> Path:
    """The linearizability checker `kustos dev build` makes (built here when missing)."""
    return binaries.ensure_built(binaries.linearizability_checker())


@pytest.fixture
def histories(tmp_path: Path) -> Path:
    """Where histories (and porcupine's pictures of failures) go: $KUSTOS_PROOF_DIR to keep them."""
    kept = os.environ.get("KUSTOS_PROOF_DIR")
    return Path(kept) if kept else tmp_path


@pytest.fixture(scope="module")
def report() -> Iterator[list[Verdict]]:
    """Every scenario's verdict; the table is printed (and written) once the module ends."""
    verdicts: list[Verdict] = []
    yield verdicts
    if not verdicts:
        return
    table = report_table(verdicts)
    print(f"\n\nproof report (profile {os.environ.get('KUSTOS_PROOF_PROFILE', 'short')}):\n{table}\n")
    target = os.environ.get("KUSTOS_PROOF_REPORT")
    if target:
        Path(target).write_text(table + "\n")


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


async def test_a_member_killed_under_load_leaves_a_linearizable_history(
    tmp_path: Path, histories: Path, checker: Path, report: list[Verdict]
) -> None:
    """etcd processes on loopback, one SIGKILLed mid-run: the recorder's own proof, no operator."""
    build_missing_etcd_binaries()
    load = profile()
    launcher = Launcher(tmp_path, binaries.ETCD_VERSIONS[-1])
    members = launcher.cluster(3)
    try:
        workload = Workload(
            tuple(m.client_url for m in members), clients=load.clients, watchers=load.watchers,
            rate=load.rate, duration=load.duration, scenario="etcd process killed (no operator)",
        )  # fmt: skip

        async def kill_one() -> None:
            await asyncio.sleep(load.duration / 3)
            members[1].stop()

        history = histories / "killed.jsonl"
        failure = "1 member SIGKILLed"
        recording = await run_scenario(workload, history, failure, asyncio.create_task(kill_one()))
    finally:
        launcher.stop_all()
    verdict = check_history(history, checker, failure, load.checker_timeout, history.with_suffix(".html"))
    report.append(verdict)
    assert_proven(verdict, recording)
    assert felt(recording), "the kill was never felt"


async def test_a_member_pod_deleted_under_load_leaves_a_linearizable_history(
    kubectl: Kubectl, operator: OperatorProcess, histories: Path, checker: Path, report: list[Verdict]
) -> None:
    """A 3-member EtcdCluster made by kustos; one member pod deleted mid-run and replaced by the
    operator while the clients keep going: the history stays linearizable, nothing acknowledged
    is lost."""
    load = profile()
    kubectl.apply(etcd_cluster("proof", 3))
    status = await wait_healthy(kubectl, "proof", 3)
    workload = Workload(
        tuple(m["clientUrl"] for m in status["members"]), clients=load.clients, watchers=load.watchers,
        rate=load.rate, duration=load.duration, scenario="member pod deleted (operator replaces it)",
    )  # fmt: skip

    async def delete_a_pod() -> None:
        await asyncio.sleep(load.duration / 3)
        await asyncio.to_thread(kubectl, "delete", "pod", "proof-1", "--wait=false")

    history = histories / "pod-deleted.jsonl"
    failure = "1 member pod deleted"
    recording = await run_scenario(workload, history, failure, asyncio.create_task(delete_a_pod()))
    verdict = check_history(history, checker, failure, load.checker_timeout, history.with_suffix(".html"))
    report.append(verdict)
    assert_proven(verdict, recording)
    assert felt(recording), "the deletion was never felt"

    async def replaced() -> bool:
        names = {m["name"] for m in status_of(kubectl, "proof").get("members") or []}
        return "proof-1" not in names and len(names) == 3

    await wait_until(replaced, "proof-1 replaced", timeout=90, cluster=kubectl.cluster,
                     namespace=kubectl.namespace)  # fmt: skip
