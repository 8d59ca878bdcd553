"""A crash at every step (issue 25, item 3): the operator killed right after one of its writes.

The runtime counts every write an operator makes (to the API server and to etcd,
``runtime/crashpoints.py``) and exits, as a SIGKILL would, right after the one a test names; the
test starts the next operator, as a Deployment would, and that one must finish the work and
create nothing twice. The recorder (``kustos.proof``) loads etcd all along, and each history
must stay linearizable with no acknowledged write lost.

The default (what `make test` runs) crashes once per scenario, after its first step that follows
a recorded intent (``KUSTOS_CRASH_AFTER_WRITE=step``, found as the operator writes: a clean
run's numbering shifts by a status write from run to run): the step done, its outcome not yet
recorded. ``KUSTOS_CRASH_POINTS=all`` (what `make proof` sets) crashes after every distinct
write in turn, in one run of the scenario: a chain of operators (``KUSTOS_CRASH_AFTER_WRITE=each``), each
crashing after the first write of the work no earlier one crashed after, following the same
write. One run per write took over an hour for a NodeImage replacement (about 70 writes) and
for a resize 3 -> 5 -> 3 (about 45). A clean run first says how many writes a scenario makes:
the length of the chain's recording.

Scenarios return the cluster to where they began (3 -> 5 -> 3; a member replaced; a quorum
loss rebuilt as a new epoch of 3), so one EtcdCluster serves the clean run and the crash run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kustos.devcluster import binaries
from kustos.devcluster.kwokconfig import MANAGED_LABEL
from kustos.etcd.client import EtcdClient, EtcdError
from kustos.etcd.recovery import BUMP_REVISION
from kustos.proof.check import acknowledged_writes_missing, check_history
from kustos.proof.history import load_history
from kustos.proof.recorder import Recording, Workload, record
from kustos.runtime.crashpoints import EACH, EXIT_CODE, STEP, logged_writes, transitions
from tests.integration.conftest import Kubectl
from tests.integration.etcd_support import assert_consistent, etcd_cluster, status_of, wait_healthy
from tests.integration.kube import describe, wait_until
from tests.integration.operator import OperatorProcess, start_chart_operator
from tests.integration.test_etcd_recovery import AUTOMATIC, kill_members
from tests.integration.test_nodeimage import (  # noqa: F401 (fixtures api, fleet)
    NEW,
    OLD,
    Fleet,
    all_replaced,
    api,
    apply_cluster,
    fleet,
    node_image,
    start_fleet,
)
from tests.integration.test_proof import assert_proven, felt, leader_of, member_urls, write_report
from tests.integration.test_purge_node import (
    client_tls,
    member_names,
    node_ready,
    purge_policy,
    stacked_control_plane,
    stop_etcd,
)

pytestmark = pytest.mark.process_runner(
    "crashes of kustos's own writes, scenario after scenario: members only need to run, many times"
)

STAGE_TIMEOUT = 180.0
CHAIN_STAGE_TIMEOUT = 1800.0  # a chain starts one operator per write of the stage
SETTLE_RESTARTS = 20  # operators a chain may still crash once the work looks done
START_ATTEMPTS = 3
SETTLE = 5.0  # seconds an operator is given once the work is done, for its last writes
FULL = os.environ.get("KUSTOS_CRASH_POINTS") == "all"
# A chain starts an operator per distinct write (each waits out the crashed one's Lease).
TEST_TIMEOUT = 2 * 3600 if FULL else 1200
PURGE_FIRST_INDEX = 221  # node addresses of their own (test_purge_node's start at 201)
PURGE_RECORDING = 40.0  # seconds: a purge takes 15-30 s after the node dies
# A chain's recording: an operator per distinct write, each starting (a few seconds) and waiting
# out the crashed one's Lease (6 s, the suite's timings) before its first pass.
CHAIN_SECONDS_PER_WRITE = 12.0
CHAIN_RECORDING_MAX = 900.0
# The first history of a rebuild: load, then the loss. It must end before the seed serves, where
# the second begins: its last reads cannot succeed without a quorum, so it gives them little time
# (a CI run at a load of 10 saw the rebuild done before the default 30 s had passed).
QUORUM_LOSS_RECORDING = 12.0  # seconds
QUORUM_LOST_AFTER = 5.0  # seconds into it
QUORUM_LOSS_SETTLE = 5.0
REBUILT_RECORDING = 30.0  # the second history's, in `step` mode: the growth back to 3 members


def crash_point() -> str:
    """What to crash after (``KUSTOS_CRASH_AFTER_WRITE``): every write in turn, as one chain of
    operators, with ``KUSTOS_CRASH_POINTS=all``; else the scenario's representative step."""
    return EACH if FULL else STEP


