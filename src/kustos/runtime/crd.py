"""CustomResourceDefinitions generated from pydantic models (SPEC F-OPS-1).

The pydantic models in ``kustos.api`` are the single source of truth for our
kinds: the operator parses objects with them, and the CRDs the API server
validates against are generated from them here, never written by hand.

``model_json_schema()`` gives JSON Schema draft 2020-12; Kubernetes wants a
*structural* OpenAPI v3 schema. The post-processor below bridges the two:
it inlines every ``$ref``, turns ``X | None`` into ``nullable: true``,
``gt``/``lt`` into boolean ``exclusiveMinimum``/``exclusiveMaximum``, strips
what the API server refuses, and raises :class:`CRDSchemaError` naming the
field for anything it cannot express (unions, recursion, untyped values), so
a bad model fails at generation time instead of at ``kubectl apply``.
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import itertools
import json
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, NoDefault
from pydantic_core import PydanticSerializationError, core_schema

from kustos.runtime.refs import ResourceRef

__all__ = [
    "CRDInfo",
    "CRDSchemaError",
    "CustomResource",
    "IntOrString",
    "KubeModel",
    "PrinterColumn",
    "Rule",
    "ScaleSubresource",
    "crd_for",
    "kube_schema",
    "list_map",
    "render_crds",
    "stale_crds",
    "structural_schema",
    "write_crds",
]

DEFAULT_GROUP = "kustos.dev"
DEFAULT_VERSION = "v1alpha1"
HEADER = "# Generated from the pydantic models in kustos.api by kustos.runtime.crd; do not edit.\n"

PRESERVE = "x-kubernetes-preserve-unknown-fields"
INT_OR_STRING = "x-kubernetes-int-or-string"
VALIDATIONS = "x-kubernetes-validations"
LIST_TYPE = "x-kubernetes-list-type"


class CRDSchemaError(ValueError):
    """A model cannot be expressed as a Kubernetes structural schema."""


class KubeModel(BaseModel):
    """Base of every kustos API model: camelCase on the wire, snake_case in Python.

    Attribute docstrings become field descriptions, so the CRD documents what
    the code documents. They are read from the source when a schema is generated
    (``attribute_docstrings``), not by pydantic at import: its
    ``use_attribute_docstrings`` searched every loaded module for each of the
    hundred models, a fifth of an operator's start. A model's validator is built when it is first
    used (``defer_build``): an operator never builds those of kinds its cluster has no object
    of, ~2.5 MiB of its idle RSS for the hundred models.
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True, defer_build=True
    )


IntOrString = Annotated[int | str, WithJsonSchema({INT_OR_STRING: True})]
"""A Kubernetes IntOrString (a port number or name, a count or a percentage)."""


# ---- schema markers ------------------------------------------------------------------


RuleReason = Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]


@dataclass(frozen=True)
class Rule:
    """A CEL validation rule (``x-kubernetes-validations``) checked by the API server."""

    rule: str
    message: str
    field_path: str | None = None
    reason: RuleReason | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path is not None:
            out["fieldPath"] = self.field_path
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def kube_schema(
    *,
    rules: Sequence[Rule] = (),
    list_type: Literal["atomic", "set", "map"] | None = None,
    list_map_keys: Sequence[str] = (),
    map_type: Literal["atomic", "granular"] | None = None,
    preserve_unknown_fields: bool = False,
    embedded_resource: bool = False,
) -> dict[str, Any]:
    """Kubernetes schema extensions, for ``Field(json_schema_extra=...)`` or a model's config.

    Kept as plain ``x-kubernetes-*`` keys so that they travel through pydantic's
    schema untouched and land on the node they were declared on.
    """
    if list_map_keys and list_type not in (None, "map"):
        raise ValueError("list_map_keys needs list_type='map'")
    if list_type == "map" and not list_map_keys:
        raise ValueError("list_type='map' needs list_map_keys")
    extra: dict[str, Any] = {}
    if rules:
        extra[VALIDATIONS] = [r.to_dict() for r in rules]
    if list_map_keys:
        extra[LIST_TYPE] = "map"
        extra["x-kubernetes-list-map-keys"] = list(list_map_keys)
    elif list_type is not None:
        extra[LIST_TYPE] = list_type
    if map_type is not None:
        extra["x-kubernetes-map-type"] = map_type
    if preserve_unknown_fields:
        extra[PRESERVE] = True
    if embedded_resource:
        extra["x-kubernetes-embedded-resource"] = True
    return extra


