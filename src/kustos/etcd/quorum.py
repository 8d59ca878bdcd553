"""The quorum arithmetic that guards a membership change (pure).

Its own module so that the planners (which decide without I/O) and ``membership`` (which
calls etcd) share one definition without the planners importing the etcd client.
"""

from __future__ import annotations


def quorum(voters: int) -> int:
    """The majority of ``voters`` that etcd needs to commit anything."""
    return voters // 2 + 1


def removal_keeps_quorum(voters: int, healthy_voters_after: int, learner: bool = False) -> bool:
    """Would the healthy voters left after a removal still be a majority of the voters left?

    ``voters`` counts the victim when it votes; a learner never counts, so removing one is safe.
    """
    if learner:
        return True
    return voters > 1 and healthy_voters_after >= quorum(voters - 1)


__all__ = ["quorum", "removal_keeps_quorum"]