def recording_seconds(k: str, clean_seconds: float, writes: int) -> float:
    """How long to load etcd around one crash run: the clean run's length, or a chain's."""
    if k == EACH:
        return min(max(clean_seconds + 10, writes * CHAIN_SECONDS_PER_WRITE), CHAIN_RECORDING_MAX)
    return min(clean_seconds + 10, 120)


def crash_label(k: str, crashes: int, log: Path) -> str:
    """What a run crashed after, checked: ``step`` once; ``each`` once per distinct transition
    between writes of the work in its log."""
    if k == EACH:
        chained = logged_writes(log)
        distinct = len(transitions(chained))
        assert crashes == distinct, f"{crashes} crashes for {distinct} distinct writes of the work"
        return f"each of the chain's {distinct} distinct writes ({len(chained)} in all)"
    assert crashes == 1, f"the operator crashed {crashes} times at {k}"
    return crashed_after(k, log)


def point_name(k: str) -> str:
    return f"write {k}" if k.isdigit() else k


def crashed_after(k: str, log: Path) -> str:
    """The point and the write it fell on in this run (``step`` has no number of its own)."""
    writes = logged_writes(log)
    return f"{point_name(k)} ({len(writes)}: {(writes or ['none'])[-1]})"


@dataclass
class Operators:
    """The operator of one run: started with ``env`` (a crash point), and a clean one started
    in its place whenever it has crashed, as a Deployment's next pod would; with ``each`` every
    operator is started with it, each crashing after its first write of the work."""

    kubectl: Kubectl
    log_dir: Path
    env: dict[str, str]
    extra: tuple[str, ...] = ()
    crashes: int = 0
    started: list[OperatorProcess] = field(default_factory=list)

    @property
    def chained(self) -> bool:
        return self.env.get("KUSTOS_CRASH_AFTER_WRITE") == EACH

    def start(self) -> None:
        env = self.env if self.chained or not self.started else {}
        log_dir = self.log_dir / str(len(self.started))
        args = ("--namespace", self.kubectl.namespace, *self.extra)
        for attempt in range(START_ATTEMPTS):
            try:
                process = start_chart_operator(self.kubectl.cluster, log_dir / str(attempt), *args, env=env)
            except AssertionError as err:
                # At a load of 20 the import alone can pass the fixture's HEALTHZ_TIMEOUT (stop 23's
                # note); a Deployment would wait for its pod longer than that too.
                if "did not serve /healthz" not in str(err) or attempt == START_ATTEMPTS - 1:
                    raise
                continue
            self.started.append(process)
            return

    def restart_if_crashed(self) -> None:
        current = self.started[-1]
        if current.alive():
            return
        code = current.process.returncode
        assert code == EXIT_CODE and "crash point: exiting after write" in current.log(), (
            f"the operator exited with {code}, not at a crash point:\n{current.log()[-3000:]}"
        )
        self.crashes += 1
        self.start()

    def stop(self) -> None:
        for process in self.started:
            if process.alive():
                process.stop()


Done = Callable[[dict[str, Any]], bool]
Act = Callable[[Kubectl, str], Done | Awaitable[Done]]
Check = Callable[[], Awaitable[bool]]
"""A stage of a scenario: what the user does, and (from then) when the work is done."""


def healthy(status: dict[str, Any], size: int) -> bool:
    members = status.get("members") or []
    return (
        status.get("ready") == f"{size}/{size}"
        and status.get("phase") == "Running"
        and len(members) == size
        and all(m.get("healthy") and not m.get("learner") for m in members)
    )


def resize(size: int) -> Act:
    def act(kubectl: Kubectl, name: str) -> Done:
        kubectl("patch", "etcdcluster", name, "--type=merge", "-p", f'{{"spec":{{"size":{size}}}}}')
        return lambda status: healthy(status, size)

    return act


