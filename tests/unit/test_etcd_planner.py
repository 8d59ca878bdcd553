"""The EtcdCluster planner: quorum is never lost by a planned step, and steps move towards the spec."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from kustos.etcd import planner
from kustos.etcd.planner import MemberView, Observed, PodView, plan, quorum

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(seconds=30)


def observed(members: list[MemberView] | None, pods: list[PodView], size: int, **kwargs: object) -> Observed:
    defaults: dict[str, object] = {
        "cluster": "e", "namespace": "ns", "size": size, "addressing": "podIP", "storage": "emptyDir",
        "failure_timeout": TIMEOUT, "now": NOW, "pods": tuple(pods),
        "members": tuple(members) if members is not None else None,
        "next_index": max((p.index + 1 for p in pods), default=0), "ever_formed": members is not None,
    }  # fmt: skip
    defaults.update(kwargs)
    return Observed(**defaults)  # type: ignore[arg-type]


def healthy_cluster(n: int, leader: int = 0) -> tuple[list[MemberView], list[PodView]]:
    members, pods = [], []
    for i in range(n):
        ip = f"127.1.1.{i + 1}"
        pods.append(PodView(f"e-{i}", i, uid=f"u{i}", ip=ip, running=True, ready=True, member_id=100 + i))
        members.append(MemberView(100 + i, f"e-{i}", f"http://{ip}:2380", healthy=True, leader=i == leader))
    return members, pods


def test_an_empty_cluster_starts_with_a_seed() -> None:
    assert plan(observed(None, [], 3)) == planner.CreateSeed(0)


def test_a_starting_seed_is_waited_for() -> None:
    pod = PodView("e-0", 0, ip="127.1.1.1")
    assert isinstance(plan(observed(None, [pod], 3, next_index=1)), planner.Wait)


def test_a_formed_cluster_that_no_member_answers_has_lost_quorum() -> None:
    _, pods = healthy_cluster(3)
    step = plan(observed(None, pods, 3, ever_formed=True))
    assert isinstance(step, planner.QuorumLost)


def test_growth_creates_the_next_pod_then_adds_it_as_a_learner() -> None:
    members, pods = healthy_cluster(1)
    assert plan(observed(members, pods, 3)) == planner.CreatePod(1)
    pods.append(PodView("e-1", 1, uid="u1", ip="127.1.1.2"))
    assert plan(observed(members, pods, 3)) == planner.AddMember("e-1", "http://127.1.1.2:2380")


def test_dns_growth_adds_the_member_before_its_pod() -> None:
    members, pods = healthy_cluster(1)
    members = [dataclasses.replace(members[0], peer_url="http://e-0.e-peer.ns.svc:2380")]
    step = plan(observed(members, pods, 2, addressing="dns"))
    assert step == planner.AddMember("e-1", "http://e-1.e-peer.ns.svc:2380", True, 1)
    # The operator stopped after the add: the next pass creates the pod the member waits for.
    members.append(MemberView(200, "", "http://e-1.e-peer.ns.svc:2380", learner=True))
    assert plan(observed(members, pods, 2, addressing="dns")) == planner.CreatePod(1)


def test_a_new_member_name_never_reuses_an_index() -> None:
    members, pods = healthy_cluster(2)
    assert plan(observed(members, pods, 3, next_index=7)) == planner.CreatePod(7)


def test_a_running_learner_is_promoted() -> None:
    members, pods = healthy_cluster(2)
    pods.append(PodView("e-2", 2, ip="127.1.1.3", running=True, member_id=300))
    members.append(MemberView(300, "e-2", "http://127.1.1.3:2380", learner=True, healthy=True))
    assert plan(observed(members, pods, 3)) == planner.PromoteMember(300, "e-2")


def test_membership_is_recorded_on_the_pod_first() -> None:
    members, pods = healthy_cluster(3)
    pods[1] = dataclasses.replace(pods[1], member_id=None)
    assert plan(observed(members, pods, 3)) == planner.AnnotatePod("e-1", 101)


def test_a_member_whose_pod_is_gone_is_removed_then_replaced() -> None:
    members, pods = healthy_cluster(3)
    members[2] = dataclasses.replace(members[2], healthy=False)
    step = plan(observed(members, pods[:2], 3))
    assert step == planner.RemoveMember(102, "e-2", "its pod is gone")


def test_a_pvc_member_whose_pod_is_gone_comes_back_on_its_volume() -> None:
    members, pods = healthy_cluster(3)
    members[2] = dataclasses.replace(members[2], healthy=False)
    step = plan(observed(members, pods[:2], 3, storage="pvc"))
    assert step == planner.RecreatePod("e-2", 102)


def test_a_member_back_in_a_new_pod_gets_its_new_peer_url() -> None:
    members, pods = healthy_cluster(3)
    pods[2] = dataclasses.replace(pods[2], ip="127.1.9.9")
    assert plan(observed(members, pods, 3, storage="pvc")) == planner.UpdatePeerURL(
        102, "http://127.1.9.9:2380"
    )


def test_a_removed_members_pod_is_deleted() -> None:
    members, pods = healthy_cluster(3)
    step = plan(observed(members[:2], pods, 2))
    assert step == planner.DeletePod("e-2", "u2", "its member was removed")


def test_an_unhealthy_member_is_replaced_only_after_the_timeout() -> None:
    members, pods = healthy_cluster(3)
    members[1] = dataclasses.replace(members[1], healthy=False)
    recent = observed(members, pods, 3, unhealthy_since={"e-1": NOW - timedelta(seconds=5)})
    assert isinstance(plan(recent), planner.Wait)
    old = observed(members, pods, 3, unhealthy_since={"e-1": NOW - timedelta(seconds=31)})
    assert plan(old) == planner.RemoveMember(
        101, "e-1", "it has been unhealthy longer than the failure timeout"
    )


def test_majority_loss_is_reported_and_nothing_is_touched() -> None:
    members, pods = healthy_cluster(3)
    for i in (1, 2):
        members[i] = dataclasses.replace(members[i], healthy=False)
    long_ago = {m.name: NOW - timedelta(hours=1) for m in members}
    step = plan(observed(members, pods[:1], 3, unhealthy_since=long_ago))
    assert isinstance(step, planner.QuorumLost)


def test_shrinking_removes_the_newest_follower() -> None:
    members, pods = healthy_cluster(5, leader=0)
    assert plan(observed(members, pods, 3)) == planner.RemoveMember(
        104, "e-4", "the cluster is larger than its size"
    )


def test_the_leader_is_never_removed_while_a_follower_can_go() -> None:
    members, pods = healthy_cluster(2, leader=1)
    # e-1 is the newest, but it leads: the older follower goes instead.
    step = plan(observed(members, pods, 1))
    assert step == planner.RemoveMember(100, "e-0", "the cluster is larger than its size")


def test_a_healthy_cluster_of_the_right_size_is_done() -> None:
    members, pods = healthy_cluster(3)
    assert plan(observed(members, pods, 3)) == planner.Done()


# ---- properties -------------------------------------------------------------------------


@st.composite
def cluster_states(draw: st.DrawFn) -> Observed:
    n = draw(st.integers(1, 7))
    size = draw(st.integers(1, 9))
    leader = draw(st.integers(0, n - 1))
    members, pods = healthy_cluster(n, leader)
    for i in range(n):
        if draw(st.booleans()) and draw(st.booleans()):
            members[i] = dataclasses.replace(members[i], healthy=False, leader=False)
        if draw(st.integers(0, 5)) == 0:
            members[i] = dataclasses.replace(members[i], learner=True, leader=False)
    kept_pods = [p for p in pods if draw(st.integers(0, 6)) != 0]
    since = {m.name: NOW - timedelta(seconds=draw(st.integers(0, 120))) for m in members if not m.healthy}
    storage = draw(st.sampled_from(["emptyDir", "pvc"]))
    return observed(members, kept_pods, size, unhealthy_since=since, storage=storage)


@given(cluster_states())
@settings(max_examples=500)
def test_no_planned_step_costs_quorum(o: Observed) -> None:
    assert o.members is not None
    step = plan(o)
    voters = [m for m in o.members if not m.learner]
    healthy = [m for m in voters if m.healthy]
    if len(healthy) < quorum(len(voters)):
        assert isinstance(step, planner.QuorumLost | planner.AnnotatePod)
        return
    if isinstance(step, planner.RemoveMember):
        victim = next(m for m in o.members if m.id == step.member_id)
        if not victim.learner:
            left = [m for m in voters if m.id != victim.id]
            assert sum(1 for m in left if m.healthy) >= quorum(len(left))


@given(cluster_states())
@settings(max_examples=300)
def test_growth_and_shrinking_only_happen_one_member_at_a_time_on_healthy_clusters(o: Observed) -> None:
    assert o.members is not None
    step = plan(o)
    if isinstance(step, planner.AddMember | planner.CreatePod) and not isinstance(step, planner.CreatePod):
        assert all(m.healthy and not m.learner for m in o.members)


# ---- simulation: plans applied to a model cluster converge without losing quorum ---------


class Model:
    """A tiny etcd + Kubernetes in which steps take effect at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.members: dict[int, MemberView] = {}
        self.pods: dict[str, PodView] = {}
        self.next_index = 0
        self.next_id = 1
        self.formed = False

    def observe(self) -> Observed:
        members = tuple(self.members.values()) if self.formed else None
        return observed(list(members) if members is not None else None, list(self.pods.values()), self.size,
                        next_index=self.next_index, ever_formed=self.formed)  # fmt: skip

    def apply(self, step: planner.Step) -> None:
        match step:
            case planner.CreateSeed(index=i) | planner.CreatePod(index=i):
                self.next_index = max(self.next_index, i + 1)
                self.pods[f"e-{i}"] = PodView(f"e-{i}", i, uid=f"u{i}", ip=f"127.1.1.{i + 1}", running=True)
                if isinstance(step, planner.CreateSeed):
                    url = f"http://127.1.1.{i + 1}:2380"
                    self.members[self.next_id] = MemberView(
                        self.next_id, f"e-{i}", url, healthy=True, leader=True
                    )
                    self.next_id += 1
                    self.formed = True
            case planner.AddMember(pod=pod, peer_url=url):
                # The member starts at once (its pod was waiting for this).
                self.members[self.next_id] = MemberView(self.next_id, pod, url, learner=True, healthy=True)
                self.next_id += 1
            case planner.PromoteMember(member_id=i):
                self.members[i] = dataclasses.replace(self.members[i], learner=False)
            case planner.RemoveMember(member_id=i):
                was_leader = self.members.pop(i).leader
                if was_leader and self.members:
                    first = next(iter(self.members))
                    self.members[first] = dataclasses.replace(self.members[first], leader=True)
            case planner.DeletePod(name=name):
                del self.pods[name]
            case planner.AnnotatePod(name=name, member_id=i):
                self.pods[name] = dataclasses.replace(self.pods[name], member_id=i)
            case planner.MoveLeader(from_id=a, to_id=b):
                self.members[a] = dataclasses.replace(self.members[a], leader=False)
                self.members[b] = dataclasses.replace(self.members[b], leader=True)

    def run(self, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            step = plan(self.observe())
            if isinstance(step, planner.Done):
                return
            assert not isinstance(step, planner.QuorumLost | planner.Wait), step
            voters = [m for m in self.members.values() if not m.learner]
            self.apply(step)
            after = [m for m in self.members.values() if not m.learner]
            if self.formed and voters:
                assert sum(m.healthy for m in after) >= quorum(len(after)), "a step lost quorum"
        raise AssertionError("did not converge")


@given(st.lists(st.integers(1, 9), min_size=1, max_size=5))
@settings(max_examples=100, deadline=None)
def test_any_sequence_of_sizes_converges_one_member_at_a_time(sizes: list[int]) -> None:
    model = Model(sizes[0])
    for size in sizes:
        model.size = size
        model.run()
        voters = [m for m in model.members.values() if not m.learner]
        assert len(voters) == size and all(m.healthy for m in voters)
        assert len(model.pods) == size
        names = [p.name for p in model.pods.values()]
        assert len(set(names)) == len(names)