def list_map(*keys: str, rules: Sequence[Rule] = ()) -> dict[str, Any]:
    """A list merged by key (``x-kubernetes-list-type: map``): no two items share the keys."""
    return kube_schema(list_map_keys=keys, rules=rules)


# ---- CRD metadata and the resource base class ----------------------------------------


@dataclass(frozen=True)
class PrinterColumn:
    """An ``additionalPrinterColumns`` entry: what ``kubectl get`` shows."""

    name: str
    json_path: str
    type: Literal["string", "integer", "number", "boolean", "date"] = "string"
    description: str | None = None
    priority: int = 0
    format: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            out["description"] = self.description
        if self.priority:
            out["priority"] = self.priority
        if self.format:
            out["format"] = self.format
        return out


@dataclass(frozen=True)
class ScaleSubresource:
    """The ``scale`` subresource, so ``kubectl scale`` and autoscalers work on a kind."""

    spec_replicas_path: str = ".spec.replicas"
    status_replicas_path: str = ".status.replicas"
    label_selector_path: str | None = None

    def to_dict(self) -> dict[str, str]:
        out = {"specReplicasPath": self.spec_replicas_path, "statusReplicasPath": self.status_replicas_path}
        if self.label_selector_path:
            out["labelSelectorPath"] = self.label_selector_path
        return out


@dataclass(frozen=True)
class CRDInfo:
    """Everything about a kind's CRD that its schema does not say."""

    kind: str
    plural: str
    singular: str | None = None
    group: str = DEFAULT_GROUP
    version: str = DEFAULT_VERSION
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    scope: Literal["Namespaced", "Cluster"] = "Namespaced"
    printer_columns: tuple[PrinterColumn, ...] = ()
    status_subresource: bool = True
    scale: ScaleSubresource | None = None

    @classmethod
    def of(
        cls,
        ref: ResourceRef,
        *,
        short_names: tuple[str, ...] = (),
        categories: tuple[str, ...] = (),
        printer_columns: tuple[PrinterColumn, ...] = (),
    ) -> CRDInfo:
        """The CRD of the kind at ``ref``: its identity declared where a controller can read it
        without building the kind's models (kustos.api.refs)."""
        return cls(
            kind=ref.kind, plural=ref.plural, group=ref.group, version=ref.version,
            scope="Namespaced" if ref.namespaced else "Cluster", short_names=short_names,
            categories=categories, printer_columns=printer_columns,
        )  # fmt: skip

    @property
    def name(self) -> str:
        """The CRD's own name, ``<plural>.<group>``."""
        return f"{self.plural}.{self.group}"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def ref(self) -> ResourceRef:
        """The REST coordinates of the kind, as its CRD declares them: controllers use this
        instead of declaring them again."""
        return ResourceRef(self.group, self.version, self.plural, self.kind, self.scope == "Namespaced")

    @property
    def file_name(self) -> str:
        return f"{self.name}.yaml"


SpecT = TypeVar("SpecT", bound=BaseModel)
StatusT = TypeVar("StatusT", bound=BaseModel)


class CustomResource(KubeModel, Generic[SpecT, StatusT]):
    """A kustos object as stored by the API server.

    Subclasses set ``crd`` and parametrise spec and status, e.g.
    ``class EtcdCluster(CustomResource[EtcdClusterSpec, EtcdClusterStatus])``.
    ``apiVersion`` and ``kind`` default from ``crd`` and count as set, so that
    ``model_dump(exclude_unset=True)`` still yields a valid apply patch.
    """

    crd: ClassVar[CRDInfo]

    api_version: str = ""
    kind: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SpecT
    status: StatusT | None = None

    @model_validator(mode="before")
    @classmethod
    def _type_meta(cls, data: Any) -> Any:
        info: CRDInfo | None = getattr(cls, "crd", None)
        if info is None or not isinstance(data, dict):
            return data
        data = dict(data)
        if "apiVersion" not in data and "api_version" not in data:
            data["apiVersion"] = info.api_version
        if "kind" not in data:
            data["kind"] = info.kind
        return data