def replace_a_member(kubectl: Kubectl, name: str) -> Done:
    """A member's pod deleted (its node gone, say): the operator replaces the member."""
    victim = status_of(kubectl, name)["members"][0]["name"]
    kubectl("delete", "pod", victim, "--wait=false")
    return lambda status: healthy(status, 3) and victim not in {m["name"] for m in status["members"]}


SCENARIOS: dict[str, list[Act]] = {
    "etcd resize 3->5->3": [resize(5), resize(3)],
    "etcd member replaced": [replace_a_member],
}


@dataclass
class Run:
    seconds: float
    crashes: int
    status: dict[str, Any]


async def run_stages(
    kubectl: Kubectl,
    stages: list[tuple[Act, Check | None]],
    log_dir: Path,
    env: dict[str, str],
    name: str = "",
    extra: tuple[str, ...] = (),
) -> Run:
    """The stages in turn, with an operator started with ``env``; each stage until done (its own
    check, or else what its act returned, on the EtcdCluster's status), a clean operator
    started whenever the last one crashed."""
    began = time.monotonic()
    operators = Operators(kubectl, log_dir, env, extra)
    timeout = CHAIN_STAGE_TIMEOUT if operators.chained else STAGE_TIMEOUT
    status: dict[str, Any] = {}
    try:
        operators.start()
        for act, check in stages:
            acted = act(kubectl, name)
            done = await acted if inspect.isawaitable(acted) else acted
            deadline = time.monotonic() + timeout
            while True:
                operators.restart_if_crashed()
                if check is not None:
                    finished = await check()
                else:
                    status = await asyncio.to_thread(status_of, kubectl, name)
                    finished = done(status)
                if finished:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"not done in {timeout:.0f}s after {operators.crashes} crash(es): {status}\n"
                        + describe(kubectl.cluster, kubectl.namespace)
                    )
                await asyncio.sleep(0.5)
        # A crash after the last writes comes after the work looked done: the next operator
        # starts on that state and must leave it done (recreate nothing, undo nothing). A chain
        # goes on until an operator finds nothing left to write.
        await asyncio.sleep(SETTLE)
        if not operators.started[-1].alive():
            for _ in range(SETTLE_RESTARTS):
                operators.restart_if_crashed()
                await asyncio.sleep(SETTLE)
                if operators.started[-1].alive():
                    break
            assert operators.started[-1].alive(), (
                f"{SETTLE_RESTARTS} operators in turn still wrote once the work was done: "
                f"{operators.started[-1].log()[-2000:]}"
            )
            status = await asyncio.to_thread(status_of, kubectl, name) if check is None else status
            assert (await check()) if check is not None else done(status), "undone by the next operator"
    finally:
        operators.stop()
    return Run(time.monotonic() - began, operators.crashes, status)


async def run_scenario(
    kubectl: Kubectl, name: str, stages: list[Act], log_dir: Path, env: dict[str, str]
) -> Run:
    return await run_stages(kubectl, [(act, None) for act in stages], log_dir, env, name)


async def create_healthy(kubectl: Kubectl, cluster: dict[str, Any], log_dir: Path) -> None:
    """The EtcdCluster created and healthy at 3, by an operator stopped once it is."""
    kubectl.apply(cluster)
    operators = Operators(kubectl, log_dir, {})
    operators.start()
    try:
        await wait_healthy(kubectl, cluster["metadata"]["name"], 3)
    finally:
        operators.stop()


def assert_nothing_twice(kubectl: Kubectl, name: str, status: dict[str, Any]) -> None:
    """One member per pod and per name, no pod or member left over."""
    assert_consistent(kubectl, name, 3, status)
    indices = [int(m["name"].rsplit("-", 1)[1]) for m in status["members"]]
    assert len(set(indices)) == len(indices), status["members"]


@pytest.fixture(scope="module")
def checker() -> Path:
    return binaries.ensure_built(binaries.linearizability_checker())


