"""deploy/crds/ is exactly what the models in kustos.api generate (SPEC F-OPS-1).

The CRDs are generated, never edited: this fails when a model changed and the
YAML did not follow, or when a file is there that no model generates.
Regenerate with KUSTOS_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

from kustos.api import refs
from kustos.api.resources import RESOURCES
from kustos.runtime.crd import CustomResource, stale_crds, write_crds
from kustos.runtime.refs import ResourceRef

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"


def test_deploy_crds_are_current() -> None:
    if os.environ.get("KUSTOS_UPDATE_GOLDEN") == "1":
        write_crds(RESOURCES, CRDS)
    assert CRDS.is_dir(), f"{CRDS} is missing"
    assert stale_crds(RESOURCES, CRDS) == [], (
        f"{CRDS} is stale (missing, different or unexpected files above); "
        "regenerate with KUSTOS_UPDATE_GOLDEN=1 and review the diff"
    )


def test_registry_holds_distinct_custom_resources() -> None:
    assert all(isinstance(m, type) and issubclass(m, CustomResource) for m in RESOURCES)
    names = [m.crd.name for m in RESOURCES]
    assert len(names) == len(set(names))
    kinds = [m.crd.kind for m in RESOURCES]
    assert len(kinds) == len(set(kinds))


def test_every_kind_is_watched_by_the_coordinates_its_crd_declares() -> None:
    """kustos.api.refs is how the operator watches a kind before its models are built: a kind
    missing there, or declared apart from it, would be watched under a name no CRD serves."""
    declared = {value for value in vars(refs).values() if isinstance(value, ResourceRef)}
    assert {m.crd.ref for m in RESOURCES} == declared