# ---- JSON schema generation ----------------------------------------------------------


def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the string right below the field in the class body (PEP 257's attribute
    docstrings), the model's own over its bases'."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if issubclass(cls, BaseModel) and cls is not BaseModel:
            docs.update(_own_docstrings(cls))
    return docs


@functools.cache
def _own_docstrings(cls: type[BaseModel]) -> dict[str, str]:
    """One class body's attribute docstrings (each base parsed once, not once per subclass)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source: a parametrised generic, say
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    return {
        field.target.id: inspect.cleandoc(below.value.value)
        for field, below in itertools.pairwise(body)
        if isinstance(field, ast.AnnAssign)
        and isinstance(field.target, ast.Name)
        and isinstance(below, ast.Expr)
        and isinstance(below.value, ast.Constant)
        and isinstance(below.value.value, str)
    }


class _KubeJsonSchema(GenerateJsonSchema):
    """pydantic's generator, with defaults as the API server should apply them, and attribute
    docstrings as descriptions (where ``Field`` gives none).

    Defaults from plain-data ``default_factory`` are emitted too; ``None``
    defaults are not (absent already means unset); model defaults are dumped
    without the values their own schema defaults anyway, so an all-default
    object becomes ``default: {}`` and the API server fills in the rest.
    """

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        model: type[BaseModel] = schema["cls"]
        docs = attribute_docstrings(model)
        properties = json_schema.get("properties", {})
        for name, field in model.model_fields.items():
            key = field.validation_alias if isinstance(field.validation_alias, str) else field.alias or name
            if name in docs and key in properties and "description" not in properties[key]:
                properties[key]["description"] = docs[name]
        return json_schema

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        if "default" in schema:
            return schema["default"]
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return NoDefault
        try:
            return factory()  # type: ignore[call-arg]
        except Exception:
            return NoDefault

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        if self.get_default_value(schema) is None:
            return self.generate_inner(schema["schema"])
        json_schema = super().default_schema(schema)
        if "default" in json_schema and json_schema["default"] is None:  # e.g. NaN
            del json_schema["default"]
        return json_schema

    def encode_default(self, dft: Any) -> Any:
        try:
            encoded = TypeAdapter(Any).dump_python(dft, mode="json", by_alias=True, exclude_defaults=True)
            json.dumps(encoded, allow_nan=False)
        except (PydanticSerializationError, TypeError, ValueError) as err:
            raise PydanticSerializationError(f"default {dft!r} is not plain data") from err
        return encoded


_DROP = frozenset(
    {"title", "$schema", "$comment", "examples", "discriminator", "deprecated", "readOnly", "writeOnly"}
)
_KEEP = frozenset(
    {
        "type",
        "description",
        "nullable",
        "maximum",
        "minimum",
        "multipleOf",
        "maxLength",
        "minLength",
        "pattern",
        "maxItems",
        "minItems",
        "maxProperties",
        "minProperties",
        "default",
        "exclusiveMinimum",
        "exclusiveMaximum",
    }
)
_NULL = {"type": "null"}
# Formats the API server knows; it warns about any other, and pydantic checks them anyway.
_FORMATS = frozenset(
    {
        "bsonobjectid", "uri", "email", "hostname", "ipv4", "ipv6", "cidr", "mac", "uuid", "uuid3",
        "uuid4", "uuid5", "isbn", "isbn10", "isbn13", "creditcard", "ssn", "hexcolor", "rgbcolor",
        "byte", "password", "date", "duration", "datetime", "date-time", "int32", "int64", "float",
        "double",
    }
)  # fmt: skip


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` (the referring field) wins, except that CEL rules of both apply."""
    out = dict(base)
    for key, value in top.items():
        if key == VALIDATIONS and key in out:
            out[key] = [*out[key], *value]
        else:
            out[key] = value
    return out


