"""Decide a recorded history: linearizable (porcupine), watch guarantees, writes lost, outage.

Linearizability is porcupine's (the ``kustos-linearizability`` Go command, built by
``kustos dev build``); what it cannot say is checked here, purely, from the same file:

* watch guarantees (etcd's API guarantees for watches): each watcher's events come in
  revision order with no revision missing (the recorder is the only writer and watches the
  whole prefix, so every revision is one of its events), revisions strictly increase per key,
  and every event is a write some client made, at the revision etcd acknowledged, never
  delivered before that write was invoked;
* acknowledged writes lost: an acknowledged write whose revision a watcher passed without
  delivering it;
* the longest write outage: the longest time in which no write was acknowledged.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypeAlias

from kustos.proof.history import Event, History, Operation, WatchStart, dump_history, load_history

__all__ = [
    "CheckerError",
    "Linearizability",
    "Verdict",
    "acknowledged_writes_lost",
    "acknowledged_writes_missing",
    "check_history",
    "check_linearizability",
    "longest_write_outage",
    "resolve_indeterminate",
    "state_at",
    "watch_violations",
]

Result: TypeAlias = Literal["Ok", "Illegal", "Unknown"]
NANOS = 1_000_000_000


class CheckerError(RuntimeError):
    """The checker could not run or could not read the history (not a verdict)."""


@dataclass(frozen=True)
class Linearizability:
    result: Result
    operations: int
    seconds: float
    visualization: str | None = None


def check_linearizability(
    history: History | Path, checker: Path, timeout: float = 60.0, visualization: Path | None = None
) -> Linearizability:
    """Run porcupine on a history (a file, or one in memory: sent on stdin); ``visualization``
    is written when it is not linearizable."""
    command = [str(checker), "-timeout", f"{timeout}s"]
    if visualization is not None:
        command += ["-html", str(visualization)]
    if isinstance(history, Path):
        command.append(str(history))
        text = None
    else:
        command.append("-")
        out = io.StringIO()
        dump_history(history, out)
        text = out.getvalue()
    try:
        done = subprocess.run(
            command, input=text, capture_output=True, text=True, timeout=timeout + 30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckerError(f"{checker}: {exc}") from exc
    if done.returncode not in (0, 1, 2):
        raise CheckerError(f"{checker} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    try:
        report = json.loads(done.stdout)
        return Linearizability(
            result=report["result"],
            operations=int(report["operations"]),
            seconds=float(report["seconds"]),
            visualization=report.get("visualization"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckerError(f"{checker}: unexpected output {done.stdout[:500]!r}") from exc


def resolve_indeterminate(history: History) -> History:
    """The history with what the watches tell of writes whose answer was lost.

    An unanswered write may take effect at any point after its call, so porcupine must try it
    everywhere: a handful in a long history make the search minutes long (etcd's robustness
    tests patch their histories the same way). Puts and transactions write values unique in
    the run, so a watch that delivered one says it was applied, at which revision, and before
    the delivery: it becomes an answered write. One no watcher delivered, while a watcher saw
    every revision up to the newest any call was told of, was never applied (or only after the
    recording ended): it is left out. This trusts the watches only as far as the watch checks
    prove them complete; a watch that lied about a write would leave the revisions of the
    answered calls unexplained, which porcupine refuses.
    """
    delivered: dict[str, tuple[int, int]] = {}  # value -> (revision, first delivery time)
    for response in history.watch_events:
        for event in response.events:
            if event.kind == "put" and event.value not in delivered:
                delivered[event.value] = (event.mod_revision, response.time)
    newest = max((op.revision for op in history.operations if op.outcome == "ok" and op.revision), default=0)
    complete = any(last >= newest for last in _contiguous_coverage(history).values())
    operations = []
    for op in history.operations:
        if op.outcome != "indeterminate" or op.kind not in ("put", "txn") or op.value is None:
            operations.append(op)
            continue
        seen = delivered.get(op.value)
        if seen is not None and seen[1] >= op.call:
            revision, at = seen
            operations.append(replace(op, outcome="ok", ret=at, revision=revision,
                                      succeeded=True if op.kind == "txn" else None))  # fmt: skip
        elif seen is None and complete:
            continue
        else:
            operations.append(op)
    return replace(history, operations=operations)


def _contiguous_coverage(history: History) -> dict[int, int]:
    """Per watcher, the newest revision up to which it delivered every revision without a gap."""
    covered: dict[int, int] = {}
    broken: set[int] = set()
    for record in history.watches:
        watcher = record.watcher
        if watcher in broken:
            continue
        if isinstance(record, WatchStart):
            last = covered.get(watcher, history.header.initial_revision)
            if record.start_revision > last + 1:
                broken.add(watcher)
            covered.setdefault(watcher, last)
            continue
        for event in record.events:
            last = covered.get(watcher, history.header.initial_revision)
            if event.mod_revision == last + 1:
                covered[watcher] = event.mod_revision
            elif event.mod_revision > last + 1:
                broken.add(watcher)
                break
    return {w: rev for w, rev in covered.items() if w not in broken}


# ------------------------------------------------------------------------- watches


@dataclass(frozen=True)
class _Writes:
    """The clients' writes, found by what a watch event carries: a put's value, a delete's key."""

    by_value: dict[str, Operation]
    deletes_by_key: dict[str, list[Operation]]

    @classmethod
    def of(cls, history: History) -> _Writes:
        by_value: dict[str, Operation] = {}
        deletes: dict[str, list[Operation]] = defaultdict(list)
        for op in history.operations:
            if op.kind == "delete":
                deletes[op.key].append(op)
            elif op.value is not None and op.kind in ("put", "txn"):
                by_value[op.value] = op
        return cls(by_value, dict(deletes))


