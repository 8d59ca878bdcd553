"""A recorded history: what each client asked etcd, when, and what it was told.

One JSON object per line, so a run cut short still leaves a readable file and the Go checker
streams it: a ``header`` first, then ``op`` lines (one per finished call, in the order they
finished), ``watch`` lines (a watch (re)started at a revision) and ``events`` lines (what a
watch delivered). Times are nanoseconds of one monotonic clock since the recording started,
so every client's times compare.

An operation's ``outcome`` says what we know of its effect:

* ``ok``: etcd answered; the answer is recorded.
* ``failed``: it certainly had no effect (a read that failed, or a write refused before it
  was sent: the connection was never made). The checker leaves it out.
* ``indeterminate``: a write whose answer never came (timeout, connection lost, the member
  said the request timed out or the leader changed): it may or may not have been applied, at
  any moment after its invocation. It has no return time; the checker lets it take effect
  anywhere after ``call``, or never.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO, TypeAlias, cast

__all__ = [
    "FORMAT",
    "Event",
    "EventKind",
    "Header",
    "History",
    "HistoryError",
    "Operation",
    "Read",
    "WatchEvents",
    "WatchStart",
    "dump_history",
    "header_line",
    "load_history",
    "parse_line",
    "record_line",
]

FORMAT = 1

OpKind: TypeAlias = Literal["get", "put", "delete", "txn"]
Outcome: TypeAlias = Literal["ok", "failed", "indeterminate"]
EventKind: TypeAlias = Literal["put", "delete"]

_OP_KINDS = ("get", "put", "delete", "txn")
_OUTCOMES = ("ok", "failed", "indeterminate")
_WRITES = ("put", "delete", "txn")


class HistoryError(ValueError):
    """A history line that does not parse; the message names the line and the field."""


@dataclass(frozen=True)
class Read:
    """What a get (or a failed transaction's else branch) saw of one key."""

    value: str
    mod_revision: int


@dataclass(frozen=True)
class Header:
    """The recording's settings and the state of its keys before the first call."""

    prefix: str
    keys: tuple[str, ...]
    clients: int
    watchers: int
    endpoints: tuple[str, ...]
    started: str  # wall-clock ISO time, for the report only
    initial_revision: int
    initial: Mapping[str, Read] = field(default_factory=dict)
    scenario: str = ""


@dataclass(frozen=True)
class Operation:
    """One call and its answer.

    ``put`` writes ``value``; ``txn`` is a compare-and-swap on one key: if the key's
    ``mod_revision`` equals ``expected_mod_revision`` (0: the key is absent) it puts ``value``
    (``succeeded``), else it reads the key (``read``). ``revision`` is the answer header's
    store revision: the new revision for an applied write, the current one otherwise.
    """

    client: int
    kind: OpKind
    key: str
    call: int
    outcome: Outcome
    ret: int | None = None
    value: str | None = None
    expected_mod_revision: int | None = None
    revision: int | None = None
    read: Read | None = None
    deleted: int | None = None
    succeeded: bool | None = None
    error: str | None = None

    @property
    def is_write(self) -> bool:
        return self.kind in _WRITES

    @property
    def acknowledged_write(self) -> bool:
        """A write etcd said it applied (a failed compare or a delete of nothing wrote nothing)."""
        if self.outcome != "ok" or not self.is_write:
            return False
        if self.kind == "txn":
            return bool(self.succeeded)
        if self.kind == "delete":
            return bool(self.deleted)
        return True


@dataclass(frozen=True)
class Event:
    """One watch event: a put of ``value`` or a delete of ``key`` at ``mod_revision``."""

    kind: EventKind
    key: str
    mod_revision: int
    value: str = ""


@dataclass(frozen=True)
class WatchStart:
    """A watch (re)created on the whole prefix from ``start_revision`` on ``endpoint``."""

    watcher: int
    time: int
    start_revision: int
    endpoint: str


@dataclass(frozen=True)
class WatchEvents:
    """One watch response's events, in the order etcd sent them."""

    watcher: int
    time: int
    events: tuple[Event, ...]


@dataclass
class History:
    """A header, the operations, and the watches' records in the order they were written."""

    header: Header
    operations: list[Operation] = field(default_factory=list)
    watches: list[WatchStart | WatchEvents] = field(default_factory=list)

    @property
    def watch_starts(self) -> list[WatchStart]:
        return [w for w in self.watches if isinstance(w, WatchStart)]

    @property
    def watch_events(self) -> list[WatchEvents]:
        return [w for w in self.watches if isinstance(w, WatchEvents)]


# ------------------------------------------------------------------------- writing


def _drop_none(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if v is not None}


def header_line(header: Header) -> dict[str, Any]:
    return {"type": "header", "format": FORMAT, **asdict(header)}


def record_line(record: Operation | WatchStart | WatchEvents) -> dict[str, Any]:
    if isinstance(record, Operation):
        line = _drop_none(asdict(record))
        if record.read is not None:
            line["read"] = asdict(record.read)
        return {"type": "op", **line}
    if isinstance(record, WatchStart):
        return {"type": "watch", **asdict(record)}
    return {"type": "events", **asdict(record)}


def dump_history(history: History, out: TextIO) -> None:
    out.write(json.dumps(header_line(history.header)) + "\n")
    for record in [*history.operations, *history.watches]:
        out.write(json.dumps(record_line(record)) + "\n")


# ------------------------------------------------------------------------- reading


class _Fields:
    """Typed access to one line's fields, every error naming the line and field."""

    def __init__(self, obj: Mapping[str, Any], where: str) -> None:
        self.obj = obj
        self.where = where

    def fail(self, name: str, what: str) -> HistoryError:
        return HistoryError(f"{self.where}: field {name!r} {what}")

    def integer(self, name: str, default: int | None = None) -> int:
        value = self.obj.get(name, default)
        if value is None:
            raise self.fail(name, "is missing")
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(name, f"must be an integer, not {value!r}")
        return value

    def opt_integer(self, name: str) -> int | None:
        return None if self.obj.get(name) is None else self.integer(name)

    def text(self, name: str, default: str | None = None) -> str:
        value = self.obj.get(name, default)
        if not isinstance(value, str):
            raise self.fail(name, "is missing" if value is None else f"must be a string, not {value!r}")
        return value

    def opt_text(self, name: str) -> str | None:
        return None if self.obj.get(name) is None else self.text(name)

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        value = self.text(name)
        if value not in choices:
            raise self.fail(name, f"must be one of {', '.join(choices)}, not {value!r}")
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        value = self.obj.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(name, "must be a list of strings")
        return tuple(value)

    def read(self, name: str) -> Read | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, "must be an object with value and mod_revision")
        inner = _Fields(value, f"{self.where}: {name}")
        return Read(inner.text("value"), inner.integer("mod_revision"))


