"""The fuzzer's strategies (tests/schema_strategies.py) honour the schema they are drawn from:
if they did not, the fuzzed-spec test would blame the API server for the fuzzer's mistakes."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings

from tests.schema_strategies import Violation, documents, violations, with_value

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["size"],
    "properties": {
        "size": {"type": "integer", "minimum": 1, "maximum": 9},
        "mode": {"type": "string", "enum": ["fast", "safe"]},
        "interval": {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "budget": {"x-kubernetes-int-or-string": True},
        "ports": {
            "type": "array",
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
        },
    },
}


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(documents(SCHEMA))
def test_documents_keep_types_bounds_enums_patterns_and_keys(document: dict[str, Any]) -> None:
    assert 1 <= document["size"] <= 9
    assert document.get("mode", "fast") in ("fast", "safe")
    assert re.fullmatch(r"([0-9]+(ms|s|m|h))+", document.get("interval", "1s"))
    assert all(isinstance(v, str) for v in document.get("labels", {}).values())
    names = [port["name"] for port in document.get("ports", [])]
    assert len(names) == len(set(names))


def test_violations_break_one_rule_of_each_field_and_name_it_as_the_api_server_does() -> None:
    found = {(v.field, repr(v.value)) for v in violations(SCHEMA, ("spec",))}
    assert ("spec.size", "'twelve'") in found and ("spec.size", "10") in found and ("spec.size", "0") in found
    assert ("spec.mode", "'no-such-mode'") in found
    assert ("spec.interval", "' \\t'") in found
    assert ("spec.ports[0].name", "12345") in found
    assert not any(field == "spec.budget" for field, _ in found)  # an int or a string: nothing to break


def test_with_value_makes_the_containers_on_the_way() -> None:
    broken = Violation(("spec", "ports", 0, "name"), 12345)
    assert with_value({"spec": {"size": 3}}, broken.path, broken.value) == {
        "spec": {"size": 3, "ports": [{"name": 12345}]}
    }
