"""The linearizability checker (porcupine with kustos's etcd KV model) on known histories.

Each non-linearizable history is one of the failures the proof suite exists to catch: a stale
read, an acknowledged write lost, a write seen before it was invoked, two compare-and-swaps
that both won. The linearizable ones include the ambiguous cases a failure leaves behind:
writes whose answer was lost, applied or not.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kustos.devcluster import binaries
from kustos.proof.check import CheckerError, check_history, check_linearizability
from kustos.proof.history import Header, History, Operation, Read, WatchEvents, WatchStart, dump_history


@pytest.fixture(scope="module")
def checker() -> Path:
    """The checker `kustos dev build` makes (built here when missing: never skipped)."""
    return binaries.ensure_built(binaries.linearizability_checker())


HEADER = Header(
    prefix="/p/", keys=("/p/a", "/p/b"), clients=3, watchers=0, endpoints=("http://127.0.0.1:2379",),
    started="2026-11-25T20:00:00+00:00", initial_revision=1,
)  # fmt: skip


def put(
    key: str, value: str, call: int, ret: int | None, revision: int | None = None, client: int = 0
) -> Operation:
    if ret is None:
        return Operation(client, "put", key, call, "indeterminate", value=value, error="timed out")
    return Operation(client, "put", key, call, "ok", ret=ret, value=value, revision=revision)


def get(
    key: str, call: int, ret: int, revision: int, seen: tuple[str, int] | None, client: int = 1
) -> Operation:
    read = Read(*seen) if seen else None
    return Operation(client, "get", key, call, "ok", ret=ret, revision=revision, read=read)


def txn(key: str, value: str, expected: int, call: int, ret: int | None, revision: int | None,
        succeeded: bool | None, seen: tuple[str, int] | None = None,
        client: int = 2) -> Operation:  # fmt: skip
    outcome = "ok" if ret is not None else "indeterminate"
    read = Read(*seen) if seen else None
    return Operation(client, "txn", key, call, outcome, ret=ret, value=value, expected_mod_revision=expected,
                     revision=revision, read=read, succeeded=succeeded)  # fmt: skip


def delete(key: str, call: int, ret: int, revision: int, deleted: int, client: int = 0) -> Operation:
    return Operation(client, "delete", key, call, "ok", ret=ret, revision=revision, deleted=deleted)


def written(tmp_path: Path, *ops: Operation, header: Header = HEADER) -> Path:
    out = io.StringIO()
    dump_history(History(header, list(ops)), out)
    path = tmp_path / "history.jsonl"
    path.write_text(out.getvalue())
    return path


LINEARIZABLE = {
    "sequential writes and reads": [
        put("/p/a", "v1", 0, 10, 2),
        get("/p/a", 11, 20, 2, ("v1", 2)),
        put("/p/b", "v2", 21, 30, 3),
        get("/p/a", 31, 40, 3, ("v1", 2)),
        delete("/p/a", 41, 50, 4, 1),
        get("/p/a", 51, 60, 4, None),
        delete("/p/a", 61, 70, 4, 0),
    ],
    "a read concurrent with a write sees the old value": [
        put("/p/a", "v1", 0, 10, 2),
        put("/p/a", "v2", 20, 40, 3),
        get("/p/a", 25, 35, 2, ("v1", 2)),
    ],
    "a read concurrent with a write sees the new value": [
        put("/p/a", "v1", 0, 10, 2),
        put("/p/a", "v2", 20, 40, 3),
        get("/p/a", 25, 35, 3, ("v2", 3)),
    ],
    "concurrent writes in the order their revisions say": [
        put("/p/a", "v1", 0, 50, 3, client=0),
        put("/p/a", "v2", 5, 45, 2, client=1),
        get("/p/a", 60, 70, 3, ("v1", 3)),
    ],
    "an unanswered write that was applied": [
        put("/p/a", "v1", 0, None),
        get("/p/a", 100, 110, 2, ("v1", 2)),
    ],
    "an unanswered write that was never applied": [
        put("/p/a", "v1", 0, None),
        get("/p/a", 100, 110, 1, None),
        put("/p/b", "v2", 120, 130, 2),
    ],
    "an unanswered write applied but overwritten before anyone read it": [
        put("/p/a", "v1", 0, None),
        put("/p/a", "v2", 100, 110, 3),
        get("/p/a", 120, 130, 3, ("v2", 3)),
    ],
    "one compare-and-swap wins, the other sees its value": [
        txn("/p/a", "v1", 0, 0, 10, 2, True, client=0),
        txn("/p/a", "v2", 0, 5, 20, 2, False, seen=("v1", 2), client=1),
    ],
    "an unanswered compare-and-swap that won": [
        txn("/p/a", "v1", 0, 0, None, None, None),
        txn("/p/a", "v2", 2, 50, 60, 3, True, client=1),
    ],
}

NOT_LINEARIZABLE = {
    "a stale read (the value before an acknowledged overwrite)": [
        put("/p/a", "v1", 0, 10, 2),
        put("/p/a", "v2", 20, 30, 3),
        get("/p/a", 40, 50, 3, ("v1", 2)),
    ],
    "a stale read at a stale revision": [
        put("/p/a", "v1", 0, 10, 2),
        put("/p/a", "v2", 20, 30, 3),
        get("/p/a", 40, 50, 2, ("v1", 2)),
    ],
    "an acknowledged write lost": [
        put("/p/a", "v1", 0, 10, 2),
        get("/p/a", 20, 30, 2, None),
    ],
    "an acknowledged write lost and its revision reused": [
        put("/p/a", "v1", 0, 10, 2),
        put("/p/b", "v2", 20, 30, 2),
    ],
    "a write seen before it was invoked": [
        get("/p/a", 0, 10, 2, ("v1", 2)),
        put("/p/a", "v1", 20, 30, 2),
    ],
    "an unanswered write seen before it was invoked": [
        get("/p/a", 0, 10, 2, ("v1", 2)),
        put("/p/a", "v1", 20, None),
    ],
    "two compare-and-swaps on the same revision both won": [
        txn("/p/a", "v1", 0, 0, 10, 2, True, client=0),
        txn("/p/a", "v2", 0, 5, 20, 3, True, client=1),
    ],
    "a deleted key read back": [
        put("/p/a", "v1", 0, 10, 2),
        delete("/p/a", 20, 30, 3, 1),
        get("/p/a", 40, 50, 3, ("v1", 2)),
    ],
}


@pytest.mark.parametrize("name", LINEARIZABLE)
def test_a_linearizable_history_is_accepted(name: str, checker: Path, tmp_path: Path) -> None:
    result = check_linearizability(written(tmp_path, *LINEARIZABLE[name]), checker, timeout=30)
    assert result.result == "Ok"


@pytest.mark.parametrize("name", NOT_LINEARIZABLE)
def test_a_non_linearizable_history_is_refused(name: str, checker: Path, tmp_path: Path) -> None:
    result = check_linearizability(written(tmp_path, *NOT_LINEARIZABLE[name]), checker, timeout=30)
    assert result.result == "Illegal"


def test_the_state_before_the_recording_counts(checker: Path, tmp_path: Path) -> None:
    before = Header(**{**HEADER.__dict__, "initial_revision": 7, "initial": {"/p/a": Read("old", 5)}})
    ok = written(tmp_path, get("/p/a", 0, 10, 7, ("old", 5)), put("/p/a", "v1", 20, 30, 8), header=before)
    assert check_linearizability(ok, checker).result == "Ok"

    lost = written(tmp_path, get("/p/a", 0, 10, 7, None), header=before)
    assert check_linearizability(lost, checker).result == "Illegal"


def test_failed_calls_are_left_out(checker: Path, tmp_path: Path) -> None:
    refused = Operation(0, "put", "/p/a", 0, "failed", ret=5, value="never", error="connection refused")
    path = written(tmp_path, refused, get("/p/a", 10, 20, 1, None))

    result = check_linearizability(path, checker)
    assert (result.result, result.operations) == ("Ok", 1)


def test_an_illegal_history_comes_with_porcupines_picture(checker: Path, tmp_path: Path) -> None:
    path = written(tmp_path, *NOT_LINEARIZABLE["a stale read (the value before an acknowledged overwrite)"])
    picture = tmp_path / "history.html"

    result = check_linearizability(path, checker, visualization=picture)
    assert result.visualization == str(picture)
    assert "v2" in picture.read_text()


def test_a_broken_history_file_is_an_error_not_a_verdict(checker: Path, tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"type": "op", "kind": "put"\n')
    with pytest.raises(CheckerError, match=r"broken\.jsonl:1"):
        check_linearizability(path, checker)


def test_the_verdict_adds_the_watch_checks_to_linearizability(checker: Path, tmp_path: Path) -> None:
    ops = [put("/p/a", "v1", 0, 10, 2), put("/p/a", "v2", 20, 30, 3), get("/p/a", 40, 50, 3, ("v2", 3))]
    out = io.StringIO()
    watches: list[WatchStart | WatchEvents] = [WatchStart(0, 0, 2, "http://127.0.0.1:2379")]
    dump_history(History(HEADER, ops, watches), out)
    # The watch delivered revision 3 but never revision 2: an acknowledged write it passed over.
    out.write('{"type": "events", "watcher": 0, "time": 35, "events": '
              '[{"kind": "put", "key": "/p/a", "value": "v2", "mod_revision": 3}]}\n')  # fmt: skip
    path = tmp_path / "history.jsonl"
    path.write_text(out.getvalue())

    verdict = check_history(path, checker, failures_injected="none")
    assert verdict.linearizability.result == "Ok"
    assert verdict.watch_problems == ["watcher 0: revisions 2..2 missing"]
    assert verdict.writes_lost == 1
    assert verdict.verdict == "watch guarantees broken" and not verdict.passed


def test_kustos_proof_check_prints_the_report_and_fails_on_a_bad_history(
    checker: Path, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from kustos.cli import app

    good_dir, bad_dir = tmp_path / "good", tmp_path / "bad"
    good_dir.mkdir()
    bad_dir.mkdir()
    good = written(good_dir, *LINEARIZABLE["sequential writes and reads"])
    bad = written(bad_dir, *NOT_LINEARIZABLE["an acknowledged write lost"])
    runner = CliRunner(env={"COLUMNS": "300", "TERMINAL_WIDTH": "300"})

    passed = runner.invoke(app, ["proof", "check", str(good), "--failures", "none"])
    assert passed.exit_code == 0, passed.output
    assert "| linearizable | 0 |" in passed.output

    failed = runner.invoke(app, ["proof", "check", str(good), str(bad)])
    assert failed.exit_code == 1
    assert "| NOT linearizable |" in failed.output
    assert (bad_dir / "history.html").is_file()

    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_text('{"type": "header", "format": 1}\n')
    refused = runner.invoke(app, ["proof", "check", str(unreadable)])
    assert refused.exit_code == 2
    assert "field 'prefix' is missing" in refused.output