def _event_matches_a_write(event: Event, seen_at: int, writes: _Writes) -> str:
    """Why this event is not a write some client made (empty: it is one)."""
    if event.kind == "put":
        op = writes.by_value.get(event.value)
        if op is None or op.key != event.key:
            return f"put {event.key}={event.value!r} at revision {event.mod_revision}: no client wrote it"
        candidates = [op]
    else:
        candidates = writes.deletes_by_key.get(event.key, [])
        if not candidates:
            return f"delete of {event.key} at revision {event.mod_revision}: no client deleted it"
    for op in candidates:
        if op.outcome == "failed" or op.call > seen_at:
            continue
        if op.outcome == "indeterminate" or op.revision == event.mod_revision:
            return ""
    what = f"{event.kind} of {event.key} at revision {event.mod_revision}"
    if all(op.call > seen_at for op in candidates):
        return f"{what}: delivered before the write was invoked"
    return f"{what}: at another revision than the one etcd acknowledged for that write"


def watch_violations(history: History) -> list[str]:
    """Every breach of the watch guarantees, one sentence each (empty: none)."""
    problems: list[str] = []
    writes = _Writes.of(history)
    last: dict[int, int] = {}  # watcher -> the newest revision it delivered (or started before)
    per_key: dict[int, dict[str, int]] = defaultdict(dict)
    for record in history.watches:
        watcher = record.watcher
        if isinstance(record, WatchStart):
            # The recorder resumes a broken watch at the revision after the last it got; a
            # resume that skips ahead would hide a gap, so it is one.
            if watcher in last and record.start_revision > last[watcher] + 1:
                problems.append(
                    f"watcher {watcher} restarted at revision {record.start_revision}, "
                    f"skipping from {last[watcher] + 1}"
                )
            last[watcher] = record.start_revision - 1
            keys = per_key[watcher]
            for key in [k for k, rev in keys.items() if rev >= record.start_revision]:
                del keys[key]
            continue
        for event in record.events:
            rev, newest = event.mod_revision, last.get(watcher)
            if newest is not None and rev < newest:
                problems.append(f"watcher {watcher}: revision {rev} delivered after {newest}")
            elif newest is not None and rev > newest + 1:
                problems.append(f"watcher {watcher}: revisions {newest + 1}..{rev - 1} missing")
            if per_key[watcher].get(event.key, 0) >= rev:
                problems.append(
                    f"watcher {watcher}: {event.key} at revision {rev} "
                    f"after revision {per_key[watcher][event.key]}"
                )
            per_key[watcher][event.key] = rev
            last[watcher] = max(rev, newest or 0)
            why = _event_matches_a_write(event, record.time, writes)
            if why:
                problems.append(f"watcher {watcher}: {why}")
    return problems


def acknowledged_writes_lost(history: History) -> list[Operation]:
    """Acknowledged writes a watcher passed over: its stream covered their revision, delivering
    something else or nothing there."""
    delivered: dict[int, dict[int, list[Event]]] = defaultdict(lambda: defaultdict(list))
    for response in history.watch_events:
        for event in response.events:
            delivered[response.watcher][event.mod_revision].append(event)
    covered: dict[int, tuple[int, int]] = {}
    for watcher, revisions in delivered.items():
        first = min(s.start_revision for s in history.watch_starts if s.watcher == watcher)
        covered[watcher] = (first, max(revisions))
    lost = []
    for op in history.operations:
        if not op.acknowledged_write or op.revision is None:
            continue
        rev = op.revision
        for watcher, (first, last) in covered.items():
            if not first <= rev <= last:
                continue
            events = delivered[watcher].get(rev, [])
            kind = "delete" if op.kind == "delete" else "put"
            if not any(e.key == op.key and e.kind == kind and (e.value == op.value or kind == "delete")
                       for e in events):  # fmt: skip
                lost.append(op)
                break
    return lost


