"""The operator's own container image, which agent pods run.

The operator's image carries the agent commands (``kustos etcd snapshot ...``), so
agent pods run that image at the operator's own version: agent and operator always
agree on flags and output. The dev cluster's pod runner maps any tag of this
repository to the local install of kustos (see ``kustos.devcluster.podspec``).
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

KUSTOS_IMAGE_REPOSITORY = "ghcr.io/kustos/kustos"
# distroless's non-root id: the operator's image runs as it (its Dockerfile's USER, the chart),
# and kustos runs etcd's images (static programs, no USER of their own) and its agent pods as it.
NONROOT_UID = 65532


def agent_image() -> str:
    """The image agent pods run: this repository at the installed kustos version ("dev" if none)."""
    try:
        tag = version("kustos")
    except PackageNotFoundError:
        tag = "dev"
    return f"{KUSTOS_IMAGE_REPOSITORY}:{tag}"


def configured_agent_image() -> str:
    """``KUSTOS_AGENT_IMAGE`` (a mirror, a pinned digest), else ``agent_image()``."""
    return os.environ.get("KUSTOS_AGENT_IMAGE") or agent_image()