class _Converter:
    """Walks one model's JSON schema and builds its structural form."""

    def __init__(self, defs: dict[str, Any]) -> None:
        self.defs = defs

    def flatten(
        self, node: dict[str, Any], path: str, stack: tuple[str, ...]
    ) -> tuple[dict[str, Any], tuple[str, ...]]:
        """Resolve ``$ref``, single ``allOf`` and ``X | None`` into one node."""
        node = dict(node)
        nullable = False
        while True:
            if "$ref" in node:
                name = node.pop("$ref").rsplit("/", 1)[-1]
                if name in stack:
                    cycle = " -> ".join([*stack[stack.index(name) :], name])
                    raise CRDSchemaError(
                        f"{path}: recursive model ({cycle}); structural schemas cannot be recursive"
                    )
                stack = (*stack, name)
                node = _overlay(self.defs[name], node)
                continue
            if "allOf" in node:
                parts = node.pop("allOf")
                if len(parts) != 1:
                    raise CRDSchemaError(f"{path}: allOf with {len(parts)} schemas is not supported")
                node = _overlay(parts[0], node)
                continue
            union = next((key for key in ("anyOf", "oneOf") if key in node), None)
            if union is not None:
                options = node.pop(union)
                others = [o for o in options if o != _NULL]
                if len(others) != 1 or len(others) == len(options):
                    raise CRDSchemaError(
                        f"{path}: union types ({union}) are not allowed in a structural schema; "
                        "use one type, X | None, or IntOrString"
                    )
                nullable = True
                node = _overlay(others[0], node)
                continue
            break
        if nullable:
            node["nullable"] = True
        return node, stack

    def convert(self, raw: dict[str, Any], path: str, stack: tuple[str, ...] = ()) -> dict[str, Any]:
        node, stack = self.flatten(raw, path, stack)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or key in ("$defs", "definitions"):
                continue
            if key in _KEEP or key.startswith("x-kubernetes-"):
                out[key] = value
            elif key == "format":
                if value in _FORMATS or str(value).startswith("k8s-"):
                    out[key] = value
            elif key == "enum":
                out["enum"] = list(value)
            elif key == "const":
                out.setdefault("enum", [value])
            elif key == "properties":
                out[key] = {name: self.convert(sub, f"{path}.{name}", stack) for name, sub in value.items()}
            elif key == "required":
                if value:
                    out[key] = list(value)
            elif key == "items":
                if not isinstance(value, dict):
                    raise CRDSchemaError(f"{path}: items must be one schema")
                out[key] = self.convert(value, f"{path}[*]", stack)
            elif key == "additionalProperties":
                # True or {}: values of any type, only acceptable with preserve-unknown-fields.
                typed = isinstance(value, dict) and bool(value)
                out[key] = self.convert(value, f"{path}.*", stack) if typed else value
            elif key == "uniqueItems":
                # Kubernetes refuses uniqueItems (quadratic to check); a set list is its answer.
                if value:
                    out.setdefault(LIST_TYPE, "set")
            elif key == "prefixItems":
                raise CRDSchemaError(f"{path}: tuples (prefixItems) are not allowed; use a list or a model")
            else:
                raise CRDSchemaError(f"{path}: JSON schema keyword {key!r} is not supported in a CRD")
        return self.finish(out, path)

    def finish(self, out: dict[str, Any], path: str) -> dict[str, Any]:
        """Kubernetes forms and the structural rules that need the whole node."""
        _kube_bounds(out, "minimum", "exclusiveMinimum", max)
        _kube_bounds(out, "maximum", "exclusiveMaximum", min)
        if "x-kubernetes-list-map-keys" in out:
            _check_map_keys(out, path)
        if out.get(INT_OR_STRING):
            out.pop("type", None)
        if "enum" in out:
            _enum_type(out, path)
        if out.get("type") == "null":
            raise CRDSchemaError(f"{path}: a field that can only be null has no place in a CRD")
        if isinstance(out.get("type"), list):
            raise CRDSchemaError(f"{path}: multiple types {out['type']} are not allowed")
        extra = out.get("additionalProperties")
        if extra is False:
            # Kubernetes prunes unknown fields anyway, and refuses additionalProperties: false.
            del out["additionalProperties"]
        elif extra is True or extra == {}:
            if not out.get(PRESERVE):
                raise CRDSchemaError(
                    f"{path}: values of any type need kube_schema(preserve_unknown_fields=True) "
                    "or a concrete value type"
                )
            del out["additionalProperties"]
        elif extra is not None and "properties" in out:
            raise CRDSchemaError(f"{path}: an object cannot have both properties and additionalProperties")
        if "type" not in out and not out.get(INT_OR_STRING) and not out.get(PRESERVE):
            raise CRDSchemaError(
                f"{path}: no type (Any?); structural schemas need a type, "
                "kube_schema(preserve_unknown_fields=True) or IntOrString"
            )
        return out


