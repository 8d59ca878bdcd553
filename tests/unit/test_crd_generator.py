"""The CRD generator: pydantic models to Kubernetes structural schemas (SPEC F-OPS-1).

The golden file pins the whole Example CRD; the focused tests pin one
conversion rule each. tests/integration/test_crds.py applies the output to a
real API server. Regenerate the golden file with KUSTOS_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator
from datetime import datetime, time
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from pydantic import ConfigDict, Field, ValidationError
from pydantic.json_schema import PydanticJsonSchemaWarning

from kustos.runtime.crd import (
    CRDInfo,
    CRDSchemaError,
    CustomResource,
    IntOrString,
    KubeModel,
    PrinterColumn,
    Rule,
    ScaleSubresource,
    crd_for,
    kube_schema,
    list_map,
    render_crds,
    stale_crds,
    structural_schema,
    write_crds,
)
from tests.example.api import Example, ExampleSpec, ExampleStatus

GOLDEN = Path(__file__).parent / "golden" / "examples.example.kustos.dev.yaml"

# Keys a structural schema must not contain anywhere (or, for additionalProperties, only as a schema).
FORBIDDEN = {"$ref", "$defs", "$schema", "title", "anyOf", "oneOf", "allOf", "not", "const", "examples"}
FORBIDDEN |= {"discriminator", "uniqueItems", "prefixItems"}


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path: properties, items and map values."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[*]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}.*")


def props(model: type[KubeModel]) -> dict[str, Any]:
    return dict(structural_schema(model)["properties"])


def example_schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd_for(Example)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# ---- golden ----------------------------------------------------------------------------


def test_example_crd_matches_golden_file() -> None:
    rendered = render_crds([Example])
    if os.environ.get("KUSTOS_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(rendered)
    assert GOLDEN.is_file(), f"{GOLDEN} is missing; run with KUSTOS_UPDATE_GOLDEN=1 to create it"
    assert rendered == GOLDEN.read_text(), (
        f"the Example CRD differs from {GOLDEN.name}; if the change is intended, "
        "regenerate with KUSTOS_UPDATE_GOLDEN=1 and review the diff"
    )


# ---- structural rules over the whole Example CRD ----------------------------------------


def test_every_node_has_a_type_except_int_or_string_and_preserve_unknown() -> None:
    for path, node in nodes(example_schema()):
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
        elif not node.get("x-kubernetes-preserve-unknown-fields"):
            assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean"), path
        assert not FORBIDDEN & set(node), (path, FORBIDDEN & set(node))
        assert node.get("additionalProperties") is not False, path


def test_preserve_unknown_fields_only_where_declared() -> None:
    declared = [p for p, n in nodes(example_schema()) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert declared == [".spec.extra"]


def test_resource_envelope() -> None:
    schema = example_schema()
    assert schema["type"] == "object"
    assert schema["description"] == "An example resource for tests."
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert schema["properties"]["apiVersion"]["type"] == "string"
    assert schema["properties"]["kind"]["type"] == "string"
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    assert schema["required"] == ["spec"]
    assert schema["properties"]["spec"]["required"] == ["message"]


def test_crd_names_columns_and_subresources() -> None:
    crd = crd_for(Example)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"] == {"name": "examples.example.kustos.dev"}
    spec = crd["spec"]
    assert spec["group"] == "example.kustos.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "Example",
        "listKind": "ExampleList",
        "plural": "examples",
        "singular": "example",
        "shortNames": ["ex"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"] == [
        {"name": "READY", "type": "string", "jsonPath": ".status.ready"},
        {"name": "PHASE", "type": "string", "jsonPath": ".status.phase"},
        {"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


class ScaledSpec(KubeModel):
    replicas: int = 1


class ScaledStatus(KubeModel):
    replicas: int = 0
    selector: str = ""


class Scaled(CustomResource[ScaledSpec, ScaledStatus]):
    crd = CRDInfo(
        kind="Scaled",
        plural="scaleds",
        singular="scaled",
        short_names=("sc", "scl"),
        categories=("kustos",),
        scope="Cluster",
        printer_columns=(PrinterColumn("Replicas", ".spec.replicas", "integer", "wanted", priority=1),),
        scale=ScaleSubresource(label_selector_path=".status.selector"),
    )


def test_crd_defaults_and_optional_metadata() -> None:
    crd = crd_for(Scaled)
    assert crd["metadata"]["name"] == "scaleds.kustos.dev"
    spec = crd["spec"]
    assert spec["group"] == "kustos.dev" and spec["scope"] == "Cluster"
    assert spec["names"]["categories"] == ["kustos"] and spec["names"]["shortNames"] == ["sc", "scl"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    assert version["additionalPrinterColumns"] == [
        {
            "name": "Replicas",
            "type": "integer",
            "jsonPath": ".spec.replicas",
            "description": "wanted",
            "priority": 1,
        }
    ]
    assert version["schema"]["openAPIV3Schema"]["required"] == ["spec"]


def test_status_subresource_off_and_no_columns() -> None:
    class Plain(CustomResource[ScaledSpec, ScaledStatus]):
        crd = CRDInfo(kind="Plain", plural="plains", status_subresource=False)

    version = crd_for(Plain)["spec"]["versions"][0]
    assert "subresources" not in version and "additionalPrinterColumns" not in version
    assert "shortNames" not in crd_for(Plain)["spec"]["names"]


def test_a_model_without_crd_info_is_refused() -> None:
    class Bare(CustomResource[ScaledSpec, ScaledStatus]):
        pass

    with pytest.raises(CRDSchemaError, match="Bare declares no"):
        crd_for(Bare)


# ---- one rule at a time ----------------------------------------------------------------


class Inner(KubeModel):
    """An inner object."""

    size: int = 3
    kind_name: str = "x"


def test_optional_becomes_nullable_without_any_of() -> None:
    class M(KubeModel):
        count: int | None = None
        inner: Inner | None = None
        names: list[str] | None = None

    p = props(M)
    assert p["count"] == {"type": "integer", "nullable": True}
    assert p["inner"]["type"] == "object" and p["inner"]["nullable"] is True
    assert p["inner"]["description"] == "An inner object."
    assert p["names"] == {"type": "array", "items": {"type": "string"}, "nullable": True}


def test_int_or_string_has_no_type() -> None:
    class M(KubeModel):
        port: IntOrString
        max_unavailable: IntOrString | None = None
        counts: list[IntOrString] = []

    p = props(M)
    assert p["port"] == {"x-kubernetes-int-or-string": True}
    assert p["maxUnavailable"] == {"x-kubernetes-int-or-string": True, "nullable": True}
    assert p["counts"]["items"] == {"x-kubernetes-int-or-string": True}
    assert M(port="http").port == "http" and M(port=80).port == 80


def test_numeric_bounds_in_kubernetes_form() -> None:
    class M(KubeModel):
        inclusive: int = Field(default=1, ge=0, le=9)
        exclusive: float = Field(default=0.5, gt=0, lt=1)
        mixed_lower: int = Field(default=5, ge=5, gt=3)
        equal_lower: int = Field(default=5, ge=4, gt=4)
        step: int = Field(default=10, multiple_of=5)

    p = props(M)
    assert p["inclusive"] == {"type": "integer", "default": 1, "minimum": 0, "maximum": 9}
    assert p["exclusive"] == {
        "type": "number",
        "default": 0.5,
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "exclusiveMaximum": True,
    }
    assert p["mixedLower"]["minimum"] == 5 and "exclusiveMinimum" not in p["mixedLower"]
    assert p["equalLower"]["minimum"] == 4 and p["equalLower"]["exclusiveMinimum"] is True
    assert p["step"]["multipleOf"] == 5


def test_string_and_array_limits() -> None:
    class M(KubeModel):
        name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z]+$")
        hosts: list[str] = Field(min_length=1, max_length=3)
        tags: dict[str, str] = Field(default_factory=dict, min_length=1)

    p = props(M)
    assert p["name"] == {"type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-z]+$"}
    assert p["hosts"] == {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
    assert p["tags"]["minProperties"] == 1


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_enums_from_literal_and_enum() -> None:
    class M(KubeModel):
        mode: Literal["copy", "upper"] = "copy"
        color: Color = Color.BLUE
        only: Literal["fixed"] = "fixed"
        level: Literal[1, 2, 3] = 1
        maybe: Literal["a", "b"] | None = None

    p = props(M)
    assert p["mode"] == {"type": "string", "enum": ["copy", "upper"], "default": "copy"}
    assert p["color"] == {"type": "string", "enum": ["red", "blue"], "default": "blue"}
    assert p["only"] == {"type": "string", "enum": ["fixed"], "default": "fixed"}
    assert p["level"] == {"type": "integer", "enum": [1, 2, 3], "default": 1}
    # The API server refuses null against an enum even when nullable; without nullable it prunes null.
    assert p["maybe"] == {"type": "string", "enum": ["a", "b"]}


def test_list_markers() -> None:
    class M(KubeModel):
        items: list[Inner] = Field(default_factory=list, json_schema_extra=list_map("kindName"))
        names: set[str] = set()
        args: list[str] = Field(default_factory=list, json_schema_extra=kube_schema(list_type="atomic"))
        inner: Inner = Field(default_factory=Inner, json_schema_extra=kube_schema(map_type="atomic"))

    p = props(M)
    assert p["items"]["x-kubernetes-list-type"] == "map"
    assert p["items"]["x-kubernetes-list-map-keys"] == ["kindName"]
    assert p["names"]["x-kubernetes-list-type"] == "set" and "uniqueItems" not in p["names"]
    assert p["args"]["x-kubernetes-list-type"] == "atomic"
    assert p["inner"]["x-kubernetes-map-type"] == "atomic"


def test_list_map_keys_must_be_required_or_defaulted() -> None:
    class Item(KubeModel):
        name: str | None = None

    class M(KubeModel):
        items: list[Item] = Field(default_factory=list, json_schema_extra=list_map("name"))

    with pytest.raises(CRDSchemaError, match=r"M\.items: list map key 'name' must be required"):
        structural_schema(M)

    class N(KubeModel):
        items: list[Item] = Field(default_factory=list, json_schema_extra=list_map("id"))

    with pytest.raises(CRDSchemaError, match="'id' is not a field"):
        structural_schema(N)


def test_marker_helpers_refuse_contradictions() -> None:
    with pytest.raises(ValueError, match="needs list_map_keys"):
        kube_schema(list_type="map")
    with pytest.raises(ValueError, match="needs list_type='map'"):
        kube_schema(list_type="set", list_map_keys=["a"])


def test_preserve_unknown_fields_where_declared() -> None:
    class M(KubeModel):
        extra: dict[str, Any] | None = Field(
            default=None, json_schema_extra=kube_schema(preserve_unknown_fields=True)
        )
        anything: Any = Field(default=None, json_schema_extra=kube_schema(preserve_unknown_fields=True))
        raw: dict[str, Any] = Field(
            default_factory=dict, json_schema_extra=kube_schema(preserve_unknown_fields=True)
        )

    p = props(M)
    assert p["extra"] == {"type": "object", "nullable": True, "x-kubernetes-preserve-unknown-fields": True}
    assert p["anything"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert p["raw"] == {"type": "object", "default": {}, "x-kubernetes-preserve-unknown-fields": True}


def test_untyped_values_without_preserve_are_refused() -> None:
    class M(KubeModel):
        extra: dict[str, Any] = {}

    with pytest.raises(CRDSchemaError, match=r"M\.extra: values of any type need kube_schema"):
        structural_schema(M)

    class N(KubeModel):
        anything: Any = None

    with pytest.raises(CRDSchemaError, match=r"N\.anything: no type"):
        structural_schema(N)


def test_maps_keep_additional_properties_with_their_value_schema() -> None:
    class M(KubeModel):
        labels: dict[str, str] = {}
        sizes: dict[str, Inner] = {}

    p = props(M)
    assert p["labels"] == {"type": "object", "additionalProperties": {"type": "string"}, "default": {}}
    assert p["sizes"]["additionalProperties"]["properties"]["kindName"] == {"type": "string", "default": "x"}


def test_closed_models_drop_additional_properties_false() -> None:
    class Closed(KubeModel):
        model_config = ConfigDict(extra="forbid")
        a: int = 0

    schema = structural_schema(Closed)
    assert "additionalProperties" not in schema and schema["type"] == "object"


def test_cel_rules_on_models_and_fields() -> None:
    class Bounds(KubeModel):
        model_config = ConfigDict(
            json_schema_extra=kube_schema(rules=[Rule("self.low <= self.high", "low must not exceed high")])
        )
        low: int = 0
        high: int = 0

    class M(KubeModel):
        bounds: Bounds = Field(
            default_factory=Bounds,
            json_schema_extra=kube_schema(
                rules=[
                    Rule("self.high < 100", "high too big", field_path=".high", reason="FieldValueForbidden")
                ]
            ),
        )
        name: str = Field(default="a", json_schema_extra=kube_schema(rules=[Rule("self != 'b'", "not b")]))

    p = props(M)
    # The model's own rule and the field's rule both apply, model first.
    assert p["bounds"]["x-kubernetes-validations"] == [
        {"rule": "self.low <= self.high", "message": "low must not exceed high"},
        {
            "rule": "self.high < 100",
            "message": "high too big",
            "fieldPath": ".high",
            "reason": "FieldValueForbidden",
        },
    ]
    assert p["name"]["x-kubernetes-validations"] == [{"rule": "self != 'b'", "message": "not b"}]
    spec = example_schema()["properties"]["spec"]
    assert spec["x-kubernetes-validations"] == [
        {
            "rule": "self.replicas <= 5 || self.mode == 'copy'",
            "message": "replicas above 5 need mode copy",
            "fieldPath": ".replicas",
        }
    ]


def test_defaults_survive_pruning() -> None:
    class Outer(KubeModel):
        inner: Inner = Field(default_factory=Inner)
        custom: Inner = Inner(size=5)
        optional: Inner | None = None

    class M(KubeModel):
        count: int = 2
        names: list[str] = Field(default_factory=list)
        tags: list[str] = Field(default_factory=lambda: ["a", "b"])
        outer: Outer = Outer()
        nothing: str | None = None
        color: Color = Color.RED

    p = props(M)
    assert p["count"]["default"] == 2
    assert p["names"]["default"] == []
    assert p["tags"]["default"] == ["a", "b"]
    assert p["color"]["default"] == "red"
    # All-default objects default to {} so that the API server applies the nested defaults.
    assert p["outer"]["default"] == {}
    assert p["outer"]["properties"]["inner"]["default"] == {}
    assert p["outer"]["properties"]["custom"]["default"] == {"size": 5}
    assert p["outer"]["properties"]["inner"]["properties"]["size"]["default"] == 3
    assert "default" not in p["nothing"] and "default" not in p["outer"]["properties"]["optional"]


def test_defaults_that_are_not_plain_data_are_left_out() -> None:
    preserve = kube_schema(preserve_unknown_fields=True)

    class M(KubeModel):
        thing: Any = Field(default_factory=object, json_schema_extra=preserve)
        ratio: float = float("nan")

    with pytest.warns(PydanticJsonSchemaWarning, match="not JSON serializable"):
        p = props(M)
    assert p["thing"] == {"x-kubernetes-preserve-unknown-fields": True}
    assert p["ratio"] == {"type": "number"}


def test_set_defaults_are_sorted() -> None:
    class M(KubeModel):
        names: set[str] = {"b", "c", "a"}

    assert props(M)["names"]["default"] == ["a", "b", "c"]


def test_defaults_from_factories_taking_data_are_left_out() -> None:
    class M(KubeModel):
        a: int = 1
        b: int = Field(default_factory=lambda data: data["a"] + 1)

    assert "default" not in props(M)["b"]


def test_refs_are_inlined_with_descriptions() -> None:
    class Leaf(KubeModel):
        """A leaf."""

        value: int = 0

    class Branch(KubeModel):
        """A branch."""

        leaf: Leaf = Field(default_factory=Leaf, description="The leaf of this branch.")
        other: Leaf = Field(default_factory=Leaf)
        leaves: list[Leaf] = []

    class Tree(KubeModel):
        """A tree."""

        trunk: Branch
        spare: Branch | None = None

    schema = structural_schema(Tree)
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "$defs" not in text and "allOf" not in text
    trunk = schema["properties"]["trunk"]
    assert schema["description"] == "A tree."
    assert trunk["description"] == "A branch."
    assert trunk["properties"]["leaf"]["description"] == "The leaf of this branch."
    assert trunk["properties"]["other"]["description"] == "A leaf."
    assert trunk["properties"]["leaves"]["items"]["properties"]["value"] == {"type": "integer", "default": 0}
    assert schema["required"] == ["trunk"]
    # Each use is its own copy: editing one does not change another.
    trunk["properties"]["leaf"]["properties"]["value"]["default"] = 7
    assert trunk["properties"]["other"]["properties"]["value"]["default"] == 0


def test_aliases_and_attribute_docstrings() -> None:
    class M(KubeModel):
        """Class doc."""

        observed_generation: int
        """The generation seen."""
        last_seen_time: str | None = Field(default=None, description="From Field.")

    schema = structural_schema(M)
    assert list(schema["properties"]) == ["observedGeneration", "lastSeenTime"]
    assert schema["required"] == ["observedGeneration"]
    assert schema["properties"]["observedGeneration"]["description"] == "The generation seen."
    assert schema["properties"]["lastSeenTime"]["description"] == "From Field."
    assert M(observed_generation=1).model_dump() == {"observedGeneration": 1, "lastSeenTime": None}
    assert M.model_validate({"observedGeneration": 2}).observed_generation == 2


def test_unknown_formats_are_dropped() -> None:
    class M(KubeModel):
        when: datetime
        at: time
        where: Path

    p = props(M)
    assert p["when"] == {"type": "string", "format": "date-time"}
    assert p["at"] == {"type": "string"} and p["where"] == {"type": "string"}


# ---- what cannot be expressed is refused, naming the field -----------------------------


def test_unions_are_refused_naming_the_field() -> None:
    class M(KubeModel):
        value: int | str

    with pytest.raises(CRDSchemaError, match=r"^M\.value: union types \(anyOf\)"):
        structural_schema(M)

    class A(KubeModel):
        a: int = 0

    class B(KubeModel):
        b: str = ""

    class Holder(KubeModel):
        choice: list[A | B | None] = []

    with pytest.raises(CRDSchemaError, match=r"^Holder\.choice\[\*\]: union types"):
        structural_schema(Holder)


def test_discriminated_unions_are_refused() -> None:
    class Cat(KubeModel):
        pet_type: Literal["cat"]

    class Dog(KubeModel):
        pet_type: Literal["dog"]

    class M(KubeModel):
        pet: Cat | Dog = Field(discriminator="pet_type")

    with pytest.raises(CRDSchemaError, match=r"^M\.pet: union types \(oneOf\)"):
        structural_schema(M)


class Node(KubeModel):
    name: str
    children: list[Node] = []


class Wrapper(KubeModel):
    root: Node


def test_recursive_models_are_refused() -> None:
    with pytest.raises(
        CRDSchemaError, match=r"Wrapper\.root\.children\[\*\]: recursive model \(Node -> Node\)"
    ):
        structural_schema(Wrapper)
    with pytest.raises(CRDSchemaError, match="recursive model"):
        structural_schema(Node)


def test_tuples_are_refused() -> None:
    class M(KubeModel):
        pair: tuple[int, str]

    with pytest.raises(CRDSchemaError, match=r"M\.pair: tuples"):
        structural_schema(M)


def test_null_only_fields_are_refused() -> None:
    class M(KubeModel):
        nothing: None = None

    with pytest.raises(CRDSchemaError, match=r"M\.nothing: a field that can only be null"):
        structural_schema(M)


def test_unknown_keywords_in_extras_are_refused() -> None:
    class M(KubeModel):
        a: int = Field(default=0, json_schema_extra={"x-kubernetes-list-type": "atomic", "bogus": 1})

    with pytest.raises(CRDSchemaError, match=r"M\.a: JSON schema keyword 'bogus'"):
        structural_schema(M)


# ---- the resource model ----------------------------------------------------------------


def test_custom_resource_fills_type_meta_and_parses_server_objects() -> None:
    ex = Example(metadata={"name": "a"}, spec=ExampleSpec(message="hi"))
    assert ex.api_version == "example.kustos.dev/v1alpha1" and ex.kind == "Example"
    # Type meta counts as set, so an apply patch built from the model is complete.
    assert ex.model_dump(exclude_unset=True) == {
        "apiVersion": "example.kustos.dev/v1alpha1",
        "kind": "Example",
        "metadata": {"name": "a"},
        "spec": {"message": "hi"},
    }
    server = {
        "apiVersion": "example.kustos.dev/v1alpha1",
        "kind": "Example",
        "metadata": {"name": "a", "namespace": "n", "generation": 1},
        "spec": {"message": "hi", "replicas": 1, "mode": "copy", "labels": {}, "items": [], "port": 80},
        "status": {"phase": "Running", "observedGeneration": 1, "conditions": []},
    }
    parsed = Example.model_validate(server)
    assert isinstance(parsed.status, ExampleStatus) and parsed.status.observed_generation == 1
    assert parsed.spec.port == 80
    with pytest.raises(ValidationError):
        ExampleSpec(message="")
    with pytest.raises(ValidationError):
        ExampleSpec(message="a", replicas=10)


# ---- rendering and files ---------------------------------------------------------------


def test_render_is_deterministic_sorted_and_alias_free() -> None:
    one = render_crds([Example, Scaled])
    assert one == render_crds([Scaled, Example])
    docs = list(yaml.safe_load_all(one))
    assert [d["metadata"]["name"] for d in docs] == ["examples.example.kustos.dev", "scaleds.kustos.dev"]
    assert "&id" not in one and "*id" not in one
    assert one.startswith("# Generated")
    top_keys = [line.split(":")[0] for line in one.splitlines() if line and line[0].isalpha()]
    assert top_keys[:4] == ["apiVersion", "kind", "metadata", "spec"]
    assert render_crds([]) == ""


def test_two_models_for_one_crd_are_refused() -> None:
    class Again(CustomResource[ExampleSpec, ExampleStatus]):
        crd = Example.crd

    with pytest.raises(CRDSchemaError, match=r"two models define the CRD examples\.example\.kustos\.dev"):
        render_crds([Example, Again])


def test_write_and_stale(tmp_path: Path) -> None:
    directory = tmp_path / "crds"
    assert stale_crds([], directory) == []
    assert stale_crds([Example, Scaled], directory) == [
        "examples.example.kustos.dev.yaml",
        "scaleds.kustos.dev.yaml",
    ]
    written = write_crds([Example, Scaled], directory)
    assert [p.name for p in written] == ["examples.example.kustos.dev.yaml", "scaleds.kustos.dev.yaml"]
    assert stale_crds([Example, Scaled], directory) == []
    assert yaml.safe_load(written[0].read_text()) == crd_for(Example)

    (directory / ".gitkeep").touch()
    (directory / "README.txt").write_text("not yaml, not ours")
    assert stale_crds([Example, Scaled], directory) == []

    written[1].write_text(written[1].read_text().replace("scaleds", "scaled"))
    (directory / "old.kustos.dev.yaml").write_text("{}\n")
    assert stale_crds([Example, Scaled], directory) == ["old.kustos.dev.yaml", "scaleds.kustos.dev.yaml"]
    # A model that is gone leaves a stale file behind until regenerated.
    assert stale_crds([Example], directory) == ["old.kustos.dev.yaml", "scaleds.kustos.dev.yaml"]

    write_crds([Example], directory)
    assert stale_crds([Example], directory) == []
    assert sorted(p.name for p in directory.iterdir()) == [
        ".gitkeep",
        "README.txt",
        "examples.example.kustos.dev.yaml",
    ]
