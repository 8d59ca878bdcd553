"""The EtcdCluster planner: quorum is never lost by a planned step, and steps move towards the spec."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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


def test_a_lost_quorum_is_looked_at_again_soon_while_a_member_just_started_on_its_volume() -> None:
    """Members back on their volumes restore quorum once their etcd elects a leader, which no pod
    event announces: the status says so within half a second, not at the next 2 s look."""
    _, pods = healthy_cluster(3)
    settled = [dataclasses.replace(p, running_since=NOW - timedelta(minutes=5)) for p in pods]
    quiet = plan(observed(None, settled, 3, ever_formed=True, storage="pvc"))
    assert isinstance(quiet, planner.QuorumLost) and quiet.seconds == 2.0
    settled[1] = dataclasses.replace(settled[1], running_since=NOW - timedelta(seconds=1))
    recovering = plan(observed(None, settled, 3, ever_formed=True, storage="pvc"))
    assert isinstance(recovering, planner.QuorumLost) and recovering.seconds <= 0.5


def test_a_member_whose_etcd_just_restarted_is_looked_at_again_soon_one_long_down_every_2_s() -> None:
    """A member pod recreated on its volume serves within a second of its etcd's start, and no
    pod event says when (the readiness probe's comes up to 2 s later): the cluster is seen
    whole again within half a second, while a member down for minutes is not polled that often."""
    members, pods = healthy_cluster(3)
    members[1] = dataclasses.replace(members[1], healthy=False)
    pods = [dataclasses.replace(p, running_since=NOW - timedelta(minutes=5)) for p in pods]
    pods[1] = dataclasses.replace(pods[1], running_since=NOW - timedelta(seconds=1))
    step = plan(observed(members, pods, 3))
    assert isinstance(step, planner.Wait) and step.seconds <= 0.5
    # Most restarted members serve within their etcd's first second: looked at most often then.
    pods[1] = dataclasses.replace(pods[1], running_since=NOW - timedelta(seconds=5))
    later = plan(observed(members, pods, 3))
    assert isinstance(later, planner.Wait) and step.seconds < later.seconds < 2.0
    pods[1] = dataclasses.replace(pods[1], running_since=NOW - timedelta(minutes=5))
    step = plan(observed(members, pods, 3))
    assert isinstance(step, planner.Wait) and step.seconds == 2.0
    pods[1] = dataclasses.replace(pods[1], running_since=NOW - timedelta(seconds=1))
    growing = plan(observed(members, pods, 4))  # a member short waits for it the same way
    assert isinstance(growing, planner.Wait) and growing.seconds <= 0.5, growing


def test_a_learner_not_caught_up_is_asked_again_soon_only_while_its_etcd_has_just_started() -> None:
    """A fresh learner catches up within heartbeats; one receiving a large snapshot may take
    minutes, and is not asked four times a second all that while."""
    members, pods = healthy_cluster(3)
    pods[2] = dataclasses.replace(pods[2], running_since=NOW - timedelta(seconds=1))
    assert planner.learner_look(observed(members, pods, 3), "e-2") <= 0.25
    pods[2] = dataclasses.replace(pods[2], running_since=NOW - timedelta(minutes=2))
    assert planner.learner_look(observed(members, pods, 3), "e-2") == 1.0
    assert planner.learner_look(observed(members, pods, 3), "gone") == 1.0


def test_a_members_own_list_during_an_election_brings_the_leader_back_and_does_nothing_else() -> None:
    """The leader's pod deleted: the survivors elect for a second, and a member's own (serializable)
    list is all the pass has. It brings the leader back on its volume; with nothing to bring back
    the pass does not act on that list (a dead member is removed on a leader's word only)."""
    members, pods = healthy_cluster(3, leader=0)
    members[0] = dataclasses.replace(members[0], healthy=False, leader=False)
    electing = observed(members, pods[1:], 3, storage="pvc", members_confirmed=False)
    assert plan(electing) == planner.RecreatePod("e-0", 100)
    # e-0 failed long ago: with quorum rule 7 would remove it, which needs the leader's list.
    dead = dataclasses.replace(electing, unhealthy_since={"e-0": NOW - 2 * TIMEOUT})
    assert planner.back_on_volumes(dead) is None
    assert isinstance(plan(dead), planner.Wait)
    assert isinstance(plan(dataclasses.replace(dead, members_confirmed=True)), planner.RemoveMember)


def test_after_a_quorum_loss_every_member_comes_back_on_its_volume_before_any_is_annotated() -> None:
    """Two of three pods deleted: the first member back (and answering, with the survivor a quorum
    again) is annotated only once the second is recreated, so the second is not a pass later."""
    members, pods = healthy_cluster(3)
    back = dataclasses.replace(pods[0], uid="new", member_id=None)
    step = plan(observed(members, [back, pods[2]], 3, storage="pvc"))
    assert step == planner.RecreatePod("e-1", 101)
    assert plan(observed(members, [back, pods[1], pods[2]], 3, storage="pvc")) == planner.AnnotatePod(
        "e-0", 100
    )


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


def test_a_stopping_pods_member_is_timed_from_the_end_of_its_grace_period() -> None:
    """Deleted with its volume kept, it comes back on it once the pod is gone, however long the
    pod takes to stop within its grace period; one held past it is failed like any other."""
    members, pods = healthy_cluster(3)
    members[1] = dataclasses.replace(members[1], healthy=False)
    stopping = dataclasses.replace(pods[1], deleting=True, deletion_deadline=NOW + timedelta(seconds=20))
    slow = observed(members, [pods[0], stopping, pods[2]], 3, storage="pvc")
    assert isinstance(plan(slow), planner.Wait)
    held = dataclasses.replace(stopping, deletion_deadline=NOW - timedelta(seconds=31))
    assert plan(observed(members, [pods[0], held, pods[2]], 3, storage="pvc")) == planner.RemoveMember(
        101, "e-1", "it has been unhealthy longer than the failure timeout"
    )
    gone = observed(members, [pods[0], pods[2]], 3, storage="pvc", unhealthy_since={"e-1": NOW})
    assert plan(gone) == planner.RecreatePod("e-1", 101)


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
        # Touch nothing, except bring a PVC-backed member back on its own volume.
        assert isinstance(step, planner.QuorumLost | planner.AnnotatePod | planner.RecreatePod)
        if isinstance(step, planner.RecreatePod):
            assert o.storage == "pvc"
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

    def __init__(self, size: int, storage: str = "emptyDir", version: str | None = None) -> None:
        self.size = size
        self.storage = storage
        self.version = version
        self.leader_changes: list[tuple[str, str | None]] = []  # (leader pod, its version) per step
        self.members: dict[int, MemberView] = {}
        self.pods: dict[str, PodView] = {}
        self.next_index = 0
        self.next_id = 1
        self.formed = False

    def observe(self) -> Observed:
        members = tuple(self.members.values()) if self.formed else None
        if members is not None and not any(m.healthy for m in members):
            members = None  # nobody answers
        return observed(list(members) if members is not None else None, list(self.pods.values()), self.size,
                        next_index=self.next_index, ever_formed=self.formed, storage=self.storage,
                        version=self.version,
                        recorded_members=tuple((m.name, m.id) for m in self.members.values()))  # fmt: skip

    def apply(self, step: planner.Step) -> None:
        match step:
            case planner.CreateSeed(index=i) | planner.CreatePod(index=i):
                self.next_index = max(self.next_index, i + 1)
                self.pods[f"e-{i}"] = PodView(
                    f"e-{i}", i, uid=f"u{i}", ip=f"127.1.1.{i + 1}", running=True, version=self.version
                )
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
                for i, m in self.members.items():  # a stopped member's process is gone with its pod
                    if m.name == name:
                        self.members[i] = dataclasses.replace(m, healthy=False, leader=False)
            case planner.RecreatePod() as back:
                for name, i in back.members:
                    index = int(name.rsplit("-", 1)[1])
                    ip = f"127.1.1.{index + 1}"
                    self.pods[name] = PodView(
                        name, index, uid=f"u{index}b", ip=ip, running=True, member_id=i, version=self.version
                    )
                    self.members[i] = dataclasses.replace(self.members[i], healthy=True)
            case planner.AnnotatePod(name=name, member_id=i):
                self.pods[name] = dataclasses.replace(self.pods[name], member_id=i)
            case planner.MoveLeader(from_id=a, to_id=b):
                self.members[a] = dataclasses.replace(self.members[a], leader=False)
                self.members[b] = dataclasses.replace(self.members[b], leader=True)

    def roll(self, outdated: Callable[[PodView], bool], max_steps: int = 300) -> None:
        """Plan and apply until Done, checking at every step what a rolling change promises:
        never more than one member away from its place, the leader last, quorum kept (with
        PVC storage a restart briefly costs a member by design)."""
        for _ in range(max_steps):
            step = plan(self.observe())
            if isinstance(step, planner.Done):
                return
            assert not isinstance(step, planner.QuorumLost | planner.UpgradeHalted), step
            if isinstance(step, planner.Wait):
                continue
            assert len(self.members) <= self.size + 1
            pending = [p for p in self.pods.values() if outdated(p)]
            if isinstance(step, planner.RemoveMember | planner.DeletePod) and len(pending) > 1:
                assert not any(m.leader and m.name == step.name for m in self.members.values()), step
            self.apply(step)
            voters = [m for m in self.members.values() if not m.learner]
            if self.storage != "pvc":
                assert sum(m.healthy for m in voters) >= quorum(len(voters)), "a step lost quorum"
            heir = next((m for m in self.members.values() if m.healthy and not m.learner), None)
            if heir is not None and not any(m.leader for m in self.members.values()):
                self.members[heir.id] = dataclasses.replace(heir, leader=True)  # an election
        raise AssertionError("the rolling change did not converge")

    def run(self, max_steps: int = 200) -> None:
        for _ in range(max_steps):
            step = plan(self.observe())
            if isinstance(step, planner.Done):
                return
            assert not isinstance(step, planner.QuorumLost | planner.Wait), step
            voters = [m for m in self.members.values() if not m.learner]
            if not any(m.leader for m in self.members.values()) and voters:
                first = next(m for m in self.members.values() if m.healthy and not m.learner)
                self.members[first.id] = dataclasses.replace(first, leader=True)  # an election
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


def _leader_version(model: Model) -> str | None:
    leader = next(m for m in model.members.values() if m.leader)
    return model.pods[leader.name].version


@given(
    size=st.integers(1, 7),
    storage=st.sampled_from(["emptyDir", "pvc"]),
    leader=st.integers(0, 6),
)
@settings(max_examples=100, deadline=None)
def test_a_rolling_upgrade_converges_one_member_at_a_time_leader_last(
    size: int, storage: str, leader: int
) -> None:
    model = Model(size, storage, version="3.5.35")
    model.run()
    start = next(m for m in model.members.values() if m.leader)
    model.members[start.id] = dataclasses.replace(start, leader=False)
    chosen = list(model.members.values())[leader % size]
    model.members[chosen.id] = dataclasses.replace(chosen, leader=True)
    model.version = "3.6.16"
    model.roll(lambda p: p.version == "3.5.35")
    assert sorted(p.version for p in model.pods.values()) == ["3.6.16"] * size
    assert len(model.members) == size and all(m.healthy for m in model.members.values())


def test_a_member_failing_on_the_new_version_halts_the_upgrade() -> None:
    members, pods = healthy_cluster(3)
    pods = [dataclasses.replace(p, version="3.6.16" if p.index == 2 else "3.5.35") for p in pods]
    members[2] = dataclasses.replace(members[2], healthy=False)
    since = {"e-2": NOW - TIMEOUT - timedelta(seconds=1)}
    step = plan(observed(members, pods, 3, version="3.6.16", unhealthy_since=since))
    assert isinstance(step, planner.UpgradeHalted) and "e-2" in step.message
    # Setting the version back is the way out: the failed member is then simply replaced.
    step = plan(observed(members, pods, 3, version="3.5.35", unhealthy_since=since))
    assert isinstance(step, planner.RemoveMember) and step.name == "e-2"


def test_pvc_members_restart_in_place_followers_first() -> None:
    members, pods = healthy_cluster(3, leader=0)
    pods = [dataclasses.replace(p, version="3.5.35") for p in pods]
    step = plan(observed(members, pods, 3, storage="pvc", version="3.6.16"))
    assert step == planner.DeletePod("e-1", "u1", "restarting it on etcd 3.6.16")


def test_the_outdated_leader_hands_over_to_an_upgraded_member_before_it_goes() -> None:
    members, pods = healthy_cluster(3, leader=0)
    pods = [dataclasses.replace(p, version="3.5.35" if p.index == 0 else "3.6.16") for p in pods]
    step = plan(observed(members, pods, 3, storage="pvc", version="3.6.16"))
    assert step == planner.MoveLeader(100, 101)


def test_pvc_members_come_back_on_their_volumes_even_without_quorum_all_at_once() -> None:
    """Each is the same member on its own data: none waits a pass for another to come back."""
    members, pods = healthy_cluster(3)
    members = [dataclasses.replace(m, healthy=m.name == "e-0", leader=False) for m in members]
    step = plan(observed(members, pods[:1], 3, storage="pvc"))
    assert isinstance(step, planner.RecreatePod) and step.members == (("e-1", 101), ("e-2", 102))
    # Nobody answers at all (every pod was deleted): the recorded members come back.
    recorded = (("e-0", 100), ("e-1", 101), ("e-2", 102))
    step = plan(observed(None, [], 3, storage="pvc", ever_formed=True, recorded_members=recorded))
    assert isinstance(step, planner.RecreatePod) and step.members == recorded
    # With emptyDir there is nothing to come back to: quorum loss is reported.
    assert isinstance(plan(observed(members, pods[:1], 3)), planner.QuorumLost)


# ---- adoption: original members replaced by pods one at a time ------------------------------


def adopted_cluster(n: int, leader: int = 0) -> tuple[list[MemberView], frozenset[int]]:
    members = [
        MemberView(900 + i, f"orig-{i}", f"http://127.9.9.{i + 1}:2380", healthy=True, leader=i == leader)
        for i in range(n)
    ]
    return members, frozenset(m.id for m in members)


def test_original_members_are_not_removed_for_lack_of_a_pod() -> None:
    members, external = adopted_cluster(3)
    step = plan(observed(members, [], 3, external_ids=external, next_index=0))
    assert step == planner.CreatePod(0), "grow one past size first"


def test_with_one_pod_too_many_an_original_follower_goes_before_the_original_leader() -> None:
    members, external = adopted_cluster(3, leader=0)
    pod = PodView("e-0", 0, uid="u0", ip="127.1.1.1", running=True, ready=True, member_id=100)
    members.append(MemberView(100, "e-0", "http://127.1.1.1:2380", healthy=True))
    step = plan(observed(members, [pod], 3, external_ids=external))
    assert isinstance(step, planner.RemoveMember) and step.member_id in (901, 902)


def test_the_original_leader_hands_leadership_to_a_pod_before_it_goes() -> None:
    members, external = adopted_cluster(1, leader=0)
    pods = []
    for i in range(3):
        pods.append(PodView(f"e-{i}", i, uid=f"u{i}", ip=f"127.1.1.{i + 1}", running=True, ready=True,
                            member_id=100 + i))  # fmt: skip
        members.append(MemberView(100 + i, f"e-{i}", f"http://127.1.1.{i + 1}:2380", healthy=True))
    step = plan(observed(members, pods, 3, external_ids=external))
    assert isinstance(step, planner.MoveLeader) and step.from_id == 900 and step.to_id in (100, 101, 102)


@settings(max_examples=200)
@given(originals=st.integers(1, 5), pods=st.integers(0, 5), size=st.integers(1, 5), leader=st.integers(0, 9))
def test_adoption_never_costs_quorum_nor_exceeds_size_plus_one(
    originals: int, pods: int, size: int, leader: int
) -> None:
    members, external = adopted_cluster(originals, leader=leader if leader < originals else -1)
    views = []
    for i in range(pods):
        views.append(PodView(f"e-{i}", i, uid=f"u{i}", ip=f"127.1.1.{i + 1}", running=True, ready=True,
                             member_id=100 + i))  # fmt: skip
        members.append(MemberView(100 + i, f"e-{i}", f"http://127.1.1.{i + 1}:2380", healthy=True,
                                  leader=leader >= originals and i == 0))  # fmt: skip
    step = plan(observed(members, views, size, external_ids=external))
    if isinstance(step, planner.CreatePod):
        assert len(members) <= size, "grows past size + 1"
    if isinstance(step, planner.RemoveMember):
        assert len(members) > 1 and quorum(len(members) - 1) <= len(members) - 1
        if any(m.id in external for m in members) and step.member_id not in external:
            raise AssertionError("a member pod was removed while original members remain")


def test_the_next_pod_waits_until_etcd_would_accept_its_member() -> None:
    members, pods = healthy_cluster(2, leader=0)
    pods[1] = dataclasses.replace(pods[1], running_since=NOW - timedelta(seconds=2))
    step = plan(observed(members, pods, 3))
    assert isinstance(step, planner.Wait) and 3.9 < step.seconds <= planner.RECONFIG_SETTLE.total_seconds()
    pods[1] = dataclasses.replace(pods[1], running_since=NOW - planner.RECONFIG_SETTLE)
    assert plan(observed(members, pods, 3)) == planner.CreatePod(2)


def test_the_first_joiner_does_not_wait_for_the_seed_which_leads() -> None:
    members, pods = healthy_cluster(1, leader=0)
    pods[0] = dataclasses.replace(pods[0], running_since=NOW)
    assert plan(observed(members, pods, 3)) == planner.CreatePod(1)


# ---- rollback to the previous minor through etcd's downgrade protocol -------------------


def rollback_cluster(
    n: int, leader: int = 0, storage_version: str = "3.6.0"
) -> tuple[list[MemberView], list[PodView]]:
    members, pods = healthy_cluster(n, leader)
    members = [dataclasses.replace(m, version="3.6.16", storage_version=storage_version) for m in members]
    return members, [dataclasses.replace(p, version="3.6.16") for p in pods]


def rolling_back(members: list[MemberView], pods: list[PodView], **kwargs: object) -> Observed:
    return observed(members, pods, len(members), version="3.5.35", rollback="3.5", **kwargs)


@given(storage=st.sampled_from(["emptyDir", "pvc"]))
def test_a_rollback_first_enables_etcds_downgrade_and_never_surges(storage: str) -> None:
    members, pods = rollback_cluster(3)
    assert plan(rolling_back(members, pods, storage=storage)) == planner.EnableDowngrade("3.5")


def test_a_member_is_rolled_back_only_once_etcd_rewrote_its_storage() -> None:
    members, pods = rollback_cluster(3, leader=0)
    step = plan(rolling_back(members, pods, downgrade_enabled=True))
    assert isinstance(step, planner.Wait) and "storage of e-1" in step.reason
    members = [dataclasses.replace(m, storage_version="3.5.0") for m in members]
    step = plan(rolling_back(members, pods, downgrade_enabled=True))
    assert step == planner.ReplaceImage("e-1", "u1", "3.5.35")


def test_the_next_member_waits_until_the_last_one_restarted_on_the_old_version() -> None:
    members, pods = rollback_cluster(3, leader=0, storage_version="3.5.0")
    pods[1] = dataclasses.replace(pods[1], version="3.5.35")  # patched, process not restarted yet
    step = plan(rolling_back(members, pods, downgrade_enabled=True))
    assert isinstance(step, planner.Wait) and "e-1 is restarting" in step.reason
    members[1] = dataclasses.replace(members[1], version="3.5.35", storage_version="")
    assert plan(rolling_back(members, pods, downgrade_enabled=True)) == planner.ReplaceImage(
        "e-2", "u2", "3.5.35"
    )


def test_a_member_that_has_not_answered_since_its_restart_holds_the_next_one() -> None:
    """Under load the status may still call it healthy while it has not reported a version."""
    members, pods = rollback_cluster(3, leader=0, storage_version="3.5.0")
    pods[1] = dataclasses.replace(pods[1], version="3.5.35")
    members[1] = dataclasses.replace(members[1], version="", storage_version="")
    step = plan(rolling_back(members, pods, downgrade_enabled=True))
    assert isinstance(step, planner.Wait) and "e-1 is restarting" in step.reason


def test_the_leader_hands_over_to_a_rolled_back_member_before_its_own_turn() -> None:
    members, pods = rollback_cluster(3, leader=0, storage_version="3.5.0")
    for i in (1, 2):
        members[i] = dataclasses.replace(members[i], version="3.5.35", storage_version="")
        pods[i] = dataclasses.replace(pods[i], version="3.5.35")
    assert plan(rolling_back(members, pods, downgrade_enabled=True)) == planner.MoveLeader(100, 101)


def test_a_leader_of_the_older_minor_that_no_longer_reports_the_downgrade_does_not_restart_it() -> None:
    """etcd refuses to enable its downgrade again once its cluster version is the target, and a
    3.5 leader reports no downgrade: the last member on 3.6 is rolled back all the same."""
    members, pods = rollback_cluster(3, leader=1, storage_version="3.5.0")
    for i in (1, 2):
        members[i] = dataclasses.replace(members[i], version="3.5.35", storage_version="")
        pods[i] = dataclasses.replace(pods[i], version="3.5.35")
    assert plan(rolling_back(members, pods, downgrade_enabled=False)) == planner.ReplaceImage(
        "e-0", "u0", "3.5.35"
    )


def test_a_downgrade_nobody_wants_any_more_is_cancelled() -> None:
    members, pods = rollback_cluster(3, storage_version="3.5.0")
    step = plan(observed(members, pods, 3, version="3.6.16", downgrade_enabled=True))
    assert step == planner.CancelDowngrade()


@given(size=st.integers(1, 7), storage=st.sampled_from(["emptyDir", "pvc"]), leader=st.integers(0, 6))
@settings(max_examples=100, deadline=None)
def test_a_rollback_converges_in_place_one_member_at_a_time_leader_last(
    size: int, storage: str, leader: int
) -> None:
    members, pods = rollback_cluster(size, leader=leader % size)
    by_id = {m.id: m for m in members}
    by_name = {p.name: p for p in pods}
    enabled = False
    for _ in range(100):
        step = plan(rolling_back(list(by_id.values()), list(by_name.values()), storage=storage,
                                 downgrade_enabled=enabled))  # fmt: skip
        match step:
            case planner.EnableDowngrade():
                enabled = True  # etcd rewrites every member's storage for the old minor
                by_id = {i: dataclasses.replace(m, storage_version="3.5.0") for i, m in by_id.items()}
            case planner.MoveLeader(from_id=a, to_id=b):
                assert by_id[b].version == "3.5.35" or all(m.version != "3.5.35" for m in by_id.values())
                by_id[a] = dataclasses.replace(by_id[a], leader=False)
                by_id[b] = dataclasses.replace(by_id[b], leader=True)
            case planner.ReplaceImage(name=name, version=version):
                member = next(m for m in by_id.values() if m.name == name)
                assert enabled and member.storage_version == "3.5.0"
                others_old = [m for m in by_id.values() if m.version == "3.6.16" and m.id != member.id]
                assert not member.leader or not others_old, "the leader goes last"
                by_name[name] = dataclasses.replace(by_name[name], version=version)
                by_id[member.id] = dataclasses.replace(member, version=version, storage_version="")
            case planner.Wait(reason=reason) if "finishing its downgrade" in reason:
                assert all(m.version == "3.5.35" for m in by_id.values())
                enabled = False  # etcd's leader ends it once every member runs the old minor
            case planner.Done():
                break
            case _:
                raise AssertionError(f"unexpected step {step}")
    else:
        raise AssertionError("the rollback did not converge")
    assert {m.version for m in by_id.values()} == {"3.5.35"} and len(by_id) == size


def test_a_cluster_short_of_a_member_finishes_its_rollback_then_grows() -> None:
    """etcd refuses every new member while its downgrade is enabled: the rollback goes on with
    the members there are (one died, or spec.size went up), and the cluster grows once etcd
    has finished the downgrade."""
    members, pods = rollback_cluster(3, storage_version="3.5.0")
    members[0] = dataclasses.replace(members[0], version="3.5.35", storage_version="")
    pods[0] = dataclasses.replace(pods[0], version="3.5.35")
    o = observed(members[:2], pods[:2], 3, version="3.5.35", rollback="3.5", downgrade_enabled=True)
    assert plan(o) == planner.ReplaceImage("e-1", "u1", "3.5.35")
    done = [dataclasses.replace(m, version="3.5.35", storage_version="") for m in members[:2]]
    rolled = dataclasses.replace(
        o, members=tuple(done), pods=tuple(dataclasses.replace(p, version="3.5.35") for p in pods[:2])
    )
    step = plan(rolled)
    assert isinstance(step, planner.Wait) and "finishing its downgrade" in step.reason
    assert plan(dataclasses.replace(rolled, downgrade_enabled=False)) == planner.CreatePod(2)


def test_a_cluster_short_of_a_member_before_the_downgrade_grows_on_the_version_it_runs() -> None:
    """Before etcd's downgrade is enabled a new member may still join (on the newer minor, the
    controller's choice while rolling back): the cluster is whole again before any restart."""
    members, pods = rollback_cluster(3)
    short = observed(members[:2], pods[:2], 3, version="3.5.35", rollback="3.5")
    assert plan(short) == planner.CreatePod(2)


def test_a_rollback_waits_for_a_terminating_member_pod_before_restarting_another() -> None:
    """An evicted member's etcd can still answer during its grace period: restarting another
    member now would take two down at once."""
    members, pods = rollback_cluster(3, leader=0, storage_version="3.5.0")
    pods[2] = dataclasses.replace(pods[2], deleting=True)
    step = plan(rolling_back(members, pods, downgrade_enabled=True))
    assert isinstance(step, planner.Wait) and "e-2 is terminating" in step.reason


def test_the_next_member_restarts_only_once_the_last_one_caught_up_with_the_leader() -> None:
    members, pods = healthy_cluster(3, leader=0)
    pods = [dataclasses.replace(p, version="3.6.16" if p.index == 1 else "3.5.35") for p in pods]
    members[1] = dataclasses.replace(members[1], lag=50_000)  # back on its volume, replaying
    step = plan(observed(members, pods, 3, storage="pvc", version="3.6.16"))
    assert isinstance(step, planner.Wait) and "e-1 is catching up: 50000 raft entries" in step.reason
    members[1] = dataclasses.replace(members[1], lag=3)  # a few entries apart is normal under writes
    assert plan(observed(members, pods, 3, storage="pvc", version="3.6.16")) == planner.DeletePod(
        "e-2", "u2", "restarting it on etcd 3.6.16"
    )
    rolled, rolled_pods = rollback_cluster(3, leader=0, storage_version="3.5.0")
    rolled[1] = dataclasses.replace(rolled[1], version="3.5.35", storage_version="", lag=50_000)
    rolled_pods[1] = dataclasses.replace(rolled_pods[1], version="3.5.35")
    step = plan(rolling_back(rolled, rolled_pods, downgrade_enabled=True))
    assert isinstance(step, planner.Wait) and "catching up" in step.reason


def test_only_the_volumes_of_members_that_left_are_collected_and_only_old_ones() -> None:
    members, pods = healthy_cluster(3)
    old, fresh = NOW - planner.CLAIM_GRACE, NOW - timedelta(seconds=1)
    claims = (
        *(planner.ClaimView(f"{p.name}-data", p.name, f"c{p.index}", old) for p in pods),
        planner.ClaimView("e-7-data", "e-7", "c7", old),  # a member scaled away
        planner.ClaimView("e-9-data", "e-9", "c9", fresh),  # just made: its pod may not be in the cache yet
    )
    o = observed(members, pods, 3, storage="pvc", claims=claims)
    assert plan(o) == planner.DeleteClaim("e-7-data", "e-7", "c7")
    assert plan(dataclasses.replace(o, claims=claims[:3] + claims[4:])) == planner.Done()
    # A member whose pod is gone keeps its volume: it comes back on it.
    gone = dataclasses.replace(o, pods=tuple(pods[:2]), claims=claims[:3])
    assert plan(gone) == planner.RecreatePod("e-2", 102)


# ---- members move off draining nodes (rule 8b) ------------------------------------------------


def migrate(model: Model, max_steps: int = 300) -> list[planner.Step]:
    """Plan and apply until Done; at no moment fewer healthy voters than the cluster's size."""
    taken: list[planner.Step] = []
    for _ in range(max_steps):
        step = plan(model.observe())
        if isinstance(step, planner.Done):
            return taken
        assert not isinstance(step, planner.QuorumLost | planner.UpgradeHalted | planner.Wait), step
        model.apply(step)
        taken.append(step)
        voters = [m for m in model.members.values() if not m.learner]
        assert sum(m.healthy for m in voters) >= model.size, f"below size after {step}"
        assert len(model.members) <= model.size + 1
    raise AssertionError("the migration did not converge")


@given(size=st.integers(1, 7), storage=st.sampled_from(["emptyDir", "pvc"]), leader=st.integers(0, 6))
@settings(max_examples=60, deadline=None)
def test_members_leave_draining_nodes_one_at_a_time_never_below_size(
    size: int, storage: str, leader: int
) -> None:
    model = Model(size, storage)
    model.run()
    chosen = list(model.members.values())[leader % size]
    for m in list(model.members.values()):
        model.members[m.id] = dataclasses.replace(m, leader=m.id == chosen.id)
    # Every node that holds a member is drained, one after another.
    for name in sorted(model.pods):
        model.pods[name] = dataclasses.replace(model.pods[name], node=f"node-{name}", draining=True)
        steps = migrate(model)
        assert name not in model.pods
        removed = [s for s in steps if isinstance(s, planner.RemoveMember)]
        assert [s.name for s in removed] == [name] and removed[
            0
        ].reason == f"moved off draining node node-{name}"
    assert len(model.members) == size and not any(p.draining for p in model.pods.values())


def test_without_migration_a_draining_node_is_left_to_the_drain() -> None:
    members, pods = healthy_cluster(3)
    pods[1] = dataclasses.replace(pods[1], node="w-1", draining=True)
    assert plan(observed(members, pods, 3, migrate=False)) == planner.Done()
    assert plan(observed(members, pods, 3)) == planner.CreatePod(3)


def test_a_replacement_still_starting_is_not_what_leaves() -> None:
    members, pods = healthy_cluster(3)
    pods[1] = dataclasses.replace(pods[1], node="w-1", draining=True)
    pods.append(PodView("e-3", 3, uid="u3", ip="127.1.1.4", running=True, member_id=103))
    members.append(MemberView(103, "e-3", "http://127.1.1.4:2380"))  # promoted, not healthy yet
    step = plan(observed(members, pods, 3))
    assert isinstance(step, planner.Wait) and "e-3" in step.reason


def _voters_with_versions(version: str, started_ago: list[float]) -> tuple[list[MemberView], list[PodView]]:
    """A healthy cluster, member 0 leading, member i's pod running for started_ago[i] s."""
    members, pods = healthy_cluster(len(started_ago), leader=0)
    members = [dataclasses.replace(m, version=version) for m in members]
    pods = [
        dataclasses.replace(p, running_since=NOW - timedelta(seconds=s))
        for p, s in zip(pods, started_ago, strict=True)
    ]
    return members, pods


def test_growing_to_five_does_not_wait_for_the_fourth_to_settle_where_etcd_does_not() -> None:
    """etcd 3.5.30+/3.6.11+/3.7 accepts an add once the leader has been connected for 5 s to a
    quorum of the voters after it (itself included): 3 of 5, so the just-promoted fourth member
    is not needed. Older etcd wants every voter, and so does the plan."""
    members, pods = _voters_with_versions("3.6.16", [100, 100, 100, 1])
    assert plan(observed(members, pods, 5)) == planner.CreatePod(4)

    members, pods = _voters_with_versions("3.6.10", [100, 100, 100, 1])
    step = plan(observed(members, pods, 5))
    assert isinstance(step, planner.Wait) and step.seconds > 4


def test_the_fourth_member_still_waits_for_every_voter_of_three() -> None:
    """Adding to three voters needs 3 of 4: the leader and both others settled, whatever the version."""
    members, pods = _voters_with_versions("3.7.1", [100, 100, 2])
    step = plan(observed(members, pods, 4))
    assert isinstance(step, planner.Wait) and 3.9 < step.seconds <= planner.RECONFIG_SETTLE.total_seconds()


def test_a_member_of_unknown_version_keeps_the_stricter_rule() -> None:
    members, pods = _voters_with_versions("3.6.16", [100, 100, 100, 1])
    members[2] = dataclasses.replace(members[2], version="")
    assert isinstance(plan(observed(members, pods, 5)), planner.Wait)


# ---- the membership not asked when it cannot answer (issue 28: quorum loss on volumes) -----------


def _lost_on_volumes(pods: list[PodView], **kwargs: object) -> Observed:
    """A formed 3-member cluster on volumes as status recorded it, with ``pods`` left."""
    recorded = tuple((f"e-{i}", 100 + i) for i in range(3))
    given: dict[str, object] = {
        "storage": "pvc", "ever_formed": True, "recorded_members": recorded,
        "recorded_voters": tuple(name for name, _ in recorded), **kwargs,
    }  # fmt: skip
    return observed(None, pods, 3, **given)


def test_the_membership_is_not_asked_while_too_few_voters_run_and_each_member_comes_back() -> None:
    """Two of three pods gone: the survivor cannot answer a linearizable member list (its leader
    needs a majority), so the operator does not wait the list's 2 s timeout to bring the two back,
    both in one step; a recreated pod counts only once its etcd runs."""
    _, pods = healthy_cluster(3)
    survivor = pods[0]
    o = _lost_on_volumes([survivor])
    assert planner.membership_unanswerable(o)
    both = plan(o)
    assert isinstance(both, planner.RecreatePod) and both.members == (("e-1", 101), ("e-2", 102))
    pending = PodView("e-1", 1, member_id=101)
    o = _lost_on_volumes([survivor, pending])
    assert planner.membership_unanswerable(o)
    assert plan(o) == planner.RecreatePod("e-2", 102)
    # Every member has a pod again: the list's own answer decides, as before.
    assert not planner.membership_unanswerable(_lost_on_volumes([survivor, pending, PodView("e-2", 2)]))


def test_the_membership_is_asked_whenever_it_could_answer() -> None:
    _, pods = healthy_cluster(3)
    assert not planner.membership_unanswerable(_lost_on_volumes(pods[:2]))  # one gone: a quorum runs
    stopping = [pods[0], dataclasses.replace(pods[1], deleting=True)]
    assert not planner.membership_unanswerable(_lost_on_volumes(stopping))  # its etcd may still serve
    stopped = [pods[0], dataclasses.replace(pods[1], running=False, deleting=True)]
    assert planner.membership_unanswerable(_lost_on_volumes(stopped))  # its container has exited
    assert not planner.membership_unanswerable(_lost_on_volumes(pods[:1], storage="emptyDir"))
    assert not planner.membership_unanswerable(_lost_on_volumes(pods[:1], external_ids=frozenset({7})))
    assert not planner.membership_unanswerable(_lost_on_volumes(pods[:1], ever_formed=False))
    # A learner is no voter: 2 voters recorded, both running, one learner gone.
    o = _lost_on_volumes(pods[:2], recorded_voters=("e-0", "e-1"))
    assert not planner.membership_unanswerable(o)


@given(
    st.lists(st.sampled_from(["running", "pending", "absent", "stopping", "stopped"]), min_size=1, max_size=7)
)
@settings(max_examples=300)
def test_not_asking_the_membership_never_changes_the_step_while_the_record_is_current(
    pods_are: list[str],
) -> None:
    """Whenever the list is skipped, the step is the one the list's answer would have led to: a
    member is healthy only with its etcd running and a quorum of them running (else no leader)."""
    n = len(pods_are)
    members, pods = healthy_cluster(n)
    running = {"running", "stopping"}  # states whose etcd runs
    kept: list[PodView] = []
    for pod, state in zip(pods, pods_are, strict=True):
        if state != "absent":
            kept.append(dataclasses.replace(pod, running=state in running, deleting=state.startswith("stop")))
    serving = sum(1 for state in pods_are if state in running) >= quorum(n)
    members = [dataclasses.replace(m, healthy=serving and pods_are[i] in running, leader=False)
               for i, m in enumerate(members)]  # fmt: skip
    answered = observed(members, kept, n, storage="pvc", ever_formed=True,
                        recorded_members=tuple((m.name, m.id) for m in members),
                        recorded_voters=tuple(m.name for m in members))  # fmt: skip
    unanswered = dataclasses.replace(answered, members=None)
    if planner.membership_unanswerable(unanswered):
        assert not serving
        assert plan(answered) == plan(unanswered)
        assert isinstance(plan(unanswered), planner.RecreatePod)
    elif not serving and "absent" in pods_are:
        raise AssertionError("a member without a pod waited for a list that could not answer")