@pytest.fixture(scope="module")
def figures() -> Iterator[list[str]]:
    """One line per scenario, printed when the module ends (the figures of docs/proof.md) and
    appended to $KUSTOS_PROOF_REPORT (`make proof`)."""
    lines: list[str] = []
    yield lines
    if lines:
        mode = "all" if FULL else f"one per scenario: {STEP}, the first step after a recorded intent"
        header = (
            "| scenario | writes | crash points | crashes | verdict | acknowledged writes lost | seconds |"
        )
        table = f"{header}\n|---|---|---|---|---|---|---|\n" + "\n".join(lines)
        print(f"\n\ncrash points ({mode}):\n{table}")
        write_report(table, f"Crash points ({mode})")


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_a_crash_after_any_write_is_finished_by_the_next_operator(
    scenario: str, crds: None, kubectl: Kubectl, tmp_path: Path, checker: Path, figures: list[str]
) -> None:
    began = time.monotonic()
    name = "crash"
    stages = SCENARIOS[scenario]
    await create_healthy(kubectl, etcd_cluster(name, 3), tmp_path / "setup")

    clean_log = tmp_path / "clean.writes"
    clean = await run_scenario(
        kubectl, name, stages, tmp_path / "clean", {"KUSTOS_WRITE_LOG": str(clean_log)}
    )
    writes = logged_writes(clean_log)
    assert clean.crashes == 0 and writes, "a clean run made no write"
    assert_nothing_twice(kubectl, name, clean.status)

    k = crash_point()
    status = await asyncio.to_thread(status_of, kubectl, name)
    history = tmp_path / f"crash-{k}.jsonl"
    workload = Workload(
        tuple(m["clientUrl"] for m in status["members"]), clients=3, watchers=1, rate=100,
        duration=recording_seconds(k, clean.seconds, len(writes)),
        scenario=f"{scenario}, crash after {point_name(k)}",
    )  # fmt: skip
    recording = asyncio.create_task(asyncio.to_thread(asyncio.run, record(workload, history)))
    try:
        log = tmp_path / f"crash-{k}.writes"
        env = {"KUSTOS_CRASH_AFTER_WRITE": k, "KUSTOS_WRITE_LOG": str(log)}
        run = await run_scenario(kubectl, name, stages, tmp_path / f"crash-{k}", env)
    finally:
        recorded = await recording
    label = crash_label(k, run.crashes, log)
    assert_nothing_twice(kubectl, name, run.status)
    verdict = check_history(history, checker, f"crash after {label}", 120, history.with_suffix(".html"))
    assert_proven(verdict, recorded)
    figures.append(
        f"| {scenario} | {len(writes)} | {label} | {run.crashes} | "
        f"linearizable | {verdict.writes_lost} | {time.monotonic() - began:.0f} |"
    )


def rebuilt_workload(endpoints: tuple[str, ...], seconds: float, scenario: str) -> Workload:
    """A rebuild's histories: the same keys before and after it, so the second one's initial
    state says whether the rebuild kept every write the first one had acknowledged."""
    return Workload(endpoints, clients=3, watchers=1, rate=100, duration=seconds, scenario=scenario,
                    follow_members=True)  # fmt: skip