def _header(f: _Fields) -> Header:
    if f.integer("format") != FORMAT:
        raise f.fail("format", f"is {f.obj['format']}, this kustos reads format {FORMAT}")
    initial = f.obj.get("initial") or {}
    if not isinstance(initial, dict):
        raise f.fail("initial", "must be an object of key: {value, mod_revision}")
    reads = {}
    for key, value in initial.items():
        read = _Fields({"v": value}, f"{f.where}: initial").read("v")
        assert read is not None
        reads[key] = read
    return Header(
        prefix=f.text("prefix"),
        keys=f.strings("keys"),
        clients=f.integer("clients"),
        watchers=f.integer("watchers", 0),
        endpoints=f.strings("endpoints"),
        started=f.text("started", ""),
        initial_revision=f.integer("initial_revision"),
        initial=reads,
        scenario=f.text("scenario", ""),
    )


def _operation(f: _Fields) -> Operation:
    kind = f.choice("kind", _OP_KINDS)
    outcome = f.choice("outcome", _OUTCOMES)
    succeeded = f.obj.get("succeeded")
    if succeeded is not None and not isinstance(succeeded, bool):
        raise f.fail("succeeded", f"must be true or false, not {succeeded!r}")
    op = Operation(
        client=f.integer("client"),
        kind=cast(OpKind, kind),
        key=f.text("key"),
        call=f.integer("call"),
        outcome=cast(Outcome, outcome),
        ret=f.opt_integer("ret"),
        value=f.opt_text("value"),
        expected_mod_revision=f.opt_integer("expected_mod_revision"),
        revision=f.opt_integer("revision"),
        read=f.read("read"),
        deleted=f.opt_integer("deleted"),
        succeeded=succeeded,
        error=f.opt_text("error"),
    )
    if outcome == "ok":
        if op.ret is None:
            raise f.fail("ret", "is missing: an answered call has a return time")
        if op.ret < op.call:
            raise f.fail("ret", f"({op.ret}) is before the call ({op.call})")
        if op.revision is None:
            raise f.fail("revision", "is missing: an answered call has the answer's revision")
        if kind == "txn" and succeeded is None:
            raise f.fail("succeeded", "is missing for an answered txn")
        if kind == "delete" and op.deleted is None:
            raise f.fail("deleted", "is missing for an answered delete")
    if kind in ("put", "txn") and op.value is None:
        raise f.fail("value", f"is missing for a {kind}")
    if kind == "txn" and op.expected_mod_revision is None:
        raise f.fail("expected_mod_revision", "is missing for a txn")
    return op


def _events(f: _Fields) -> WatchEvents:
    raw = f.obj.get("events")
    if not isinstance(raw, list):
        raise f.fail("events", "must be a list")
    events = []
    for i, obj in enumerate(raw):
        if not isinstance(obj, dict):
            raise f.fail(f"events[{i}]", "must be an object")
        e = _Fields(obj, f"{f.where}: events[{i}]")
        kind = e.choice("kind", ("put", "delete"))
        event = Event(cast(EventKind, kind), e.text("key"), e.integer("mod_revision"), e.text("value", ""))
        events.append(event)
    return WatchEvents(f.integer("watcher"), f.integer("time"), tuple(events))


Record: TypeAlias = Header | Operation | WatchStart | WatchEvents


def parse_line(line: str, where: str = "line") -> Record:
    """One history line as its typed record; a clear error for anything else."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise HistoryError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise HistoryError(f"{where}: must be a JSON object")
    f = _Fields(obj, where)
    kind = f.choice("type", ("header", "op", "watch", "events"))
    if kind == "header":
        return _header(f)
    if kind == "op":
        return _operation(f)
    if kind == "watch":
        watcher, time = f.integer("watcher"), f.integer("time")
        return WatchStart(watcher, time, f.integer("start_revision"), f.text("endpoint", ""))
    return _events(f)


def _records(lines: Iterable[str], name: str) -> Iterator[Record]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield parse_line(line, f"{name}:{number}")


def load_history(path: Path) -> History:
    """Read a history file; the first record must be its header."""
    with path.open(encoding="utf-8") as lines:
        records = iter(_records(lines, str(path)))
        header = next(records, None)
        if not isinstance(header, Header):
            raise HistoryError(f"{path}: the first line must be the header")
        history = History(header)
        for record in records:
            if isinstance(record, Header):
                raise HistoryError(f"{path}: a second header")
            if isinstance(record, Operation):
                history.operations.append(record)
            else:
                history.watches.append(record)
    return history
