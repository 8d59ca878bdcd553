"""Crash points: kill the operator right after its Nth write, for the proof suite's crash tests.

``faults.py`` exits after a named step; this counts every write instead, so a test can crash
an operator after write 1, then 2, ... of a whole scenario without knowing its steps. Two
environment variables, read once when the process starts:

* ``KUSTOS_CRASH_AFTER_WRITE=k``: exit (``os._exit(137)``: no cleanup, no lease release, as a
  SIGKILL) right after the k-th write was accepted; ``=step``: right after the first step that
  follows a recorded intent (``STEP``), whatever its number in this run; ``=each``: right after
  the first write of the work no earlier operator of a chain crashed after (``EACH``), so the
  chain crashes after every distinct write of a scenario in one run of it;
* ``KUSTOS_WRITE_LOG=path``: append one line per accepted write, ``<n> <target> <what>``; a
  clean run's log tells a test how many writes its scenario makes, and which one a crash
  followed.

A write is a request that changes state and was accepted: to the API server a POST, PUT, PATCH
or DELETE answered below 400 (status and events included); to etcd any call but a read
(``ETCD_READS``) answered 200. A refused write changed nothing, so a crash after it is a crash
before the next one. Both unset, ``wrote`` returns at its first test.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

EXIT_CODE = 137
API_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ETCD_READS = frozenset({
    "/v3/auth/authenticate", "/v3/auth/role/get", "/v3/auth/role/list", "/v3/auth/status",
    "/v3/auth/user/get", "/v3/auth/user/list", "/v3/cluster/member/list", "/v3/kv/range",
    "/v3/maintenance/hashkv", "/v3/maintenance/status",
})  # fmt: skip
"""The etcd gateway paths that change nothing (the alarm path is a read only for action GET)."""


STEP = "step"
"""``KUSTOS_CRASH_AFTER_WRITE=step``: the first step made after a status write recorded what
the operator was about to do, found as the process writes (a clean run's numbering shifts by a
status write from run to run). A step is any write but a status record, an Event or the
start's webhook configurations (``write_kind``): a member add, a pod create, a Node patch, a
cloud provider's call. A crash there leaves the step done and its outcome unrecorded, the
window where a next operator that trusts only its status repeats the step (a second member,
an orphan)."""


EACH = "each"
"""``KUSTOS_CRASH_AFTER_WRITE=each``: the first write of the work (a step or a status record:
not an Event, not the start's webhook configurations) that no earlier operator of the chain
crashed after, following the same write. Given to every operator of a scenario in turn, with
one ``KUSTOS_WRITE_LOG`` for the chain, it crashes after each distinct transition of the
scenario's writes in one run of it, where crashing after write k of a fresh run for every k
repeats the scenario once per write. A transition a crash already followed is let through the
next time: work that takes two writes in one pass (an intent, then the provider's call) would
otherwise be crashed between them forever. So a step that follows the same write as an earlier
one (a second member's add after its status record) is crashed after once, not twice."""

Transition = tuple[str, str]
"""The chain's previous write of the work ("" for none), and the write after it."""

POINTS_BY_NAME = (STEP, EACH)


class CrashPoints:
    """The write counter of one process."""

    def __init__(self, crash_after: int | str | None, log: Path | None) -> None:
        if crash_after not in POINTS_BY_NAME and not (
            (isinstance(crash_after, int) and crash_after >= 1) or crash_after is None
        ):
            raise ValueError(
                f"KUSTOS_CRASH_AFTER_WRITE: {crash_after} is not a write number (1, 2, ...), step or each"
            )
        if crash_after == EACH and log is None:
            raise ValueError("KUSTOS_CRASH_AFTER_WRITE=each needs KUSTOS_WRITE_LOG, the chain's one record")
        self.crash_after = crash_after
        self.log = log
        # What the chain's earlier operators crashed after, and its last write of the work.
        self.crashed, self.last_work = chain_so_far(log_lines(log)) if crash_after == EACH else (set(), "")
        self.active = crash_after is not None or log is not None
        self.writes = 0
        self.intent_recorded = False
        self._lock = threading.Lock()  # the etcd client may be used from worker threads

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CrashPoints:
        after, log = env.get("KUSTOS_CRASH_AFTER_WRITE"), env.get("KUSTOS_WRITE_LOG")
        try:
            crash_after = (after if after in POINTS_BY_NAME else int(after)) if after else None
        except ValueError:
            raise ValueError(
                f"KUSTOS_CRASH_AFTER_WRITE: {after!r} is not a write number (1, 2, ...), step or each"
            ) from None
        return cls(crash_after, Path(log) if log else None)

    def wrote(self, target: str, what: str) -> None:
        """Count one accepted write; log it; exit if it is the one to crash after."""
        with self._lock:
            self.writes += 1
            n = self.writes
            if self.log is not None:
                with self.log.open("a", encoding="utf-8") as out:
                    out.write(f"{n} {target} {what}\n")
            if self.exits_after(n, f"{target} {what}"):
                sys.stderr.write(f"crash point: exiting after write {n} ({target} {what})\n")
                sys.stderr.flush()
                os._exit(EXIT_CODE)

    def exits_after(self, n: int, write: str) -> bool:
        """Whether write ``n`` (``<api|etcd> <what>``) is the one to crash after; called once
        per write, in order."""
        kind = write_kind(write)
        if self.crash_after == EACH:
            if kind == "other":
                return False
            transition = (self.last_work, write)
            self.last_work = write
            return transition not in self.crashed
        first_step = kind == "step" and self.intent_recorded
        self.intent_recorded = self.intent_recorded or kind == "status"
        return n == self.crash_after or (first_step and self.crash_after == STEP)


def api_write(method: str, path: str, status: int) -> None:
    """A request the API server answered: counted if it was an accepted write."""
    if POINTS.active and method in API_WRITES and status < 400:
        POINTS.wrote("api", f"{method} {path}")


def etcd_write(endpoint: str, path: str, body: Mapping[str, object]) -> None:
    """A call an etcd member answered 200: counted unless it was a read."""
    if (
        POINTS.active
        and path not in ETCD_READS
        and not (path == "/v3/maintenance/alarm" and body.get("action") == "GET")
    ):
        POINTS.wrote("etcd", f"{path} {endpoint}")


def log_lines(log: Path | None) -> list[str]:
    """A ``KUSTOS_WRITE_LOG``'s lines, ``<n> <target> <what>`` (none if no process wrote yet)."""
    if log is None or not log.exists():
        return []
    return [line for line in log.read_text(encoding="utf-8").splitlines() if line]


def logged_writes(log: Path) -> list[str]:
    """The writes a ``KUSTOS_WRITE_LOG`` holds, in order (none if the process made none)."""
    return [line.split(" ", 1)[1] for line in log_lines(log)]


def transitions(writes: list[str]) -> set[Transition]:
    """Every transition between writes of the work in a log's writes: in a whole ``each`` run,
    one per crash."""
    work = [w for w in writes if write_kind(w) != "other"]
    return set(zip(["", *work], work, strict=False))


def chain_so_far(lines: list[str]) -> tuple[set[Transition], str]:
    """The transitions a chain's operators crashed after, and its last write of the work, from
    its shared log: each operator's writes start again at 1, and every operator that came
    before this one crashed right after its last write."""
    crashed: set[Transition] = set()
    last_work = ""
    previous_work = ""
    for i, line in enumerate(lines):
        _, write = line.split(" ", 1)
        if write_kind(write) == "other":
            continue
        previous_work, last_work = last_work, write
        ends_an_operator = i + 1 == len(lines) or lines[i + 1].split(" ", 1)[0] == "1"
        if ends_an_operator:
            crashed.add((previous_work, write))
    return crashed, last_work


NOT_STEPS = ("/events", "webhookconfigurations/")
"""Writes that are no step of the work: Events, and the webhook configurations every operator
patches as it starts."""


def write_kind(write: str) -> str:
    """``status``, ``step`` or ``other`` (an Event, a webhook configuration) for a logged write,
    ``<api|etcd> <what>``."""
    path = write.split()[-1] if write.startswith("api ") else ""
    if path.endswith("/status"):
        return "status"
    return "other" if any(part in path for part in NOT_STEPS) else "step"


POINTS = CrashPoints.from_env(os.environ)
