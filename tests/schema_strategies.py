"""Hypothesis strategies drawn from a CRD's OpenAPI schema: documents the schema allows, and
documents with one field the schema refuses (and which field that is).

The schema is the one the API server enforces (``crd_for``), so a kind that gains a field is
fuzzed on it without a change here. CEL rules (``x-kubernetes-validations``) and webhooks are
not modelled: a document drawn here may still be refused by them, and that refusal must name
its field as any other does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hypothesis import strategies as st

Schema = Mapping[str, Any]
Path = tuple[str | int, ...]

# Bounds for what the schema leaves open: small documents, values a controller can act on.
MAX_ITEMS = 3
MAX_MAP_ENTRIES = 2
INTEGER_SPAN = 1_000
ASCII = st.characters(min_codepoint=32, max_codepoint=126)
TEXT = st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1, max_size=12)
LABEL_KEY = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
DATE_TIME = st.datetimes(datetime(2000, 1, 1), datetime(2100, 1, 1)).map(
    lambda moment: moment.replace(microsecond=0).isoformat() + "Z"
)


def documents(schema: Schema) -> st.SearchStrategy[Any]:
    """Values ``schema`` accepts (types, enums, bounds, patterns, required keys)."""
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    if schema.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 100), st.sampled_from(["1", "25%", "100%"]))
    kind = schema.get("type")
    if kind == "object":
        strategy = _objects(schema)
    elif kind == "array":
        strategy = _arrays(schema)
    elif kind == "string":
        strategy = _strings(schema)
    elif kind == "integer":
        strategy = st.integers(*_bounds(schema))
    elif kind == "number":
        low, high = _bounds(schema)
        strategy = st.floats(low, high, allow_nan=False, allow_infinity=False)
    elif kind == "boolean":
        strategy = st.booleans()
    else:  # x-kubernetes-preserve-unknown-fields with no type: anything a pod spec might carry
        strategy = st.fixed_dictionaries({}, optional={"key": TEXT, "value": TEXT})
    return st.one_of(st.none(), strategy) if schema.get("nullable") else strategy


def _objects(schema: Schema) -> st.SearchStrategy[dict[str, Any]]:
    properties: Mapping[str, Schema] = schema.get("properties") or {}
    if not properties:
        values = schema.get("additionalProperties")
        if isinstance(values, Mapping):
            return st.dictionaries(LABEL_KEY, documents(values), max_size=MAX_MAP_ENTRIES)
        return st.fixed_dictionaries({}, optional={"key": TEXT})
    required = set(schema.get("required") or ())
    return st.fixed_dictionaries(
        {name: documents(sub) for name, sub in properties.items() if name in required},
        optional={name: documents(sub) for name, sub in properties.items() if name not in required},
    )


def _arrays(schema: Schema) -> st.SearchStrategy[list[Any]]:
    items = documents(schema.get("items") or {})
    keys = schema.get("x-kubernetes-list-map-keys")
    unique = schema.get("x-kubernetes-list-type") == "set"
    size = min(int(schema.get("maxItems", MAX_ITEMS)), MAX_ITEMS)
    low = int(schema.get("minItems", 0))
    if keys:
        return st.lists(
            items, min_size=low, max_size=size, unique_by=lambda i: tuple(str(i.get(k)) for k in keys)
        )
    return st.lists(items, min_size=low, max_size=size, unique=unique)


def _strings(schema: Schema) -> st.SearchStrategy[str]:
    low, high = int(schema.get("minLength", 0)), int(schema.get("maxLength", 40))
    if schema.get("format") == "date-time":
        return DATE_TIME
    if "pattern" in schema:
        strategy: st.SearchStrategy[str] = st.from_regex(schema["pattern"], fullmatch=True, alphabet=ASCII)
    else:
        strategy = st.text(ASCII, max_size=high)
    return strategy.filter(lambda text: low <= len(text) <= high)


def _bounds(schema: Schema) -> tuple[int, int]:
    low = int(schema.get("minimum", -INTEGER_SPAN if "maximum" in schema else 0))
    high = int(schema.get("maximum", low + INTEGER_SPAN))
    return low, high


@dataclass(frozen=True)
class Violation:
    """One field set to a value its schema refuses."""

    path: Path
    value: Any

    @property
    def field(self) -> str:
        """The field as the API server names it (``spec.pod.labels``, ``spec.items[0].name``)."""
        text = ""
        for part in self.path:
            text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
        return text


def violations(schema: Schema, path: Path = ()) -> Iterator[Violation]:
    """For every field under ``schema``, values its type, enum, bounds or pattern refuse."""
    if schema.get("x-kubernetes-int-or-string") or ("type" not in schema and "enum" not in schema):
        return  # anything goes (or an int or a string): nothing here is refused by its type
    kind = schema.get("type")
    if "enum" in schema:
        yield Violation(path, "no-such-" + str(path[-1] if path else "value").lower())
    wrong_type = {"string": 12345, "integer": "twelve", "number": "twelve", "boolean": "maybe",
                  "array": "not-a-list", "object": "not-an-object"}  # fmt: skip
    if kind in wrong_type and path:
        yield Violation(path, wrong_type[kind])
    if kind == "integer" and "maximum" in schema:
        yield Violation(path, int(schema["maximum"]) + 1)
    if kind == "integer" and "minimum" in schema:
        yield Violation(path, int(schema["minimum"]) - 1)
    if kind == "string" and "pattern" in schema and not re.search(schema["pattern"], " \t"):
        yield Violation(path, " \t")
    if kind == "object":
        for name, sub in (schema.get("properties") or {}).items():
            yield from violations(sub, (*path, name))
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        yield from violations(schema["items"], (*path, 0))


def with_value(document: Any, path: Path, value: Any) -> Any:
    """``document`` with ``value`` at ``path`` (containers made on the way as needed)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = list(document) if isinstance(document, list) and document else [{}]
        items[0] = with_value(items[0], rest, value)
        return items
    mapping = dict(document) if isinstance(document, dict) else {}
    mapping[head] = with_value(mapping.get(head), rest, value)
    return mapping


__all__ = ["Violation", "documents", "violations", "with_value"]
