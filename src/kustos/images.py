"""The images kustos runs: the operator's own (agent pods) and etcd's (member pods).

The operator's image carries the agent commands (``kustos etcd snapshot ...``), so
agent pods run that image at the operator's own version: agent and operator always
agree on flags and output. The dev cluster's pod runner maps any tag of this
repository to the local install of kustos (see ``kustos.devcluster.podspec``).

etcd's images: the etcd project pushes every release to gcr.io/etcd-development/etcd and
its mirror quay.io/coreos/etcd, tagged ``v<version>`` (its scripts/release.sh checks both),
and the official etcd-operator pulls from there too. registry.k8s.io/etcd is Kubernetes'
own, tagged ``<version>-0``, and carries the versions Kubernetes ships (kubeadm 1.36
defaults to 3.6.8-0), not every release: a member whose image is not there shows
ImagePullFailed (``etcd.stuck``) with ``pull_advice``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


# The etcd versions the suite proves (every test of tests/integration runs on them; the dev
# cluster builds each, devcluster/binaries.py): the newest is EtcdCluster's default version.
PROVEN_ETCD_VERSIONS = ("3.5.35", "3.6.16", "3.7.3")


@dataclass(frozen=True)
class EtcdRepository:
    """A repository of etcd images kustos knows: how it tags a version and what it carries."""

    name: str
    tag_format: str  # ``{version}`` is replaced by ``3.7.3``
    carries: str  # which versions it holds, for people (``kustos etcd images``, pull advice)
    every_release: bool  # whether every etcd release is pushed there


DEFAULT_ETCD_REPOSITORY = "gcr.io/etcd-development/etcd"
ETCD_REPOSITORIES = (
    EtcdRepository(DEFAULT_ETCD_REPOSITORY, "v{version}", "every etcd release (the project's own)", True),
    EtcdRepository("quay.io/coreos/etcd", "v{version}", "every etcd release (the project's mirror)", True),
    EtcdRepository("registry.k8s.io/etcd", "{version}-0", "the versions Kubernetes ships", False),
    EtcdRepository("k8s.gcr.io/etcd", "{version}-0", "Kubernetes' old registry, frozen in 2023", False),
)
# A repository kustos does not know (a mirror): etcd's own scheme, as the project tags releases.
_OTHER_TAG_FORMAT = "v{version}"


def etcd_repository(name: str) -> EtcdRepository | None:
    return next((r for r in ETCD_REPOSITORIES if r.name == name), None)


def etcd_image(repository: str, version: str) -> str:
    """The image of etcd ``version`` (3.7.3) in ``repository``, tagged as that repository does."""
    known = etcd_repository(repository)
    tag = (known.tag_format if known else _OTHER_TAG_FORMAT).format(version=version)
    return f"{repository}:{tag}"


def pull_advice(repository: str) -> str:
    """What to do when an etcd image of ``repository`` cannot be pulled."""
    known = etcd_repository(repository)
    if known is not None and known.every_release:
        return "check spec.version names an etcd release, and that the nodes can reach the registry"
    what = f"{repository} carries {known.carries}" if known else f"kustos does not know {repository}"
    return (
        f"{what}, perhaps not spec.version: set spec.repository to {DEFAULT_ETCD_REPOSITORY}, "
        "which has every release (`kustos etcd images` lists what kustos pulls), or check that "
        "the nodes can reach the registry"
    )
