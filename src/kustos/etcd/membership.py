"""Membership calls to an etcd cluster, a removal guarded by the quorum arithmetic (``quorum``).

Given endpoints (with what each said in its status) and TLS material, never an
EtcdCluster: the EtcdCluster controller uses these, and node maintenance will use
them to remove the member of a dead control-plane node. Imports no controller.

A call goes to the leader first (a follower forwards, but the leader answers at
once), then to any other voting member; learners refuse membership calls.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from kustos.etcd.client import (
    EtcdClient,
    EtcdError,
    EtcdTLS,
    LearnerNotReady,
    MemberAddResult,
    MemberList,
    Status,
    UnhealthyCluster,
    cluster_health,
)
from kustos.etcd.quorum import quorum, removal_keeps_quorum

log = logging.getLogger(__name__)

CALL_TIMEOUT = 5.0
LIST_TIMEOUT = 2.0

T = TypeVar("T")


def _voters_first(statuses: Mapping[str, Status]) -> list[str]:
    """Voting members, the leader first: where a membership call is answered at once."""
    urls = [u for u in statuses if not statuses[u].is_learner]
    return sorted(urls, key=lambda u: statuses[u].member_id != statuses[u].leader_id)


async def leader_call(
    statuses: Mapping[str, Status], tls: EtcdTLS | None, call: Callable[[EtcdClient], Awaitable[T]],
    raise_for: type[EtcdError] | None = None, raise_if_every: type[EtcdError] | None = None,
) -> T | bool | None:  # fmt: skip
    """Send ``call`` to the leader (or any healthy voter): its result (True for None), or None
    when every one refused (logged). ``raise_for`` errors are raised to the caller at once;
    ``raise_if_every`` errors only when every voter answered with one (the last is raised)."""
    voters = _voters_first(statuses)
    refusals: list[EtcdError] = []
    for url in voters:
        try:
            async with EtcdClient(url, tls, timeout=CALL_TIMEOUT) as client:
                result = await call(client)
                return result if result is not None else True
        except EtcdError as err:
            if raise_for is not None and isinstance(err, raise_for):
                raise
            if raise_if_every is not None and isinstance(err, raise_if_every):
                refusals.append(err)
            log.warning("etcd call through %s failed: %s", url, err)
    if voters and len(refusals) == len(voters):
        raise refusals[-1]
    return None


async def statuses_of(
    endpoints: Sequence[str], tls: EtcdTLS | None, timeout: float = LIST_TIMEOUT
) -> dict[str, Status]:
    """Every endpoint that answered its status (with or without errors), asked concurrently."""
    answers = await cluster_health(endpoints, tls, timeout)
    return {url: s for url, s in answers.items() if isinstance(s, Status)}


async def member_list_at(url: str, tls: EtcdTLS | None, linearizable: bool = True) -> MemberList | None:
    """The membership as the member at ``url`` lists it; None when it cannot say.

    ``linearizable=False``: the membership the member itself has applied, answered at once,
    even while the cluster elects a leader (a linearizable list waits for one)."""
    try:
        async with EtcdClient(url, tls, timeout=LIST_TIMEOUT) as client:
            return await client.member_list(linearizable)
    except (EtcdError, OSError, TimeoutError):
        return None


async def member_list(
    statuses: Mapping[str, Status],
    tls: EtcdTLS | None,
    asked: tuple[str, asyncio.Future[MemberList | None]] | None = None,
    linearizable: bool = True,
) -> MemberList | None:
    """The membership, from the first member that can say (voters first: a learner refuses).

    ``asked``: a member's list already on its way (``member_list_at``, asked beside the
    statuses), taken first when that member answered its status, and dropped otherwise."""
    order = sorted(statuses, key=lambda u: statuses[u].is_learner)
    if asked is not None:
        url, answer = asked
        if url not in statuses:
            answer.cancel()
        elif (found := await answer) is not None:
            return found
        order = [u for u in order if u != url]
    for url in order:
        if (found := await member_list_at(url, tls, linearizable)) is not None:
            return found
    return None


def why_no_member_list(endpoints: Sequence[str], statuses: Mapping[str, Status]) -> str:
    """Why ``member_list`` found nothing: no member answered at all, or none could list the
    membership (a linearizable read needs a leader)."""
    if not statuses:
        return f"no etcd member answered at {', '.join(endpoints)}"
    return (
        f"etcd at {', '.join(sorted(statuses))} answered but could not list its members "
        "(no leader: quorum lost, or an election under way)"
    )


async def add_member(
    statuses: Mapping[str, Status], tls: EtcdTLS | None, peer_url: str, learner: bool = True
) -> MemberAddResult | None:
    """Add a member (a learner by default: one that never starts then costs no quorum).

    etcd checks an add on the member that receives it (``mayAddMember``: connected to enough
    voters for 5 s), then proposes it through the leader; so a voter that refuses is not the
    last word. A leader can keep refusing while its streams are up: one failed pipeline dial
    (a peer's DNS lookup timed out under load) marks that peer inactive until a stream
    reconnects. A follower that sees every peer then takes the add.

    Raises ``UnhealthyCluster`` when every voter refused before proposing: nothing was added,
    and the caller may retry the same member. None: a call failed otherwise (the add may or
    may not have happened)."""
    result = await leader_call(
        statuses, tls, lambda c: c.member_add([peer_url], is_learner=learner),
        raise_if_every=UnhealthyCluster,
    )  # fmt: skip
    return result if isinstance(result, MemberAddResult) else None


async def promote(statuses: Mapping[str, Status], tls: EtcdTLS | None, member_id: int) -> bool:
    """Make a learner a voter; raises LearnerNotReady while it is not in sync."""
    return (
        await leader_call(statuses, tls, lambda c: c.member_promote(member_id), LearnerNotReady) is not None
    )


async def update_peer_url(
    statuses: Mapping[str, Status], tls: EtcdTLS | None, member_id: int, url: str
) -> bool:
    return await leader_call(statuses, tls, lambda c: c.member_update(member_id, [url])) is not None


async def remove(statuses: Mapping[str, Status], tls: EtcdTLS | None, member_id: int) -> bool:
    """Remove a member (the caller has checked that this keeps quorum)."""
    return await leader_call(statuses, tls, lambda c: c.member_remove(member_id)) is not None


async def move_leader(statuses: Mapping[str, Status], tls: EtcdTLS | None, to_id: int) -> bool:
    return await leader_call(statuses, tls, lambda c: c.move_leader(to_id)) is not None


async def downgrade(
    statuses: Mapping[str, Status], tls: EtcdTLS | None, action: str, target: str = ""
) -> bool:
    """etcd's downgrade API (VALIDATE, ENABLE, CANCEL) through the leader."""
    return await leader_call(statuses, tls, lambda c: c.downgrade(action, target)) is not None


def removal_refusal(members: MemberList, statuses: Mapping[str, Status], member_id: int) -> str | None:
    """Why removing ``member_id`` would cost quorum (None: it would not). A member is healthy
    when it answered its status without errors."""
    victim = members.by_id(member_id)
    if victim is None:
        return None
    healthy = {s.member_id for s in statuses.values() if not s.errors}
    voters = members.voters
    healthy_after = sum(1 for m in voters if m.id in healthy and m.id != member_id)
    if removal_keeps_quorum(len(voters), healthy_after, victim.is_learner):
        return None
    return (
        f"removing member {member_id:x} would leave {healthy_after} healthy of {len(voters) - 1} "
        f"voting members; {quorum(len(voters) - 1)} are needed for quorum"
    )


async def remove_keeping_quorum(endpoints: Sequence[str], tls: EtcdTLS | None, member_id: int) -> str | None:
    """Remove ``member_id`` if that keeps quorum, asking ``endpoints`` first: None once removed
    (or already gone), else why not. For callers that hold no EtcdCluster (node maintenance)."""
    statuses = await statuses_of(endpoints, tls)
    members = await member_list(statuses, tls)
    if members is None:
        return "no member answered with the membership"
    if members.by_id(member_id) is None:
        return None
    refusal = removal_refusal(members, statuses, member_id)
    if refusal is not None:
        return refusal
    healthy = {u: s for u, s in statuses.items() if not s.errors}
    return None if await remove(healthy, tls, member_id) else f"every member refused to remove {member_id:x}"


__all__ = [
    "add_member",
    "downgrade",
    "leader_call",
    "member_list",
    "move_leader",
    "promote",
    "removal_refusal",
    "remove",
    "remove_keeping_quorum",
    "statuses_of",
    "update_peer_url",
    "why_no_member_list",
]
