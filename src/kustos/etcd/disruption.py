"""The PodDisruptionBudget of an EtcdCluster: how many member pods a voluntary eviction
(kubectl drain, the cluster-autoscaler, karpenter, a node group rotation) must leave Ready.
Pure: the controller applies ``min_available`` before every step it takes.

Why an integer ``minAvailable`` that the operator keeps moving, and not ``maxUnavailable: 1``:

- The disruption controller resolves ``maxUnavailable`` (and any percentage) through the
  pods' controller's scale subresource; member pods are owned by an EtcdCluster, which has
  none, so such a budget would refuse every eviction with a sync error. An integer
  ``minAvailable`` needs only the pods: ``disruptionsAllowed = Ready pods - minAvailable``.
- With ``spec.disruption.migrate`` (the default) the budget allows no eviction at all: a
  member on a cordoned or tainted node is moved by the operator (a replacement joins
  elsewhere first, then the member leaves and its pod is deleted), and the drain, which
  retries, finds the pod gone. An eviction would instead take a voter away before its
  replacement exists.
- The Ready count alone cannot tell a learner (which does not vote) from a voter, nor see
  an etcd member that is up but still catching up: only the operator knows. So without
  migration the budget allows one eviction only while the cluster is steady (the planner
  has nothing to do, every member a healthy voter, one Ready pod per member, exactly
  ``size`` of them) and the loss of one voter keeps quorum; at any other moment
  ``minAvailable`` is above the number of member pods that can be Ready: nothing is
  evicted. The budget is applied before the step that starts a change (a new pod, a
  learner), and the Eviction API refuses while the disruption controller has not yet seen
  a budget's new generation, so a pod the operator is about to create opens no window.
- Once one member is evicted its pod is deleted and stops counting: the cluster is no longer
  steady, and the budget refuses the next eviction until the member is replaced and healthy.

``unhealthyPodEvictionPolicy: IfHealthyBudget``: a member pod is Ready when etcd's /health
answers, which needs a leader. During an election or a quorum loss every member is
unready at once; ``AlwaysAllow`` would then let a drain evict them all, turning a cluster
that recovers by itself into one that has lost its data. With ``IfHealthyBudget`` an unready
member can be evicted only while the budget is met, which it never is outside steadiness.
"""

from __future__ import annotations

from kustos.etcd.planner import Done, Observed
from kustos.etcd.quorum import quorum


def steady(o: Observed | None, step: object) -> bool:
    """Nothing in flight: the planner is done, every member is a healthy voter with one live,
    Ready pod, and there are exactly ``size`` of them."""
    if o is None or o.members is None or not isinstance(step, Done):
        return False
    members = o.members
    if len(members) != o.size or any(m.learner or not m.healthy for m in members):
        return False
    return len(o.pods) == o.size and all(p.ready and not p.deleting and not p.node_lost for p in o.pods)


def evictions_allowed(size: int) -> int:
    """How many voters of a steady cluster of ``size`` may be evicted at once: one when
    quorum survives it (size 3 and up), none for 1 or 2 members."""
    return min(1, size - quorum(size))


def min_available(o: Observed | None, step: object, size: int, member_pods: int) -> int:
    """The budget's ``minAvailable``: ``size`` less what a steady cluster may lose (nothing
    when members migrate: the drain waits for the operator to move them); otherwise one more
    than the member pods there are (or will be after this step), so that no eviction is
    allowed whatever becomes Ready meanwhile."""
    if o is not None and steady(o, step):
        return size if o.migrate else size - evictions_allowed(size)
    return max(size, member_pods) + 1
