"""Membership: the quorum arithmetic that guards a removal, and the leader-first call order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kustos.etcd import membership
from kustos.etcd.client import EtcdClient, Member, MemberList, Status, UnhealthyCluster
from kustos.etcd.membership import removal_refusal
from kustos.etcd.quorum import quorum, removal_keeps_quorum


def status(member_id: int, leader_id: int, learner: bool = False, errors: tuple[str, ...] = ()) -> Status:
    return Status(
        cluster_id=1, member_id=member_id, leader_id=leader_id, raft_term=2, raft_index=10,
        raft_applied_index=10, revision=5, db_size=0, db_size_in_use=0, version="3.6.16",
        is_learner=learner, errors=errors,
    )  # fmt: skip


def members(n: int, learners: int = 0) -> MemberList:
    listed = [
        Member(i, f"e-{i}", (f"http://e-{i}:2380",), (f"http://e-{i}:2379",), i >= n)
        for i in range(n + learners)
    ]
    return MemberList(cluster_id=1, member_id=0, members=listed)


def test_quorum_is_a_majority() -> None:
    assert [quorum(n) for n in range(1, 8)] == [1, 2, 2, 3, 3, 4, 4]


def test_removing_a_learner_always_keeps_quorum() -> None:
    assert removal_keeps_quorum(1, 0, learner=True)
    assert removal_keeps_quorum(3, 0, learner=True)


def test_the_last_voter_is_never_removed() -> None:
    assert not removal_keeps_quorum(1, 0)


@given(st.integers(min_value=2, max_value=9), st.data())
def test_a_removal_keeps_quorum_exactly_when_the_healthy_rest_is_a_majority(
    voters: int, data: st.DataObject
) -> None:
    healthy_after = data.draw(st.integers(min_value=0, max_value=voters - 1))
    assert removal_keeps_quorum(voters, healthy_after) == (healthy_after > (voters - 1) / 2)


def test_removing_a_dead_member_of_three_with_two_healthy_is_allowed() -> None:
    said = {"http://e-0:2379": status(0, 0), "http://e-1:2379": status(1, 0)}
    assert removal_refusal(members(3), said, 2) is None


def test_removing_a_healthy_member_while_another_is_dead_is_refused() -> None:
    said = {"http://e-0:2379": status(0, 0), "http://e-1:2379": status(1, 0)}
    refusal = removal_refusal(members(3), said, 1)
    assert refusal is not None and "quorum" in refusal


def test_a_member_that_answers_with_errors_does_not_count_as_healthy() -> None:
    said = {"http://e-0:2379": status(0, 0), "http://e-1:2379": status(1, 0, errors=("NOSPACE",))}
    assert removal_refusal(members(3), said, 2) is not None


def test_an_unknown_member_is_no_refusal() -> None:
    assert removal_refusal(members(3), {}, 42) is None


def test_calls_go_to_the_leader_first_and_never_to_a_learner() -> None:
    said = {
        "http://e-0:2379": status(0, 1),
        "http://e-3:2379": status(3, 1, learner=True),
        "http://e-1:2379": status(1, 1),
    }
    assert membership._voters_first(said) == ["http://e-1:2379", "http://e-0:2379"]


def test_a_call_that_no_member_answers_is_none() -> None:
    async def call(client: object) -> None:
        raise AssertionError("no member to call")

    assert asyncio.run(membership.leader_call({}, None, call)) is None


SAID = {"http://e-0:2379": status(0, 0), "http://e-1:2379": status(1, 0)}


def test_a_refused_add_is_asked_of_the_next_voter_and_raised_only_when_every_voter_refused() -> None:
    # etcd checks an add on the member that receives it: a leader that lost sight of a peer
    # refuses, a follower that sees them all takes it.
    def add(refusing: set[str]) -> Callable[[EtcdClient], Awaitable[str]]:
        async def call(client: EtcdClient) -> str:
            if client.endpoint in refusing:
                raise UnhealthyCluster("etcdserver: unhealthy cluster", 14, client.endpoint)
            return f"added through {client.endpoint}"

        return call

    taken = asyncio.run(membership.leader_call(SAID, None, add({"http://e-0:2379"}),
                                               raise_if_every=UnhealthyCluster))  # fmt: skip
    assert taken == "added through http://e-1:2379"
    with pytest.raises(UnhealthyCluster):
        asyncio.run(membership.leader_call(SAID, None, add(set(SAID)), raise_if_every=UnhealthyCluster))


def test_removal_through_endpoints_that_do_not_answer_says_so() -> None:
    refusal = asyncio.run(membership.remove_keeping_quorum(["http://127.0.0.1:1"], None, 5))
    assert refusal == "no member answered with the membership"


def test_no_member_list_says_whether_anyone_answered_or_only_no_leader_could() -> None:
    urls = ["https://10.0.0.1:2379", "https://10.0.0.2:2379"]
    assert membership.why_no_member_list(urls, {}) == f"no etcd member answered at {', '.join(urls)}"
    why = membership.why_no_member_list(urls, {urls[1]: status(2, leader_id=0)})
    assert why.startswith(f"etcd at {urls[1]} answered but could not list its members")
    assert "no leader" in why


@pytest.fixture
def listed_by(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Members asked for the membership; e-1 cannot say (no leader), the others list it."""
    asked: list[str] = []

    async def member_list_at(url: str, tls: object, linearizable: bool = True) -> MemberList | None:
        asked.append(url)
        return None if url == "http://e-1:2379" else members(3)

    monkeypatch.setattr(membership, "member_list_at", member_list_at)
    return asked


async def test_a_list_asked_beside_the_statuses_is_taken_when_its_member_answered(
    listed_by: list[str],
) -> None:
    on_its_way: asyncio.Future[MemberList | None] = asyncio.get_running_loop().create_future()
    on_its_way.set_result(members(3))
    assert await membership.member_list(SAID, None, ("http://e-0:2379", on_its_way)) == members(3)
    assert listed_by == []


async def test_a_list_asked_beside_the_statuses_that_could_not_say_is_not_asked_again(
    listed_by: list[str],
) -> None:
    on_its_way: asyncio.Future[MemberList | None] = asyncio.get_running_loop().create_future()
    on_its_way.set_result(None)
    said = {**SAID, "http://e-2:2379": status(2, 0)}
    assert await membership.member_list(said, None, ("http://e-0:2379", on_its_way)) == members(3)
    assert listed_by == ["http://e-1:2379", "http://e-2:2379"]


async def test_a_list_asked_of_a_member_that_did_not_answer_its_status_is_dropped(
    listed_by: list[str],
) -> None:
    on_its_way: asyncio.Future[MemberList | None] = asyncio.get_running_loop().create_future()
    assert await membership.member_list(SAID, None, ("http://e-2:2379", on_its_way)) == members(3)
    assert on_its_way.cancelled()
    assert listed_by == ["http://e-0:2379"]
