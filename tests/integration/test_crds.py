"""Generated CRDs on the real API server (SPEC F-OPS-1): accepted without warnings,
stored as generated, and enforcing what the models say: defaults, pruning,
bounds, enums, CEL, list maps, printer columns and the status subresource."""

from __future__ import annotations

import enum
import json
import subprocess
from typing import Any, Literal

import pytest
from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType
from pydantic import Field

from kustos.api.resources import RESOURCES
from kustos.devcluster.cluster import DevCluster, DevClusterError
from kustos.runtime.crd import CRDInfo, CustomResource, KubeModel, ScaleSubresource, crd_for, render_crds
from tests.example.api import Example
from tests.integration.conftest import Kubectl


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Knob(KubeModel):
    size: int = 3


class Panel(KubeModel):
    knob: Knob = Field(default_factory=Knob)
    big: Knob = Knob(size=5)


class ProbeSpec(KubeModel):
    """Rules the Example kind does not exercise."""

    replicas: int = Field(default=1, ge=0)
    ratio: float = Field(default=0.5, gt=0, lt=1)
    tier: Literal["gold", "silver"] | None = None
    color: Color = Color.RED
    tags: set[str] = set()
    panel: Panel = Field(default_factory=Panel)


class ProbeStatus(KubeModel):
    replicas: int = 0
    selector: str = ""


class Probe(CustomResource[ProbeSpec, ProbeStatus]):
    crd = CRDInfo(
        group="example.kustos.dev",
        kind="Probe",
        plural="probes",
        categories=("kustos-test",),
        scale=ScaleSubresource(label_selector_path=".status.selector"),
    )


MODELS = [Example, Probe, *RESOURCES]
INFO = Example.crd
ExampleResource = create_namespaced_resource(INFO.group, INFO.version, INFO.kind, INFO.plural)
ProbeResource = create_namespaced_resource(
    Probe.crd.group, Probe.crd.version, Probe.crd.kind, Probe.crd.plural
)


def example(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": INFO.api_version,
        "kind": INFO.kind,
        "metadata": {"name": name},
        "spec": {"message": "hello", **spec},
    }