def state_at(history: History, revision: int) -> dict[str, str]:
    """The prefix's keys and values at ``revision``, replayed from the initial state and the
    events of a watcher that delivered every revision up to it: what a snapshot taken at that
    revision must hold, exactly."""
    first = history.header.initial_revision
    if revision < first:
        raise CheckerError(f"revision {revision} is older than the history ({first})")
    complete = [w for w, last in _contiguous_coverage(history).items() if last >= revision]
    if not complete and revision > first:
        raise CheckerError(f"no watcher delivered every revision up to {revision}")
    state = {key: read.value for key, read in history.header.initial.items()}
    for response in history.watch_events:
        if response.watcher != (complete[0] if complete else None):
            continue
        for event in response.events:
            if event.mod_revision > revision:
                break
            if event.kind == "put":
                state[event.key] = event.value
            else:
                state.pop(event.key, None)
    return state


def acknowledged_writes_missing(history: History, later: Mapping[str, str]) -> list[Operation]:
    """The acknowledged writes a later state of the keys (a rebuilt cluster's, say) no longer
    holds. Per key, the newest acknowledged write must be what the key holds, unless a write
    whose answer was lost explains it instead (it may have been applied after)."""
    missing = []
    for key in history.header.keys:
        writes = [op for op in history.operations if op.key == key and op.is_write]
        acknowledged = [op for op in writes if op.acknowledged_write and op.revision is not None]
        if not acknowledged:
            continue
        newest = max(acknowledged, key=lambda op: op.revision or 0)
        explained = {_effect(newest)} | {_effect(op) for op in writes if op.outcome == "indeterminate"}
        if later.get(key) not in explained:
            missing.append(newest)
    return missing


def _effect(write: Operation) -> str | None:
    """The value a write leaves its key with (None: absent)."""
    return None if write.kind == "delete" else write.value


def longest_write_outage(history: History) -> float:
    """Seconds of the longest stretch without an acknowledged write, from the first call to the
    last answer (a run with no acknowledged write is one outage as long as the run)."""
    if not history.operations:
        return 0.0
    start = min(op.call for op in history.operations)
    end = max(op.ret if op.ret is not None else op.call for op in history.operations)
    acks = sorted(op.ret for op in history.operations if op.acknowledged_write and op.ret is not None)
    longest, previous = 0, start
    for ack in [*acks, end]:
        longest = max(longest, ack - previous)
        previous = max(previous, ack)
    return longest / NANOS


# ------------------------------------------------------------------------- verdict


@dataclass(frozen=True)
class Verdict:
    """One scenario's row of the report."""

    scenario: str
    operations: int
    clients: int
    rate: float  # operations answered per second
    failures_injected: str
    linearizability: Linearizability
    watch_problems: list[str] = field(default_factory=list)
    writes_lost: int = 0
    longest_write_outage: float = 0.0
    indeterminate: int = 0

    @property
    def passed(self) -> bool:
        return self.linearizability.result == "Ok" and not self.watch_problems and not self.writes_lost

    @property
    def verdict(self) -> str:
        if self.passed:
            return "linearizable"
        if self.linearizability.result == "Illegal":
            return "NOT linearizable"
        if self.linearizability.result == "Unknown":
            return "undecided (checker timeout)"
        return "watch guarantees broken" if self.watch_problems else "acknowledged writes lost"


def check_history(
    history_file: Path,
    checker: Path,
    failures_injected: str = "none",
    timeout: float = 60.0,
    visualization: Path | None = None,
) -> Verdict:
    """Everything the report says of one recorded history."""
    history = load_history(history_file)
    linearizability = check_linearizability(resolve_indeterminate(history), checker, timeout, visualization)
    answered = [op for op in history.operations if op.outcome == "ok" and op.ret is not None]
    span = (max(op.ret for op in answered if op.ret) - min(op.call for op in answered)) if answered else 0
    return Verdict(
        scenario=history.header.scenario or history_file.stem,
        operations=len(history.operations),
        clients=history.header.clients,
        rate=len(answered) / (span / NANOS) if span else 0.0,
        failures_injected=failures_injected,
        linearizability=linearizability,
        watch_problems=watch_violations(history),
        writes_lost=len(acknowledged_writes_lost(history)),
        longest_write_outage=longest_write_outage(history),
        indeterminate=sum(op.outcome == "indeterminate" for op in history.operations),
    )


REPORT_COLUMNS = (
    "scenario",
    "operations recorded",
    "clients",
    "rate (ops/s)",
    "failures injected",
    "verdict",
    "acknowledged writes lost",
    "longest write outage",
)


def report_table(verdicts: list[Verdict]) -> str:
    """The report as a Markdown table (printed by ``make proof``, kept in docs/proof.md)."""
    rows = [
        (
            v.scenario,
            f"{v.operations} ({v.indeterminate} indeterminate)",
            str(v.clients),
            f"{v.rate:.0f}",
            v.failures_injected,
            v.verdict,
            str(v.writes_lost),
            f"{v.longest_write_outage:.1f} s",
        )
        for v in verdicts
    ]
    lines = ["| " + " | ".join(REPORT_COLUMNS) + " |", "|" + "---|" * len(REPORT_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
