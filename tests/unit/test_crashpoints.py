"""Crash points: a process exits right after its k-th accepted write, and logs what it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kustos.runtime.crashpoints import EXIT_CODE, STEP, CrashPoints, logged_writes

# What an operator's pass might send: reads and refusals between accepted writes.
CALLS = """
from kustos.runtime import crashpoints as c
c.api_write("GET", "/api/v1/pods", 200)
c.api_write("PATCH", "/apis/kustos.dev/v1/etcdclusters/a/status", 200)
c.api_write("POST", "/api/v1/pods", 409)
c.etcd_write("http://m:2379", "/v3/cluster/member/list", {})
c.etcd_write("http://m:2379", "/v3/maintenance/alarm", {"action": "GET"})
c.etcd_write("http://m:2379", "/v3/cluster/member/add", {"peerURLs": []})
c.api_write("DELETE", "/api/v1/pods/a-1", 200)
c.etcd_write("http://m:2379", "/v3/maintenance/alarm", {"action": "DEACTIVATE"})
print("finished")
"""
WRITES = [
    "api PATCH /apis/kustos.dev/v1/etcdclusters/a/status",
    "etcd /v3/cluster/member/add http://m:2379",
    "api DELETE /api/v1/pods/a-1",
    "etcd /v3/maintenance/alarm http://m:2379",
]


def run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KUSTOS_")}
    return subprocess.run(
        [sys.executable, "-c", CALLS], env={**clean, **env}, capture_output=True, text=True, check=False
    )


def test_a_clean_run_logs_every_accepted_write_and_nothing_else(tmp_path: Path) -> None:
    log = tmp_path / "writes"
    result = run({"KUSTOS_WRITE_LOG": str(log)})
    assert result.returncode == 0 and "finished" in result.stdout
    assert logged_writes(log) == WRITES


@pytest.mark.parametrize("k", range(1, len(WRITES) + 1))
def test_the_process_exits_right_after_write_k(k: int, tmp_path: Path) -> None:
    log = tmp_path / "writes"
    result = run({"KUSTOS_CRASH_AFTER_WRITE": str(k), "KUSTOS_WRITE_LOG": str(log)})
    assert result.returncode == EXIT_CODE and "finished" not in result.stdout
    assert logged_writes(log) == WRITES[:k]
    assert f"exiting after write {k} ({WRITES[k - 1]})" in result.stderr


def test_step_exits_right_after_the_first_step_after_a_recorded_intent(tmp_path: Path) -> None:
    log = tmp_path / "writes"
    result = run({"KUSTOS_CRASH_AFTER_WRITE": "step", "KUSTOS_WRITE_LOG": str(log)})
    assert result.returncode == EXIT_CODE and "finished" not in result.stdout
    assert logged_writes(log) == WRITES[:2]  # the status write, then the member add


def test_a_chain_of_processes_crashes_after_every_write_and_ends(tmp_path: Path) -> None:
    """Each process here writes everything again (an operator goes on from where the last one
    stopped instead): a write that follows another than last time is crashed after again,
    and the chain still ends once every transition has had its crash."""
    env = {"KUSTOS_CRASH_AFTER_WRITE": "each", "KUSTOS_WRITE_LOG": str(tmp_path / "writes")}
    crashed_after: list[str] = []
    for _ in range(20):
        result = run(env)
        if result.returncode == 0:
            break
        assert result.returncode == EXIT_CODE
        crashed_after.append(result.stderr.split("(", 1)[1].rstrip(")\n"))
    assert result.returncode == 0 and "finished" in result.stdout
    assert set(crashed_after) == set(WRITES)


def test_without_the_variables_nothing_is_counted() -> None:
    assert not CrashPoints.from_env({}).active
    assert run({}).returncode == 0


@pytest.mark.parametrize("value", ["0", "two", "-1", "steps", "every"])
def test_a_bad_write_number_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match="KUSTOS_CRASH_AFTER_WRITE"):
        CrashPoints.from_env({"KUSTOS_CRASH_AFTER_WRITE": value})


# The start of a resize's clean log (test_crash_points.py): the webhook configurations and the
# PDB, the pending member recorded in status, then the member add.
RESIZE = [
    "api PATCH /apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kustos",
    "api PATCH /apis/policy/v1/namespaces/t/poddisruptionbudgets/crash",
    "api PUT /apis/kustos.dev/v1alpha1/namespaces/t/etcdclusters/crash/status",
    "api POST /api/v1/namespaces/t/events",
    "etcd /v3/cluster/member/add http://crash-0.crash-peer.t.svc:2379",
    "api PUT /apis/kustos.dev/v1alpha1/namespaces/t/etcdclusters/crash/status",
]


def step_crash(writes: list[str]) -> int | None:
    """The write a ``step`` operator making ``writes`` exits after (None: it makes them all)."""
    points = CrashPoints(STEP, None)
    return next((n for n, write in enumerate(writes, start=1) if points.exits_after(n, write)), None)


def test_the_representative_crash_follows_the_first_step_after_a_recorded_intent() -> None:
    assert step_crash(RESIZE) == 5  # the member add, not the start's PDB patch


def test_the_starts_webhook_configurations_are_no_step() -> None:
    # The start of a purge's clean log: the policy's first status, then the operator's start
    # goes on (the mutating configuration) before the dead node is tainted.
    purge = [
        "api PATCH /apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kustos",
        "api PUT /apis/kustos.dev/v1alpha1/maintenancepolicies/default/status",
        "api PATCH /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kustos",
        "api PATCH /api/v1/nodes/cp-0",
    ]
    assert step_crash(purge) == 4


def test_without_a_step_after_a_status_write_there_is_no_crash() -> None:
    assert step_crash(RESIZE[:4]) is None


START = [
    "api PATCH /apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/kustos",
    "api PATCH /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/kustos",
]
INTENT = "api POST /apis/kustos.dev/v1alpha1/pendingnodes"
ASK = "api POST /api/v1/nodes"


def chain(passes: list[list[str]], log: Path) -> list[list[str]]:
    """Operators of an ``each`` chain in turn, the i-th making the writes of ``passes[i]`` after
    its start's; what each wrote before it crashed (all of it if it did not)."""
    wrote = []
    for writes in passes:
        points = CrashPoints("each", log)
        made: list[str] = []
        for write in [*START, *writes]:
            made.append(write)
            with log.open("a") as out:
                out.write(f"{len(made)} {write}\n")
            if points.exits_after(len(made), write):
                break
        wrote.append(made[len(START) :])
    return wrote