def _kube_bounds(out: dict[str, Any], inclusive: str, exclusive: str, stricter: Any) -> None:
    """Draft 2020 numeric ``exclusiveMinimum: 3`` -> ``minimum: 3, exclusiveMinimum: true``."""
    bound = out.get(exclusive)
    if bound is None or isinstance(bound, bool):
        return
    if inclusive in out and stricter(out[inclusive], bound) == out[inclusive] and out[inclusive] != bound:
        del out[exclusive]  # the inclusive bound is already the stricter one
        return
    out[inclusive] = bound
    out[exclusive] = True


def _enum_type(out: dict[str, Any], path: str) -> None:
    """Enums need their type, and cannot be nullable.

    The API server checks a null value against the enum and never finds it,
    even when null is listed, so ``Literal[...] | None`` is emitted without
    ``nullable``: the API server then prunes an explicit null, which pydantic
    reads as the same None.
    """
    values = [v for v in out["enum"] if v is not None]
    out["enum"] = values
    out.pop("nullable", None)
    if not values:
        raise CRDSchemaError(f"{path}: an enum of null only")
    if all(isinstance(v, str) for v in values):
        kind = "string"
    elif all(isinstance(v, bool) for v in values):
        kind = "boolean"
    elif all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        kind = "integer"
    else:
        raise CRDSchemaError(f"{path}: enum values {values!r} mix types")
    if out.get("type", kind) != kind:
        raise CRDSchemaError(f"{path}: enum values {values!r} are not of type {out['type']}")
    out["type"] = kind


def _check_map_keys(out: dict[str, Any], path: str) -> None:
    """The API server insists map keys exist on every item: required or defaulted."""
    items = out.get("items", {})
    props = items.get("properties", {})
    for key in out["x-kubernetes-list-map-keys"]:
        if key not in props:
            raise CRDSchemaError(f"{path}: list map key {key!r} is not a field of the items")
        if key not in items.get("required", []) and "default" not in props[key]:
            raise CRDSchemaError(f"{path}: list map key {key!r} must be required or have a default")


