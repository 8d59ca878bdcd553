"""Rotating an EtcdCluster's CA without downtime: the phases as data (pure).

etcd reloads its own certificate at every handshake, but it builds the pools of CAs it
trusts (``--trusted-ca-file``, ``--peer-trusted-ca-file``) once, when it starts
(``TLSInfo.ServerConfig``/``ClientConfig`` in etcd's client/pkg/transport). A member
trusts a new CA only after a restart, so every phase is a roll of the members one at a
time, gated by health: the planner's certificate roll (``PodView.tls_stale``).

1. ``Trust``: a new CA is made. Every member, and the client Secret the operator issues,
   trusts the bundle old + new; leaves are still signed by the old CA.
2. ``Reissue``: the new CA signs. Every member restarts onto a leaf from it, the client
   certificate is reissued; the bundle stays old + new, so old and new leaves meet.
3. ``Drop``: the old CA leaves every bundle.

The CA Secret is the record a restarted operator continues from: ``next.crt``/``next.key``
during Trust, ``previous.crt`` during Reissue, and the ``kustos.dev/ca-rotation``
annotation (timing) until Drop has rolled every member.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from kustos.runtime.times import parse_rfc3339, rfc3339

ROTATE_CA_ANNOTATION = "kustos.dev/rotate-ca"
"""Set (or change) this annotation on an EtcdCluster to rotate its CA now."""
RECORD_ANNOTATION = "kustos.dev/ca-rotation"
"""On the CA Secret: the last rotation's request, reason and timing, as JSON."""


class Phase(StrEnum):
    TRUST = "Trust"
    REISSUE = "Reissue"
    DROP = "Drop"


@dataclass(frozen=True)
class Timing:
    """When a rotation started, entered its phase, dropped the old CA and ended (RFC 3339)."""

    request: str = ""  # the rotate-ca annotation's value this rotation answered
    reason: str = ""
    started: str = ""
    phase_started: str = ""
    old_ca_dropped: str = ""
    completed: str = ""

    def dump(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def load(cls, raw: str | None) -> Timing:
        try:
            data = json.loads(raw or "{}")
        except ValueError:
            return cls()
        known = {k: str(v) for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class CARecord:
    """The CA Secret as the rotation sees it: CAs by ``tls.ca_id``."""

    current: str  # the CA that signs
    next: str | None = None  # made, trusted, not yet signing (Trust)
    previous: str | None = None  # no longer signing, still trusted (Reissue)
    timing: Timing = Timing()

    @property
    def phase(self) -> Phase | None:
        if self.next is not None:
            return Phase.TRUST
        if self.previous is not None:
            return Phase.REISSUE
        if self.timing.started and not self.timing.completed:
            return Phase.DROP
        return None

    @property
    def bundle(self) -> frozenset[str]:
        """The CAs every member and client must trust now."""
        return frozenset(ca for ca in (self.current, self.next, self.previous) if ca is not None)


@dataclass(frozen=True)
class MemberTrust:
    """What one member runs on."""

    name: str
    settled: bool  # running on a Secret issued for this very pod
    bundle: frozenset[str]  # the CAs its ca.crt trusts
    leaf_issuer: str | None  # the CA that signed its certificate


@dataclass(frozen=True)
class Start:
    """Make a new CA and have it trusted next to the old one."""

    reason: str


@dataclass(frozen=True)
class Promote:
    """Every member trusts both CAs: the new one signs from now on."""


@dataclass(frozen=True)
class DropOld:
    """Every member runs on a leaf of the new CA: the old one leaves the bundle."""


@dataclass(frozen=True)
class Finish:
    """Every member trusts the new CA only: record the end."""


@dataclass(frozen=True)
class Wait:
    """The phase's roll is under way (the planner restarts the members named)."""

    members: tuple[str, ...]


Step = Start | Promote | DropOld | Finish | Wait


def rotation_due(not_before: datetime, not_after: datetime, now: datetime, leaf_lifetime: timedelta,
                 renew_before_percent: int) -> str | None:  # fmt: skip
    """Why the CA must rotate on schedule, or None.

    Before its leaves would be cut short (it outlives a new leaf by less than a leaf
    lifetime), or once less than ``renew_before_percent`` of its own lifetime is left.
    """
    left = not_after - now
    if left < 2 * leaf_lifetime:
        return f"the CA expires at {rfc3339(not_after)}, within two certificate lifetimes"
    if left <= (not_after - not_before) * (renew_before_percent / 100):
        return f"the CA expires at {rfc3339(not_after)}, with less than {renew_before_percent}% of it left"
    return None


def settled(record: CARecord, member: MemberTrust) -> bool:
    """A member is done with the phase: it trusts the bundle and its leaf is the signer's."""
    return member.settled and member.bundle == record.bundle and member.leaf_issuer == record.current


def plan(record: CARecord, members: list[MemberTrust], request: str, due: str | None) -> Step | None:
    """The rotation's next step: one change of the CA Secret, or a roll to wait for."""
    phase = record.phase
    if phase is None:
        if request and request != record.timing.request:
            return Start(f"asked for with {ROTATE_CA_ANNOTATION}={request}")
        return Start(due) if due is not None else None
    waiting = tuple(m.name for m in members if not settled(record, m))
    if waiting:
        return Wait(waiting)
    if phase is Phase.TRUST:
        return Promote()
    if phase is Phase.REISSUE:
        return DropOld()
    return Finish()


def timing_after(step: Step, timing: Timing, request: str, now: datetime) -> Timing:
    """The record once ``step`` is taken."""
    stamp = rfc3339(now)
    if isinstance(step, Start):
        request = request or timing.request
        return Timing(request=request, reason=step.reason, started=stamp, phase_started=stamp)
    if isinstance(step, Promote):
        return replace(timing, phase_started=stamp)
    if isinstance(step, DropOld):
        return replace(timing, phase_started=stamp, old_ca_dropped=stamp)
    if isinstance(step, Finish):
        return replace(timing, completed=stamp)
    return timing


def duration(timing: Timing) -> timedelta | None:
    """How long a finished rotation took."""
    started, completed = parse_rfc3339(timing.started), parse_rfc3339(timing.completed)
    return completed - started if started and completed else None
