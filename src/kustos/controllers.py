"""Every controller kustos runs, registered on a manager by ``kustos run``."""

from __future__ import annotations

from kustos.runtime.manager import Manager


def register_all(manager: Manager) -> None:
    """Register kustos's controllers and webhooks (each kind's issue adds its own here)."""
    del manager  # no resource kinds yet: the runtime comes first