def structural_schema(
    model: type[BaseModel],
    path: str | None = None,
    fields: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model, every ``$ref`` inlined.

    Field names are the aliases (camelCase), as on the wire. ``fields`` gives
    the schema of some top-level fields verbatim (a resource's metadata), and
    makes them optional.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation", schema_generator=_KubeJsonSchema)
    if fields:
        if "properties" not in raw:
            raise CRDSchemaError(f"{path or model.__name__}: not an object with fields")
        raw["properties"] = {**raw["properties"], **fields}
        raw["required"] = [r for r in raw.get("required", []) if r not in fields]
    schema = _Converter(raw.get("$defs", {})).convert(raw, path or model.__name__)
    # pydantic shares default values between uses of a model; callers get their own.
    return copy.deepcopy(schema)


# ---- CRDs ----------------------------------------------------------------------------

_API_VERSION_DOC = (
    "APIVersion defines the versioned schema of this representation of an object. "
    "Servers should convert recognized schemas to the latest internal value, and may "
    "reject unrecognized values."
)
_KIND_DOC = (
    "Kind is a string value representing the REST resource this object represents. "
    "Servers may infer this from the endpoint the client submits requests to. In CamelCase."
)


def _info(model: type[CustomResource[Any, Any]]) -> CRDInfo:
    info = getattr(model, "crd", None)
    if not isinstance(info, CRDInfo):
        raise CRDSchemaError(f"{model.__name__} declares no `crd: ClassVar[CRDInfo]`")
    return info


def _resource_schema(model: type[CustomResource[Any, Any]], info: CRDInfo) -> dict[str, Any]:
    type_meta = {
        "apiVersion": {"type": "string", "description": _API_VERSION_DOC},
        "kind": {"type": "string", "description": _KIND_DOC},
        # The API server owns metadata's schema and refuses anything but its type here.
        "metadata": {"type": "object"},
    }
    schema = structural_schema(model, path=info.kind, fields=type_meta)
    props = schema["properties"]
    if "spec" not in props:
        raise CRDSchemaError(f"{info.kind}: a custom resource needs a spec")
    if info.status_subresource and "status" not in props:
        raise CRDSchemaError(f"{info.kind}: the status subresource is on but there is no status field")
    return schema


def crd_for(model: type[CustomResource[Any, Any]]) -> dict[str, Any]:
    """The ``apiextensions.k8s.io/v1`` CustomResourceDefinition of one kind."""
    info = _info(model)
    names: dict[str, Any] = {
        "kind": info.kind,
        "listKind": f"{info.kind}List",
        "plural": info.plural,
        "singular": info.singular or info.kind.lower(),
    }
    if info.short_names:
        names["shortNames"] = list(info.short_names)
    if info.categories:
        names["categories"] = list(info.categories)
    version: dict[str, Any] = {
        "name": info.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": _resource_schema(model, info)},
    }
    subresources: dict[str, Any] = {}
    if info.status_subresource:
        subresources["status"] = {}
    if info.scale is not None:
        subresources["scale"] = info.scale.to_dict()
    if subresources:
        version["subresources"] = subresources
    if info.printer_columns:
        version["additionalPrinterColumns"] = [c.to_dict() for c in info.printer_columns]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": info.name},
        "spec": {"group": info.group, "names": names, "scope": info.scope, "versions": [version]},
    }


class _Dumper(yaml.SafeDumper):
    """Never anchors and aliases: repeated defaults are written out, as kubectl would show them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _dump(document: dict[str, Any]) -> str:
    return yaml.dump(
        document, Dumper=_Dumper, sort_keys=True, default_flow_style=False, allow_unicode=True, width=100
    )


def _generated(models: Iterable[type[CustomResource[Any, Any]]]) -> dict[str, str]:
    """File name -> content, one per kind, refusing two models for the same CRD."""
    files: dict[str, str] = {}
    for model in models:
        info = _info(model)
        if info.file_name in files:
            raise CRDSchemaError(f"two models define the CRD {info.name}")
        files[info.file_name] = HEADER + _dump(crd_for(model))
    return dict(sorted(files.items()))


def render_crds(models: Iterable[type[CustomResource[Any, Any]]]) -> str:
    """All CRDs as one multi-document YAML, ordered by CRD name, keys sorted."""
    return "---\n".join(_generated(models).values())


def _existing(directory: Path) -> dict[str, Path]:
    if not directory.is_dir():
        return {}
    return {p.name: p for p in directory.iterdir() if p.is_file() and p.suffix in (".yaml", ".yml")}


def write_crds(models: Iterable[type[CustomResource[Any, Any]]], directory: Path) -> list[Path]:
    """Write ``<plural>.<group>.yaml`` per kind and remove YAML files of kinds that are gone.

    The directory holds generated files only (deploy/crds/), so anything else
    in it is stale by definition.
    """
    files = _generated(models)
    directory.mkdir(parents=True, exist_ok=True)
    for name, path in _existing(directory).items():
        if name not in files:
            path.unlink()
    written = []
    for name, content in files.items():
        path = directory / name
        if not path.is_file() or path.read_text() != content:
            path.write_text(content)
        written.append(path)
    return written


def stale_crds(models: Iterable[type[CustomResource[Any, Any]]], directory: Path) -> list[str]:
    """File names in ``directory`` that are missing, differ, or belong to no model."""
    files = _generated(models)
    existing = _existing(directory)
    stale = {
        name
        for name, content in files.items()
        if name not in existing or existing[name].read_text() != content
    }
    stale |= set(existing) - set(files)
    return sorted(stale)