@dataclass
class Rebuild:
    """A quorum loss rebuilt automatically, as one stage: both followers killed and their pods
    deleted (the leader, which holds every committed write, survives). With ``recording_for``,
    the loss is recorded into ``loss_history`` from a few seconds before the kill (begun by the
    stage itself, so an operator slow to start cannot push the kill past the recording's end);
    once the new epoch's seed serves alone, a second history (``recording_for`` seconds) is
    recorded on it while the operators grow it back: the first must have ended by then."""

    kubectl: Kubectl
    name: str
    history: Path
    loss_history: Path
    recording_for: float = 0.0
    loss: asyncio.Task[Recording] | None = None
    epoch: int = 0
    recording: asyncio.Task[Recording] | None = None

    async def lose_quorum(self, kubectl: Kubectl, name: str) -> Done:
        if self.recording_for:
            status = await asyncio.to_thread(status_of, kubectl, name)
            workload = rebuilt_workload(
                tuple(member_urls(status)), QUORUM_LOSS_RECORDING, "2 of 3 members killed"
            )
            recorded = record(workload, self.loss_history, settle=QUORUM_LOSS_SETTLE)
            self.loss = asyncio.create_task(asyncio.to_thread(asyncio.run, recorded))
            await asyncio.sleep(QUORUM_LOST_AFTER)
        status = await asyncio.to_thread(status_of, kubectl, name)
        self.epoch = int(status.get("epoch") or 0) + 1
        survivor = leader_of(status)
        kill_members(kubectl, [m["name"] for m in status["members"] if m["name"] != survivor])
        return lambda status: False  # done() decides

    async def done(self) -> bool:
        status = await asyncio.to_thread(status_of, self.kubectl, self.name)
        if status.get("epoch") != self.epoch or (status.get("recovery") or {}).get("phase") != "Succeeded":
            return False
        urls = tuple(member_urls(status))
        ready_to_record = self.recording_for and self.recording is None and urls
        if ready_to_record and (self.loss is None or self.loss.done()):
            workload = rebuilt_workload(urls, self.recording_for, f"rebuilt, epoch {self.epoch}")
            self.recording = asyncio.create_task(
                asyncio.to_thread(asyncio.run, record(workload, self.history))
            )
        # Not done before the second history has begun: it checks what the rebuild kept.
        return healthy(status, 3) and (not self.recording_for or self.recording is not None)

    def assert_nothing_twice(self, old_members: list[str]) -> None:
        """One seed, one new epoch, its three members new and one per pod."""
        status = status_of(self.kubectl, self.name)
        assert status["recovery"]["attempts"] == 1, f"more than one seed: {status['recovery']}"
        assert status["epoch"] == self.epoch, f"rebuilt more than once: epoch {status['epoch']}"
        assert_nothing_twice(self.kubectl, self.name, status)
        assert not {m["name"] for m in status["members"]} & set(old_members), status["members"]
        pods = self.kubectl.get("pods", None, "-l", f"kustos.dev/cluster={self.name}")["items"]
        assert {p["metadata"]["labels"]["kustos.dev/epoch"] for p in pods} == {str(self.epoch)}


async def lose_quorum_and_rebuild(
    kubectl: Kubectl, name: str, directory: Path, env: dict[str, str], recording_for: float = 0.0
) -> tuple[Run, Recording | None, Recording | None]:
    """One rebuild with operators started with ``env``; with ``recording_for`` the loss and the
    rebuilt cluster are each recorded, and the rebuild must have kept every acknowledged write."""
    status = await asyncio.to_thread(status_of, kubectl, name)
    old_members = [m["name"] for m in status["members"]]
    rebuild = Rebuild(kubectl, name, directory / "rebuilt.jsonl", directory / "loss.jsonl", recording_for)
    try:
        run = await run_stages(
            kubectl, [(rebuild.lose_quorum, rebuild.done)], directory / "operators", env, name
        )
    finally:
        lost = await rebuild.loss if rebuild.loss is not None else None
        rebuilt = await rebuild.recording if rebuild.recording is not None else None
    rebuild.assert_nothing_twice(old_members)
    return run, lost, rebuilt


@pytest.mark.timeout(TEST_TIMEOUT)
async def test_a_crash_after_any_write_of_a_quorum_loss_rebuild_is_finished_by_the_next_operator(
    crds: None, kubectl: Kubectl, tmp_path: Path, checker: Path, figures: list[str]
) -> None:
    """The loss is recorded, then the rebuilt cluster from the moment its seed serves: both
    histories linearizable, and the second starts from every write the first acknowledged."""
    began = time.monotonic()
    name = "rebuilt"
    await create_healthy(kubectl, etcd_cluster(name, 3, recovery=AUTOMATIC), tmp_path / "setup")
    writes: list[str] = []
    recording_for = REBUILT_RECORDING
    if FULL:  # the writes to crash after in turn; `step` needs no clean run to find its write
        clean_log = tmp_path / "clean.writes"
        clean, _, _ = await lose_quorum_and_rebuild(
            kubectl, name, tmp_path / "clean", {"KUSTOS_WRITE_LOG": str(clean_log)}
        )
        writes = logged_writes(clean_log)
        assert clean.crashes == 0 and writes, "a clean run made no write"
        recording_for = recording_seconds(EACH, clean.seconds, len(writes))
    k = crash_point()
    log = tmp_path / f"crash-{k}.writes"
    env = {"KUSTOS_CRASH_AFTER_WRITE": k, "KUSTOS_WRITE_LOG": str(log)}
    run, lost, rebuilt = await lose_quorum_and_rebuild(
        kubectl, name, tmp_path / f"crash-{k}", env, recording_for
    )
    assert lost is not None and rebuilt is not None, "the rebuilt cluster was never recorded"
    label = crash_label(k, run.crashes, log)
    assert felt(lost), "the quorum loss was never felt"
    for recording, what in ((lost, "the quorum loss"), (rebuilt, "the rebuilt cluster")):
        verdict = check_history(
            recording.path, checker, f"{what}, crash after {label}", 120, recording.path.with_suffix(".html")
        )
        assert_proven(verdict, recording)
    after = load_history(rebuilt.path).header
    kept = {key: read.value for key, read in after.initial.items()}
    assert acknowledged_writes_missing(load_history(lost.path), kept) == [], "the rebuild lost a write"
    assert after.initial_revision > BUMP_REVISION, "watchers would see old revisions again"
    figures.append(
        f"| etcd quorum-loss rebuild | {len(writes) or '-'} | {label} | {run.crashes} | "
        f"linearizable | 0 | {time.monotonic() - began:.0f} |"
    )


