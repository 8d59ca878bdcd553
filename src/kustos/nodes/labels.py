"""Annotations and labels the node families write on Nodes and PendingNodes, in one place.

Everything a restarted operator must know about a replacement lives on the Nodes
themselves (which heir replaces which donor, when a drain started, whether a pod was
forced off), so the planner reads it back instead of remembering it.
"""

from __future__ import annotations

DONOR = "kustos.dev/donor"
"""On a heir: the name of the outdated node it replaces (the one source of the pairing)."""
HEIR = "kustos.dev/heir"
"""On a donor: its heir (informational; the heir's DONOR annotation is what counts)."""
DRAIN_STARTED = "kustos.dev/drain-started"
"""On a donor: when its drain began (RFC 3339); drainTimeout counts from here."""
DRAINED = "kustos.dev/drained"
"""On a donor: when its drain finished (RFC 3339)."""
ETCD_MEMBER_REMOVED = "kustos.dev/etcd-member-removed"
"""On a control-plane donor: its stacked etcd member is out of the membership."""
FORCED = "kustos.dev/drain-forced"
"""On a donor: the pods deleted after drainTimeout (onDrainTimeout: force)."""
NODE_IMAGE = "kustos.dev/nodeimage"
"""On a PendingNode: the NodeImage that asked for it."""

# Label and taint keys that belong to Kubernetes itself and are never copied to a heir.
SYSTEM_SUFFIXES = ("kubernetes.io", "k8s.io")
# Taints the node lifecycle and kubectl set; a cordon is not a user taint either.
SYSTEM_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "kustos.dev/")


def user_key(key: str) -> bool:
    """A label or taint key a user (or their tooling) set: not ``*.kubernetes.io`` or ``*.k8s.io``
    (``kubernetes.io/hostname``, ``node-role.kubernetes.io/...``, ``topology.kubernetes.io/...``)."""
    prefix, slash, _ = key.partition("/")
    if not slash:
        return True
    if key.startswith(SYSTEM_PREFIXES):
        return False
    return not any(prefix == s or prefix.endswith("." + s) for s in SYSTEM_SUFFIXES)


__all__ = [
    "DONOR", "DRAINED", "DRAIN_STARTED", "ETCD_MEMBER_REMOVED", "FORCED", "HEIR", "NODE_IMAGE", "user_key",
]  # fmt: skip
