"""Where kustos keeps what outlives a checkout: built binaries, tools and dev clusters."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$KUSTOS_CACHE``, else ``$XDG_CACHE_HOME/kustos``, else ``~/.cache/kustos``."""
    explicit = os.environ.get("KUSTOS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kustos"


def clusters_root() -> Path:
    return cache_root() / "clusters"