def test_each_operator_of_a_chain_crashes_after_its_first_write_of_the_work(tmp_path: Path) -> None:
    work = [w for w in RESIZE if w not in START and "/events" not in w]
    log = tmp_path / "chain"
    wrote = chain([work[i:] for i in range(len(work))], log)
    assert wrote == [[w] for w in work]


def test_a_chain_lets_a_transition_it_crashed_after_through_so_it_ends(tmp_path: Path) -> None:
    """An intent and the provider's call come in one pass: crashed between them, the next
    operators undo the intent past its deadline and write it again; once the chain has crashed
    after the intent following the undo, it lets that through to the call."""
    status, undo = (
        "api PUT /apis/kustos.dev/v1alpha1/pendingnodes/j/status",
        "api DELETE /apis/x/pendingnodes/j",
    )
    log = tmp_path / "chain"
    after_intent = [status, undo, INTENT, ASK]  # what an operator not stopped does next
    wrote = chain(
        [[INTENT, ASK], after_intent, after_intent[1:], after_intent[2:], [*after_intent, status], [status]],
        log,
    )
    assert wrote == [[INTENT], [status], [undo], [INTENT], after_intent, [status]]


def test_each_needs_the_chains_log() -> None:
    with pytest.raises(ValueError, match="KUSTOS_WRITE_LOG"):
        CrashPoints.from_env({"KUSTOS_CRASH_AFTER_WRITE": "each"})