@pytest.fixture(scope="module")
def crds(dev_cluster: DevCluster) -> list[str]:
    """Every generated CRD applied (server-side, as a deployment would) and Established."""
    kubectl = [str(dev_cluster.kubectl_path), "--kubeconfig", str(dev_cluster.kubeconfig)]
    result = subprocess.run(
        [*kubectl, "apply", "--server-side", "--force-conflicts", "--field-manager=kustos-test", "-f", "-"],
        input=render_crds(MODELS),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The API server warns about what it accepts but ignores (unknown formats, ...): none of that.
    assert "Warning" not in result.stderr, result.stderr
    names = [m.crd.name for m in MODELS]
    for name in names:
        dev_cluster.wait_established(name, timeout=60)
    return names


def test_crds_are_established_and_stored_as_generated(crds: list[str], dev_cluster: DevCluster) -> None:
    for model in MODELS:
        stored = json.loads(dev_cluster.kubectl("get", "crd", model.crd.name, "-o", "json"))
        generated = crd_for(model)
        conditions = {c["type"]: c["status"] for c in stored["status"]["conditions"]}
        assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"
        assert stored["status"]["acceptedNames"]["kind"] == model.crd.kind
        # Nothing was dropped or rewritten by the API server: the schema is structural as generated.
        for key in ("group", "names", "scope"):
            assert stored["spec"][key] == generated["spec"][key], key
        (version,) = stored["spec"]["versions"]
        (expected,) = generated["spec"]["versions"]
        assert version["schema"] == expected["schema"]
        assert version.get("subresources") == expected.get("subresources")
        assert version.get("additionalPrinterColumns") == expected.get("additionalPrinterColumns")


async def test_defaults_are_applied_and_unknown_fields_pruned(
    crds: list[str], kube: AsyncClient, namespace: str
) -> None:
    body = example("defaults", items=[{"name": "a", "junk": 1}], extra={"any": {"deep": [1, {"x": None}]}})
    body["spec"]["bogus"] = "dropped"
    body["topLevelJunk"] = {"a": 1}
    created = await kube.create(ExampleResource(body), namespace=namespace)
    stored = (await kube.get(ExampleResource, "defaults", namespace=namespace)).to_dict()
    for obj in (created.to_dict(), stored):
        assert obj["spec"] == {
            "message": "hello",
            "replicas": 1,
            "mode": "copy",
            "labels": {},
            "items": [{"name": "a", "value": 0}],
            # preserve-unknown-fields keeps arbitrary content, nulls included.
            "extra": {"any": {"deep": [1, {"x": None}]}},
        }
        assert "topLevelJunk" not in obj
    parsed = Example.model_validate(stored)
    assert parsed.spec.replicas == 1 and parsed.spec.mode == "copy" and parsed.status is None


async def test_valid_variants_are_accepted(crds: list[str], kube: AsyncClient, namespace: str) -> None:
    cases = {
        "port-number": {"port": 8080},
        "port-name": {"port": "http"},
        "port-null": {"port": None},
        "six-copies": {"replicas": 6, "mode": "copy"},
        "upper": {"replicas": 5, "mode": "upper", "labels": {"a": "b"}},
        "two-items": {"items": [{"name": "a", "value": 1}, {"name": "b"}]},
        "bounds": {"replicas": 0, "message": "x" * 256},
    }
    for name, spec in cases.items():
        created = (await kube.create(ExampleResource(example(name, **spec)), namespace=namespace)).to_dict()
        for key, value in spec.items():
            if key == "items":
                value = [{"value": 0, **item} for item in value]
            assert created["spec"][key] == value, (name, key)
        Example.model_validate(created)


INVALID = {
    "empty-message": ({"message": ""}, ["spec.message", "at least 1 chars long"]),
    "long-message": ({"message": "x" * 257}, ["spec.message", "Too long: may not be more than 256"]),
    "no-message": ({"message": None}, ["spec.message", "Required value"]),
    "replicas-10": ({"replicas": 10}, ["spec.replicas", "less than or equal to 9"]),
    "replicas-negative": ({"replicas": -1}, ["spec.replicas", "greater than or equal to 0"]),
    "mode-lower": ({"mode": "lower"}, ["spec.mode", 'Unsupported value: "lower"']),
    "cel": ({"replicas": 6, "mode": "upper"}, ["spec.replicas", "replicas above 5 need mode copy"]),
    "duplicate-items": (
        {"items": [{"name": "a"}, {"name": "a", "value": 2}]},
        ["spec.items[1]", "Duplicate value"],
    ),
    "item-without-name": ({"items": [{"value": 2}]}, ["spec.items[0].name", "Required value"]),
    "port-boolean": ({"port": True}, ["spec.port", "must be of type integer,string"]),
    "labels-not-strings": ({"labels": {"a": 1}}, ["spec.labels.a", "must be of type string"]),
}


@pytest.mark.parametrize("case", INVALID, ids=list(INVALID))
def test_invalid_examples_are_rejected_naming_the_field(crds: list[str], kubectl: Kubectl, case: str) -> None:
    spec, expected = INVALID[case]
    body = example(case, **spec)
    if body["spec"]["message"] is None:
        del body["spec"]["message"]
    with pytest.raises(DevClusterError) as failure:
        kubectl.apply(body)
    message = str(failure.value)
    assert f'Example "{case}" is invalid' in message
    for part in expected:
        assert part in message, message
    assert kubectl("get", "examples", "-o", "name") == ""


async def test_status_subresource(
    crds: list[str], kube: AsyncClient, namespace: str, kubectl: Kubectl
) -> None:
    created = await kube.create(ExampleResource(example("status")), namespace=namespace)
    assert created["metadata"]["generation"] == 1 and created.get("status") is None

    condition = {
        "type": "Available",
        "status": "True",
        "reason": "Ready",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    status = {"phase": "Running", "ready": "1/1", "observedGeneration": 1, "conditions": [condition]}
    patched = await kube.patch(
        ExampleResource.Status, "status", {"status": status}, namespace=namespace, patch_type=PatchType.MERGE
    )
    # The status was written with its defaults (message ""), and the generation did not move.
    assert patched["status"] == {**status, "conditions": [{**condition, "message": ""}]}
    assert patched["metadata"]["generation"] == 1

    # A write to the main resource changes the spec and ignores the status.
    current = (await kube.get(ExampleResource, "status", namespace=namespace)).to_dict()
    current["spec"]["message"] = "changed"
    current["status"] = {"phase": "Hijacked", "ready": "0/1"}
    replaced = await kube.replace(ExampleResource(current), namespace=namespace)
    assert replaced["spec"]["message"] == "changed" and replaced["metadata"]["generation"] == 2
    assert replaced["status"]["phase"] == "Running" and replaced["status"]["ready"] == "1/1"
    merged = await kube.patch(
        ExampleResource,
        "status",
        {"status": {"phase": "Hijacked"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    assert merged["status"]["phase"] == "Running"

    # The status schema is enforced on the subresource too, naming the field.
    bad = {**condition, "status": "Maybe"}
    with pytest.raises(DevClusterError, match=r'status\.conditions\[0\]\.status: Unsupported value: "Maybe"'):
        kubectl(
            "patch",
            "example",
            "status",
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"conditions": [bad]}}),
        )
    twice = json.dumps({"status": {"conditions": [condition, {**condition, "status": "False"}]}})
    with pytest.raises(DevClusterError, match=r"status\.conditions\[1\]: Duplicate value"):
        kubectl("patch", "example", "status", "--subresource=status", "--type=merge", "-p", twice)
    parsed = Example.model_validate(
        (await kube.get(ExampleResource, "status", namespace=namespace)).to_dict()
    )
    assert parsed.status is not None and parsed.status.conditions[0].status == "True"


async def test_printer_columns_and_short_name(
    crds: list[str], kube: AsyncClient, namespace: str, kubectl: Kubectl
) -> None:
    await kube.create(ExampleResource(example("shown")), namespace=namespace)
    await kube.patch(
        ExampleResource.Status,
        "shown",
        {"status": {"phase": "Running", "ready": "2/3"}},
        namespace=namespace,
        patch_type=PatchType.MERGE,
    )
    for resource in ("examples", "ex", f"examples.{INFO.group}"):
        header, row = kubectl("get", resource).splitlines()
        assert header.split() == ["NAME", "READY", "PHASE", "AGE"]
        name, ready, phase, age = row.split()
        assert (name, ready, phase) == ("shown", "2/3", "Running")
        assert age.endswith("s")


async def test_nested_defaults_exclusive_bounds_sets_and_nullable_enums(
    crds: list[str], kube: AsyncClient, namespace: str, kubectl: Kubectl
) -> None:
    body = {
        "apiVersion": Probe.crd.api_version,
        "kind": "Probe",
        "metadata": {"name": "p"},
        "spec": {"tier": None},
    }
    created = (await kube.create(ProbeResource(body), namespace=namespace)).to_dict()
    # default: {} on objects lets the API server fill nested defaults; a null enum is pruned.
    assert created["spec"] == {
        "replicas": 1,
        "ratio": 0.5,
        "color": "red",
        "tags": [],
        "panel": {"knob": {"size": 3}, "big": {"size": 5}},
    }
    assert Probe.model_validate(created).spec.tier is None

    def rejected(spec: dict[str, Any]) -> str:
        with pytest.raises(DevClusterError) as failure:
            kubectl.apply({**body, "metadata": {"name": "bad"}, "spec": spec})
        return str(failure.value)

    assert "spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1" in rejected({"ratio": 1})
    assert "spec.ratio in body should be greater than 0" in rejected({"ratio": 0})
    assert 'spec.tags[1]: Duplicate value: "a"' in rejected({"tags": ["a", "a"]})
    assert 'spec.tier: Unsupported value: "bronze"' in rejected({"tier": "bronze"})
    assert 'spec.color: Unsupported value: "green"' in rejected({"color": "green"})
    kubectl.apply({**body, "spec": {"ratio": 0.99, "tier": "gold", "tags": ["b", "a"], "color": "blue"}})

    # The scale subresource drives spec.replicas.
    kubectl("scale", "probe", "p", "--replicas=3")
    scaled = await kube.get(ProbeResource, "p", namespace=namespace)
    assert scaled["spec"]["replicas"] == 3 and scaled["spec"]["tier"] == "gold"
    assert kubectl("get", "kustos-test", "-o", "name").split() == ["probe.example.kustos.dev/p"]
