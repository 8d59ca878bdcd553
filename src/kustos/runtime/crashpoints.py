"""Crash points: kill the operator right after its Nth write, for the proof suite's crash tests.

``faults.py`` exits after a named step; this counts every write instead, so a test can crash
an operator after write 1, then 2, ... of a whole scenario without knowing its steps. Two
environment variables, read once when the process starts:

* ``KUSTOS_CRASH_AFTER_WRITE=k``: exit (``os._exit(137)``: no cleanup, no lease release, as a
  SIGKILL) right after the k-th write was accepted; ``=step``: right after the first step that
  follows a recorded intent (``STEP``), whatever its number in this run;
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


class CrashPoints:
    """The write counter of one process."""

    def __init__(self, crash_after: int | str | None, log: Path | None) -> None:
        if crash_after != STEP and not (
            (isinstance(crash_after, int) and crash_after >= 1) or crash_after is None
        ):
            raise ValueError(
                f"KUSTOS_CRASH_AFTER_WRITE: {crash_after} is not a write number (1, 2, ...) or step"
            )
        self.crash_after = crash_after
        self.log = log
        self.active = crash_after is not None or log is not None
        self.writes = 0
        self.intent_recorded = False
        self._lock = threading.Lock()  # the etcd client may be used from worker threads

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CrashPoints:
        after, log = env.get("KUSTOS_CRASH_AFTER_WRITE"), env.get("KUSTOS_WRITE_LOG")
        try:
            crash_after = (after if after == STEP else int(after)) if after else None
        except ValueError:
            raise ValueError(
                f"KUSTOS_CRASH_AFTER_WRITE: {after!r} is not a write number (1, 2, ...) or step"
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
        first_step = kind == "step" and self.intent_recorded
        self.intent_recorded = self.intent_recorded or kind == "status"
        return n == self.crash_after or (first_step and self.crash_after == STEP)


POINTS = CrashPoints.from_env(os.environ)


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


def logged_writes(log: Path) -> list[str]:
    """The writes a ``KUSTOS_WRITE_LOG`` holds, in order (none if the process made none)."""
    if not log.exists():
        return []
    return [line.split(" ", 1)[1] for line in log.read_text(encoding="utf-8").splitlines() if line]


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
