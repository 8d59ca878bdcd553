"""The proof suite's pure parts: the history file, watch guarantees, lost writes, outages, bounds."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from kustos.proof.check import (
    Linearizability,
    Verdict,
    acknowledged_writes_lost,
    longest_write_outage,
    report_table,
    resolve_indeterminate,
    watch_violations,
)
from kustos.proof.history import (
    Event,
    Header,
    History,
    HistoryError,
    Operation,
    Read,
    WatchEvents,
    WatchStart,
    dump_history,
    load_history,
    parse_line,
)
from kustos.proof.recorder import Workload, WorkloadError

S = 1_000_000_000


def header(initial_revision: int = 1) -> Header:
    return Header(
        prefix="/p/", keys=("/p/a", "/p/b"), clients=2, watchers=1, endpoints=("http://127.0.0.1:2379",),
        started="2026-11-25T20:00:00+00:00", initial_revision=initial_revision, scenario="unit",
    )  # fmt: skip


def put(key: str, value: str, call: int, ret: int | None, revision: int | None, client: int = 0) -> Operation:
    outcome = "ok" if ret is not None else "indeterminate"
    return Operation(client, "put", key, call, outcome, ret=ret, value=value, revision=revision)


def start(at: int, revision: int, watcher: int = 0) -> WatchStart:
    return WatchStart(watcher, at, revision, "http://127.0.0.1:2379")


def events(at: int, *evs: Event, watcher: int = 0) -> WatchEvents:
    return WatchEvents(watcher, at, evs)


def put_event(key: str, value: str, revision: int) -> Event:
    return Event("put", key, revision, value)


# ---- the file -------------------------------------------------------------------------------


def test_a_history_reads_back_as_it_was_written(tmp_path: Path) -> None:
    history = History(
        header(),
        operations=[
            put("/p/a", "c0-1", 10, 20, 2),
            Operation(1, "get", "/p/a", 25, "ok", ret=30, revision=2, read=Read("c0-1", 2)),
            Operation(
                1, "txn", "/p/b", 31, "indeterminate", value="c1-2", expected_mod_revision=0, error="timeout"
            ),
            Operation(0, "delete", "/p/b", 40, "failed", ret=41, error="refused"),
        ],
        watches=[start(0, 2), events(22, put_event("/p/a", "c0-1", 2))],
    )
    out = io.StringIO()
    dump_history(history, out)
    path = tmp_path / "h.jsonl"
    path.write_text(out.getvalue())

    assert load_history(path) == history


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('{"type": "op", "client": 0, "kind": "scan", "key": "k", "call": 1, "outcome": "ok"}', "'kind'"),
        ('{"type": "op", "client": 0, "kind": "get", "key": "k", "call": 1, "outcome": "ok"}', "'ret'"),
        ('{"type": "op", "client": 0, "kind": "put", "key": "k", "call": 1,'
         ' "outcome": "indeterminate"}', "'value'"),
        ('{"type": "op", "client": "x", "kind": "get", "key": "k", "call": 1,'
         ' "outcome": "failed"}', "'client'"),
        ('{"type": "op", "client": 0, "kind": "get", "key": "k", "call": 9, "ret": 3, "outcome": "ok",'
         ' "revision": 1}', "'ret'"),
        ('{"type": "events", "watcher": 0, "time": 1, "events": [{"kind": "put", "key": "k"}]}',
         "'mod_revision'"),
        ('{"type": "header", "format": 99}', "'format'"),
        ('["not", "an", "object"]', "JSON object"),
    ],
)  # fmt: skip
def test_a_bad_line_is_refused_naming_its_field(line: str, named: str) -> None:
    with pytest.raises(HistoryError, match=named):
        parse_line(line, "h.jsonl:7")


def test_a_history_must_start_with_its_header(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text('{"type": "watch", "watcher": 0, "time": 0, "start_revision": 2}\n')
    with pytest.raises(HistoryError, match="header"):
        load_history(path)


# ---- watches --------------------------------------------------------------------------------

WRITES = [put("/p/a", "v1", 0, 10, 2), put("/p/b", "v2", 11, 20, 3), put("/p/a", "v3", 21, 30, 4)]


def watched(*records: WatchStart | WatchEvents, ops: list[Operation] | None = None) -> History:
    return History(header(), operations=list(WRITES if ops is None else ops), watches=list(records))


def test_a_complete_ordered_watch_breaks_nothing() -> None:
    history = watched(
        start(0, 2),
        events(12, put_event("/p/a", "v1", 2)),
        events(25, put_event("/p/b", "v2", 3), put_event("/p/a", "v3", 4)),
    )
    assert watch_violations(history) == []
    assert acknowledged_writes_lost(history) == []


def test_a_watch_resumed_after_the_last_revision_it_got_breaks_nothing() -> None:
    history = watched(
        start(0, 2),
        events(12, put_event("/p/a", "v1", 2)),
        start(13, 3),
        events(25, put_event("/p/b", "v2", 3), put_event("/p/a", "v3", 4)),
    )
    assert watch_violations(history) == []


def test_a_missing_revision_is_a_gap() -> None:
    history = watched(
        start(0, 2), events(12, put_event("/p/a", "v1", 2)), events(31, put_event("/p/a", "v3", 4))
    )

    assert watch_violations(history) == ["watcher 0: revisions 3..3 missing"]
    assert acknowledged_writes_lost(history) == [WRITES[1]]


def test_a_resume_that_skips_revisions_is_a_gap() -> None:
    history = watched(start(0, 2), events(12, put_event("/p/a", "v1", 2)), start(13, 4),
                      events(31, put_event("/p/a", "v3", 4)))  # fmt: skip
    assert watch_violations(history) == ["watcher 0 restarted at revision 4, skipping from 3"]


def test_events_out_of_revision_order_are_reordering() -> None:
    history = watched(
        start(0, 2),
        events(31, put_event("/p/a", "v1", 2), put_event("/p/a", "v3", 4), put_event("/p/b", "v2", 3)),
    )
    assert "watcher 0: revision 3 delivered after 4" in watch_violations(history)


def test_a_key_seen_twice_at_one_revision_does_not_strictly_increase() -> None:
    history = watched(start(0, 2), events(12, put_event("/p/a", "v1", 2), put_event("/p/a", "v1", 2)))
    assert "watcher 0: /p/a at revision 2 after revision 2" in watch_violations(history)


def test_an_event_no_client_wrote_is_a_phantom() -> None:
    history = watched(start(0, 2), events(12, put_event("/p/a", "nobody", 2)))
    assert watch_violations(history) == ["watcher 0: put /p/a='nobody' at revision 2: no client wrote it"]


def test_an_event_delivered_before_its_write_was_invoked_is_refused() -> None:
    ops = [put("/p/a", "v1", 50, 60, 2)]
    history = watched(start(0, 2), events(12, put_event("/p/a", "v1", 2)), ops=ops)
    assert watch_violations(history) == [
        "watcher 0: put of /p/a at revision 2: delivered before the write was invoked"
    ]


def test_an_event_at_another_revision_than_acknowledged_is_refused() -> None:
    history = watched(start(0, 2), events(12, put_event("/p/a", "v1", 2)), ops=[put("/p/a", "v1", 0, 10, 5)])
    assert "at another revision than the one etcd acknowledged" in watch_violations(history)[0]


def test_an_indeterminate_write_may_show_up_at_any_revision() -> None:
    history = watched(
        start(0, 2), events(12, put_event("/p/a", "v1", 2)), ops=[put("/p/a", "v1", 0, None, None)]
    )
    assert watch_violations(history) == []


# ---- writes whose answer was lost, resolved by the watches ---------------------------------

UNANSWERED = put("/p/b", "lost", 5, None, None, client=1)


def test_an_unanswered_write_a_watch_delivered_was_applied_by_then() -> None:
    history = watched(
        start(0, 2),
        events(12, put_event("/p/a", "v1", 2)),
        events(25, put_event("/p/b", "lost", 3)),
        events(35, put_event("/p/a", "v3", 4)),
        ops=[WRITES[0], UNANSWERED, put("/p/a", "v3", 21, 30, 4)],
    )
    resolved = resolve_indeterminate(history).operations[1]
    assert (resolved.outcome, resolved.revision, resolved.call, resolved.ret) == ("ok", 3, 5, 25)


def test_an_unanswered_write_no_complete_watch_delivered_was_never_applied() -> None:
    history = watched(start(0, 2), events(12, put_event("/p/a", "v1", 2)), ops=[WRITES[0], UNANSWERED])
    assert resolve_indeterminate(history).operations == [WRITES[0]]


def test_an_unanswered_write_stays_undecided_when_the_watches_have_a_gap() -> None:
    ops = [WRITES[0], UNANSWERED, put("/p/a", "v3", 21, 30, 4)]
    history = watched(
        start(0, 2), events(12, put_event("/p/a", "v1", 2)), events(35, put_event("/p/a", "v3", 4)), ops=ops
    )
    assert resolve_indeterminate(history).operations == ops


def test_a_watch_that_delivered_a_write_before_it_was_sent_decides_nothing() -> None:
    history = watched(start(0, 2), events(3, put_event("/p/b", "lost", 2)), ops=[UNANSWERED])
    assert resolve_indeterminate(history).operations == [UNANSWERED]


# ---- outages and the report -----------------------------------------------------------------


def test_the_longest_write_outage_is_the_longest_time_without_an_acknowledged_write() -> None:
    ops = [
        put("/p/a", "v1", 0, 1 * S, 2),
        put("/p/a", "v2", 1 * S, None, None),  # lost in the outage: no acknowledgement
        Operation(1, "get", "/p/a", 2 * S, "failed", ret=3 * S),
        put("/p/a", "v3", 3 * S, 5 * S, 3),
        Operation(1, "get", "/p/a", 5 * S, "ok", ret=6 * S, revision=3, read=Read("v3", 3)),
    ]
    assert longest_write_outage(History(header(), ops)) == pytest.approx(4.0)


def test_a_run_without_acknowledged_writes_is_one_outage() -> None:
    ops = [Operation(0, "get", "/p/a", 0, "failed", ret=2 * S)]
    assert longest_write_outage(History(header(), ops)) == pytest.approx(2.0)


def test_the_report_has_a_row_per_scenario_with_the_issues_columns() -> None:
    ok = Linearizability("Ok", 100, 0.1)
    bad = Linearizability("Illegal", 100, 0.1)
    table = report_table([
        Verdict("pod deleted", 1200, 6, 240.4, "1 member pod deleted", ok, longest_write_outage=1.26,
                indeterminate=3),
        Verdict("stale", 10, 2, 5, "none", bad, writes_lost=1),
    ])  # fmt: skip
    lines = table.splitlines()

    assert lines[0] == (
        "| scenario | operations recorded | clients | rate (ops/s) | failures injected | verdict"
        " | acknowledged writes lost | longest write outage |"
    )
    assert lines[2] == (
        "| pod deleted | 1200 (3 indeterminate) | 6 | 240 | 1 member pod deleted | linearizable | 0 | 1.3 s |"
    )
    assert "| NOT linearizable | 1 |" in lines[3]


# ---- the workload's bounds ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"endpoints": ("http://8.8.8.8:2379",)}, "endpoints"),
        ({"endpoints": ("http://etcd.example.com:2379",)}, "endpoints"),
        ({"endpoints": ()}, "endpoints"),
        ({"endpoints": ("etcd:2379",)}, "endpoints"),
        ({"clients": 0}, "clients"),
        ({"duration": 86_400.0}, "duration"),
        ({"max_operations": 0}, "max_operations"),
        ({"rate": 1e6}, "rate"),
        ({"mix": {"scan": 1}}, "mix"),
    ],
)
def test_a_workload_out_of_bounds_is_refused_naming_the_field(
    settings: dict[str, object], named: str
) -> None:
    arguments: dict[str, object] = {"endpoints": ("http://127.0.0.1:2379",), **settings}
    with pytest.raises(WorkloadError, match=f"^{named}:"):
        Workload(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "endpoint",
    ["http://127.0.0.1:2379", "http://10.244.1.7:2379", "https://e-0.e.ns.svc:2379", "http://[::1]:2379",
     "https://e-0.e.ns.svc.cluster.local:2379", "http://localhost:2379"],
)  # fmt: skip
def test_loopback_private_and_cluster_addresses_are_loaded(endpoint: str) -> None:
    assert Workload((endpoint,)).endpoints == (endpoint,)
