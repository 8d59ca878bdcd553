"""What the snapshot agent reports on its log, and how the controller reads it back (pure).

The agent (``kustos etcd snapshot``) prints one result line, or one error line, as its
last word; the backup controller reads the pod's log and the backup planner decides on
what it says. Both ends read and write these markers here, so they cannot drift.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

RESULT_MARKER = "KUSTOS_RESULT "
ERROR_MARKER = "KUSTOS_ERROR "


@dataclass(frozen=True)
class SnapshotResult:
    location: str
    member: str
    revision: int
    size: int
    sha256: str
    start_time: str
    completion_time: str
    duration_seconds: float
    pruned: list[str] = field(default_factory=list)

    def line(self) -> str:
        return RESULT_MARKER + json.dumps(asdict(self), sort_keys=True)


def parse_result(log: str) -> SnapshotResult | None:
    """The agent's result from its log, or None if it did not get that far."""
    for line in reversed(log.splitlines()):
        if line.startswith(RESULT_MARKER):
            return SnapshotResult(**json.loads(line[len(RESULT_MARKER) :]))
    return None


def parse_error(log: str) -> str | None:
    """The agent's own account of its failure (its last error line), or None."""
    for line in reversed(log.splitlines()):
        if line.startswith(ERROR_MARKER):
            return line[len(ERROR_MARKER) :]
    return None
