"""What a later copy of the keys must hold: a snapshot's exact state at its revision, and a
rebuilt cluster's every acknowledged write (issue 25: backup under load, quorum-loss rebuild)."""

from __future__ import annotations

import pytest

from kustos.proof.check import CheckerError, acknowledged_writes_missing, state_at
from kustos.proof.history import Event, Header, History, Operation, Read, WatchEvents, WatchStart

HEADER = Header(
    prefix="/p/", keys=("/p/a", "/p/b"), clients=2, watchers=1, endpoints=("http://127.0.0.1:2379",),
    started="2026-11-26T10:00:00+00:00", initial_revision=4, initial={"/p/b": Read("old", 3)},
)  # fmt: skip


def put(key: str, value: str, revision: int | None, call: int = 0) -> Operation:
    if revision is None:
        return Operation(0, "put", key, call, "indeterminate", value=value, error="timed out")
    return Operation(0, "put", key, call, "ok", ret=call + 1, value=value, revision=revision)


def delete(key: str, revision: int, call: int = 0) -> Operation:
    return Operation(1, "delete", key, call, "ok", ret=call + 1, revision=revision, deleted=1)


WATCHED = History(
    HEADER,
    [put("/p/a", "a1", 5, 10), delete("/p/b", 6, 20), put("/p/a", "a2", 7, 30)],
    [
        WatchStart(0, 1, 5, "http://127.0.0.1:2379"),
        WatchEvents(0, 15, (Event("put", "/p/a", 5, "a1"),)),
        WatchEvents(0, 25, (Event("delete", "/p/b", 6), Event("put", "/p/a", 7, "a2"))),
    ],
)


def test_the_state_at_a_revision_replays_the_watched_writes_up_to_it() -> None:
    assert state_at(WATCHED, 4) == {"/p/b": "old"}
    assert state_at(WATCHED, 5) == {"/p/a": "a1", "/p/b": "old"}
    assert state_at(WATCHED, 6) == {"/p/a": "a1"}
    assert state_at(WATCHED, 7) == {"/p/a": "a2"}


def test_a_revision_no_watcher_covered_is_an_error_not_a_state() -> None:
    with pytest.raises(CheckerError, match="up to 8"):
        state_at(WATCHED, 8)
    with pytest.raises(CheckerError, match="older than the history"):
        state_at(WATCHED, 3)


def test_a_later_state_holding_the_newest_acknowledged_writes_misses_nothing() -> None:
    assert acknowledged_writes_missing(WATCHED, {"/p/a": "a2"}) == []


def test_a_later_state_without_the_newest_acknowledged_write_names_it() -> None:
    assert acknowledged_writes_missing(WATCHED, {"/p/a": "a1"}) == [WATCHED.operations[2]]
    assert acknowledged_writes_missing(WATCHED, {"/p/a": "a2", "/p/b": "old"}) == [WATCHED.operations[1]]


def test_a_write_whose_answer_was_lost_may_explain_the_later_value() -> None:
    history = History(HEADER, [*WATCHED.operations, put("/p/a", "a3", None, 40)])
    assert acknowledged_writes_missing(history, {"/p/a": "a3"}) == []
    assert acknowledged_writes_missing(history, {"/p/a": "a2"}) == []
    assert acknowledged_writes_missing(history, {"/p/a": "zz"}) == [WATCHED.operations[2]]