@contextmanager
def purges_on(kubectl: Kubectl, pki: Path) -> Iterator[None]:
    """Purges on, a node fenced once unreachable past 5 s (test_purge_node's policy)."""
    policy = purge_policy(pki)
    kubectl.cluster.kubectl("apply", "-f", "-", input_text=json.dumps(policy))
    try:
        yield
    finally:
        kubectl.cluster.kubectl("delete", "maintenancepolicy", "default", "--ignore-not-found", check=False)


async def purge_a_dead_node(
    kubectl: Kubectl, directory: Path, env: dict[str, str], tag: str, recording_for: float = PURGE_RECORDING
) -> tuple[Run, Recording | None]:
    """Three kubeadm-style control-plane nodes with their etcd members; one dies; the operator
    (started with ``env``, restarted clean after a crash) removes its member and its Node. With
    a crash point the recorder loads the two members that stay."""
    cluster = kubectl.cluster
    with stacked_control_plane(cluster, directory, f"crash{tag}", PURGE_FIRST_INDEX) as (members, pki):
        dead, b, c = members

        async def formed() -> bool:
            try:
                names = await member_names(c, pki)
            except EtcdError:
                return False
            return len(names) == 3 and all(node_ready(cluster, m.node) for m in members)

        await wait_until(formed, "three etcd members and three Ready control-plane Nodes", timeout=90)
        recording: asyncio.Task[Recording] | None = None
        if "KUSTOS_CRASH_AFTER_WRITE" in env:
            workload = Workload(
                (b.client_url, c.client_url), clients=3, watchers=1, rate=100, duration=recording_for,
                scenario=f"purge of a dead node, crash {tag}", tls=client_tls(pki),
            )  # fmt: skip
            history = directory / "history.jsonl"
            recording = asyncio.create_task(asyncio.to_thread(asyncio.run, record(workload, history)))

        def kill_the_node(kubectl: Kubectl, name: str) -> Done:
            cluster.kubectl("label", "node", dead.node, f"{MANAGED_LABEL}-")
            stop_etcd(dead)
            return lambda status: True

        async def purged() -> bool:
            gone = not cluster.kubectl("get", "node", dead.node, "-o", "name", check=False).strip()
            status = json.loads(cluster.kubectl("get", "maintenancepolicy", "default", "-o", "json")).get(
                "status"
            )
            last = (status or {}).get("lastAction") or {}
            # Recorded done: the deletion's decision is cleared only by the purge's last record.
            deciding = [d for d in (status or {}).get("purgeDeletions") or [] if d.get("node") == dead.node]
            return gone and not deciding and last.get("node") == dead.node and last.get("outcome") == "Done"

        try:
            with purges_on(kubectl, pki):
                run = await run_stages(kubectl, [(kill_the_node, purged)], directory / "operators", env)
        finally:
            recorded = await recording if recording is not None else None
        # Nothing removed twice, nothing else removed: b and c stay, and take writes.
        assert await member_names(c, pki) == {b.node, c.node}
        assert node_ready(cluster, b.node) and node_ready(cluster, c.node)
        async with EtcdClient(b.client_url, client_tls(pki)) as client:
            await client.put("/after", "the purge")
    return run, recorded


