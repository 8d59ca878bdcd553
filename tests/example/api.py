"""Example: a small kind that exercises every schema rule of the CRD generator.

Tests of the generator and of the controller runtime share it; keep its shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from kustos.api.common import Condition
from kustos.runtime.crd import (
    CRDInfo,
    CustomResource,
    IntOrString,
    KubeModel,
    PrinterColumn,
    Rule,
    kube_schema,
    list_map,
)


class ExampleItem(KubeModel):
    """A named value; items form a map keyed by name."""

    name: str
    value: int = 0


class ExampleSpec(KubeModel):
    """What the user wants."""

    model_config = ConfigDict(
        json_schema_extra=kube_schema(
            rules=[
                Rule(
                    "self.replicas <= 5 || self.mode == 'copy'",
                    "replicas above 5 need mode copy",
                    field_path=".replicas",
                )
            ]
        )
    )

    message: str = Field(min_length=1, max_length=256)
    """The text to process."""
    replicas: int = Field(default=1, ge=0, le=9)
    """How many copies."""
    mode: Literal["copy", "upper"] = "copy"
    """copy keeps the message, upper upper-cases it."""
    port: IntOrString | None = None
    """A port number or name."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels for what the controller creates."""
    items: list[ExampleItem] = Field(default_factory=list, json_schema_extra=list_map("name"))
    """Named values, at most one per name."""
    extra: dict[str, Any] | None = Field(
        default=None, json_schema_extra=kube_schema(preserve_unknown_fields=True)
    )
    """Arbitrary content, kept as given."""


class ExampleStatus(KubeModel):
    """What the controller observed."""

    phase: str | None = None
    ready: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))


class Example(CustomResource[ExampleSpec, ExampleStatus]):
    """An example resource for tests."""

    crd = CRDInfo(
        group="example.kustos.dev",
        version="v1alpha1",
        kind="Example",
        plural="examples",
        short_names=("ex",),
        scope="Namespaced",
        status_subresource=True,
        printer_columns=(
            PrinterColumn("READY", ".status.ready", "string"),
            PrinterColumn("PHASE", ".status.phase", "string"),
            PrinterColumn("AGE", ".metadata.creationTimestamp", "date"),
        ),
    )
