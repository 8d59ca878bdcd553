"""The chart's Grafana dashboard holds to Grafana's dashboard schema as the Apache-licensed
foundation SDK describes it (Grafana itself is AGPL: never built nor vendored here), has one row
per kind, and asks only for metrics the operator exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.cog import plugins
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as schema
from grafana_foundation_sdk.models import prometheus, timeseries

from kustos.install.dashboard import DASHBOARD_FILE, dashboard

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "kustos"
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
RUNTIME_DOC = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def schema_problems(data: dict[str, Any]) -> list[str]:
    """What Grafana's schema does not know or reads otherwise: decoding into the SDK's models and
    encoding again drops every unknown key and keeps every known one; the schema's defaults are
    the only thing it may add."""
    plugins.register_default_plugins()
    back = json.loads(json.dumps(schema.Dashboard.from_json(data), cls=JSONEncoder))
    problems: list[str] = []

    def compare(ours: Any, theirs: Any, path: str) -> None:
        if isinstance(ours, dict) and isinstance(theirs, dict):
            for key in ours:
                if key not in theirs:
                    problems.append(f"{path}.{key}: not in the schema")
                else:
                    compare(ours[key], theirs[key], f"{path}.{key}")
        elif isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                compare(a, b, f"{path}[{i}]")
        elif ours != theirs:
            problems.append(f"{path}: {ours!r} read as {theirs!r}")

    compare(data, back, "")
    return problems


def test_the_dashboard_holds_to_grafanas_schema() -> None:
    assert schema_problems(dashboard()) == []


def test_the_schema_check_has_teeth() -> None:
    data = dashboard()
    data["panels"][1]["titel"] = "typo"
    data["panels"][1]["options"]["legend"]["placment"] = "bottom"
    assert sorted(schema_problems(data)) == [
        ".panels[1].options.legend.placment: not in the schema",
        ".panels[1].titel: not in the schema",
    ]


def test_panels_decode_as_timeseries_with_prometheus_queries() -> None:
    plugins.register_default_plugins()
    model = schema.Dashboard.from_json(dashboard())
    graphs = [p for p in model.panels or [] if isinstance(p, schema.Panel)]
    assert graphs
    for panel in graphs:
        assert isinstance(panel.options, timeseries.Options), panel.title
        assert all(isinstance(t, prometheus.Dataquery) for t in panel.targets or []), panel.title


def test_one_row_per_kind_and_the_operator() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == ["EtcdCluster", "NodeImage", "MaintenancePolicy", "StorageCluster", "Operator"]


def test_every_query_asks_for_a_documented_metric() -> None:
    metric = re.compile(r"\b((?:kustos|controller_runtime|workqueue|leader)_[a-z_]+)")
    documented = set(metric.findall(METRICS_DOC.read_text() + RUNTIME_DOC.read_text()))
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            names = set(metric.findall(target["expr"]))
            assert names <= documented, f"{panel['title']}: {names - documented} not in docs/metrics.md"


@pytest.mark.parametrize("path", [DASHBOARD_FILE])
def test_the_chart_ships_the_generated_dashboard(path: str) -> None:
    assert json.loads((CHART / path).read_text()) == dashboard()