@pytest.mark.timeout(TEST_TIMEOUT)
async def test_a_crash_after_any_write_of_a_purge_is_finished_by_the_next_operator(
    crds: None, kubectl: Kubectl, tmp_path: Path, checker: Path, figures: list[str]
) -> None:
    began = time.monotonic()
    writes: list[str] = []
    if FULL:  # the writes to crash after in turn; `step` needs no clean run to find its write
        clean_log = tmp_path / "clean.writes"
        clean, _ = await purge_a_dead_node(
            kubectl, tmp_path / "clean", {"KUSTOS_WRITE_LOG": str(clean_log)}, "clean"
        )
        writes = logged_writes(clean_log)
        assert clean.crashes == 0 and writes, "a clean run made no write"
    k = crash_point()
    log = tmp_path / f"crash-{k}.writes"
    env = {"KUSTOS_CRASH_AFTER_WRITE": k, "KUSTOS_WRITE_LOG": str(log)}
    seconds = recording_seconds(k, PURGE_RECORDING - 10, len(writes))
    run, recorded = await purge_a_dead_node(kubectl, tmp_path / f"crash-{k}", env, k, seconds)
    assert recorded is not None
    label = crash_label(k, run.crashes, log)
    verdict = check_history(
        recorded.path, checker, f"crash after {label}", 120, recorded.path.with_suffix(".html")
    )
    assert_proven(verdict, recorded)
    figures.append(
        f"| purge of a dead control-plane node | {len(writes) or '-'} | {label} | "
        f"{run.crashes} | linearizable | {verdict.writes_lost} | {time.monotonic() - began:.0f} |"
    )


async def replace_the_fleet(
    kubectl: Kubectl,
    provider_nodes: Fleet,
    image: str,
    log_dir: Path,
    env: dict[str, str],
) -> Run:
    """The NodeImage moved to ``image``: every node of the fleet replaced by the kwok provider,
    with an operator started with ``env`` (restarted clean after a crash)."""
    total = len(await provider_nodes.nodes())

    def new_image(kubectl: Kubectl, name: str) -> Done:
        apply_cluster(kubectl.cluster, node_image(provider_nodes.name, image))
        return lambda status: True

    async def replaced() -> bool:
        return await all_replaced(provider_nodes, total, image)

    options = ("--cloud-provider", "kwok", *provider_nodes.options())
    run = await run_stages(kubectl, [(new_image, replaced)], log_dir, env, extra=options)
    # Nothing twice: as many nodes as before (all_replaced counts them), no heir left asked for.
    pending = json.loads(kubectl.cluster.kubectl("get", "pendingnodes", "-o", "json"))["items"]
    groups = (provider_nodes.cp, provider_nodes.workers)
    joining = [
        p["metadata"]["name"]
        for p in pending
        if p["spec"]["groupId"] in groups and p["spec"]["goal"] == "Join"
    ]
    assert not joining, f"heirs still asked for: {joining}"
    return run


@pytest.mark.timeout(TEST_TIMEOUT)
async def test_a_crash_after_any_write_of_a_node_replacement_is_finished_by_the_next_operator(
    fleet: Fleet,  # noqa: F811
    kubectl: Kubectl, crds: None, tmp_path: Path, figures: list[str],
) -> None:  # fmt: skip
    began = time.monotonic()
    await start_fleet(fleet, cp=1, workers=1)
    writes: list[str] = []
    if FULL:  # the writes to crash after in turn; `step` needs no clean run to find its write
        clean_log = tmp_path / "clean.writes"
        clean = await replace_the_fleet(
            kubectl, fleet, NEW, tmp_path / "clean", {"KUSTOS_WRITE_LOG": str(clean_log)}
        )
        writes = logged_writes(clean_log)
        assert clean.crashes == 0 and writes, "a clean run made no write"
    # The fleet goes back and forth between the two images (it starts on OLD, the clean run
    # takes it to NEW): each run replaces every node.
    k = crash_point()
    log = tmp_path / f"crash-{k}.writes"
    env = {"KUSTOS_CRASH_AFTER_WRITE": k, "KUSTOS_WRITE_LOG": str(log)}
    run = await replace_the_fleet(kubectl, fleet, OLD if writes else NEW, tmp_path / f"crash-{k}", env)
    label = crash_label(k, run.crashes, log)
    figures.append(
        f"| NodeImage replacement of 2 kwok nodes | {len(writes) or '-'} | {label} | "
        f"{run.crashes} | (no etcd) | - | {time.monotonic() - began:.0f} |"
    )
