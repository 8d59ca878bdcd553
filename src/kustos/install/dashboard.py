"""The Grafana dashboard the chart ships (files/dashboard.json, in a ConfigMap labelled
grafana_dashboard: "1"): one row per kind, from the domain metrics of docs/metrics.md, and one
for the operator itself. Generated, never edited (``kustos chart --write``); a unit test checks
it against Grafana's dashboard schema through the Apache-licensed foundation SDK."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

DASHBOARD_FILE = "files/dashboard.json"
UID = "kustos-overview"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The dashboard schema version of Grafana 11.6, the one the foundation SDK describes.
SCHEMA_VERSION = 41

NN = 'namespace=~"$namespace", name=~"$cluster"'


@dataclass(frozen=True)
class Graph:
    title: str
    queries: tuple[tuple[str, str], ...]
    """(PromQL, legend) pairs."""
    unit: str = "short"
    description: str = ""


@dataclass(frozen=True)
class Row:
    title: str
    graphs: tuple[Graph, ...]


def per_cluster(metric: str, by: str = "namespace, name") -> str:
    """The metric of the chosen clusters, one series per object (every replica exports it)."""
    return f"max by ({by}) ({metric}{{{NN}}})"


C = "{{namespace}}/{{name}}"

ROWS: tuple[Row, ...] = (
    Row(
        "EtcdCluster",
        (
            Graph(
                "Healthy voters / desired members",
                (
                    (per_cluster("kustos_etcdcluster_healthy_voters"), f"{C} healthy"),
                    (per_cluster("kustos_etcdcluster_desired_members"), f"{C} desired"),
                ),
                description="Healthy voting members against spec.size.",
            ),
            Graph(
                "Quorum margin",
                ((per_cluster("kustos_etcdcluster_quorum_margin"), C),),
                description="0: one more failure loses quorum; below 0: lost.",
            ),
            Graph(
                "Leader (member index) and learners",
                (
                    (per_cluster("kustos_etcdcluster_leader_member_index"), f"{C} leader"),
                    (per_cluster("kustos_etcdcluster_learners"), f"{C} learners"),
                ),
            ),
            Graph(
                "Backend used of quota",
                (
                    (
                        per_cluster("kustos_etcd_member_backend_bytes", "namespace, name, member")
                        + " / "
                        + per_cluster("kustos_etcd_member_backend_quota_bytes", "namespace, name, member"),
                        "{{namespace}}/{{member}}",
                    ),
                ),
                unit="percentunit",
            ),
            Graph(
                "Age of the last good backup",
                (("time() - " + per_cluster("kustos_etcdcluster_last_backup_timestamp_seconds"), C),),
                unit="s",
            ),
            Graph(
                "Leader changes, rebuilds, alarms",
                (
                    (
                        "max by (namespace, name) "
                        f"(increase(kustos_etcdcluster_leader_changes_total{{{NN}}}[1h]))",
                        f"{C} leader changes/h",
                    ),
                    (per_cluster("kustos_etcdcluster_rebuilds_total"), f"{C} rebuilds"),
                    (
                        f"count by (namespace, name, alarm) (kustos_etcdcluster_alarm{{{NN}}})",
                        f"{C} {{{{alarm}}}}",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "NodeImage",
        (
            Graph(
                "Nodes by rollout state",
                (("max by (name, state) (kustos_nodeimage_nodes)", "{{name}} {{state}}"),),
            ),
            Graph(
                "Blocked, and why",
                (("max by (name, reason) (kustos_nodeimage_blocked) == 1", "{{name}} {{reason}}"),),
            ),
        ),
    ),
    Row(
        "MaintenancePolicy",
        (
            Graph(
                "Dead nodes and refusals",
                (
                    ("max by (name) (kustos_maintenance_dead_nodes)", "{{name}} dead nodes"),
                    (
                        "count by (name, action) (kustos_maintenance_refusal_timestamp_seconds)",
                        "{{name}} {{action}} refused",
                    ),
                ),
            ),
            Graph(
                "Nodes cleared, purged, refused",
                (
                    (
                        "max by (name, action, outcome) (increase(kustos_maintenance_actions_total[1h]))",
                        "{{name}} {{action}} {{outcome}}/h",
                    ),
                    (
                        "max by (name) (increase(kustos_maintenance_nodes_purged_total[1h]))",
                        "{{name}} nodes purged/h",
                    ),
                ),
                description="Counted by the leading replica since it started (a restart resets them).",
            ),
        ),
    ),
    Row(
        "StorageCluster",
        (
            Graph(
                "Ready nodes / nodes",
                (
                    (per_cluster("kustos_storagecluster_ready_nodes"), f"{C} ready"),
                    (per_cluster("kustos_storagecluster_nodes"), f"{C} nodes"),
                ),
            ),
        ),
    ),
    Row(
        "Operator",
        (
            Graph(
                "Reconciles and errors per second",
                (
                    ("sum by (controller) (rate(controller_runtime_reconcile_total[5m]))", "{{controller}}"),
                    (
                        "sum by (controller) (rate(controller_runtime_reconcile_errors_total[5m]))",
                        "{{controller}} errors",
                    ),
                ),
                unit="reqps",
            ),
            Graph(
                "Leading replicas and queue depth",
                (
                    ("sum by (name) (leader_election_master_status)", "leaders of {{name}}"),
                    ("max by (name) (workqueue_depth)", "queue {{name}}"),
                ),
            ),
        ),
    ),
)


def _panel(graph: Graph, panel_id: int, x: int, y: int, width: int) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "description": graph.description,
        "fieldConfig": {"defaults": {"unit": graph.unit}, "overrides": []},
        "gridPos": {"h": 8, "w": width, "x": x, "y": y},
        "id": panel_id,
        "options": {
            "legend": {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "targets": [
            {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
            for i, (expr, legend) in enumerate(graph.queries)
        ],
        "title": graph.title,
        "type": "timeseries",
    }


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "type": "query",
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, panel_id = 0, 1
    for row in ROWS:
        grid = {"h": 1, "w": 24, "x": 0, "y": y}
        panels.append(
            {
                "collapsed": False,
                "gridPos": grid,
                "id": panel_id,
                "panels": [],
                "title": row.title,
                "type": "row",
            }
        )
        y, panel_id = y + 1, panel_id + 1
        width = 8 if len(row.graphs) > 2 else 12
        for i, graph in enumerate(row.graphs):
            x = (i * width) % 24
            if i and x == 0:
                y += 8
            panels.append(_panel(graph, panel_id, x, y, width))
            panel_id += 1
        y += 8
    datasource = {"name": "datasource", "label": "Prometheus", "query": "prometheus", "type": "datasource"}
    return {
        "description": "kustos: EtcdClusters, node rollouts, node maintenance, storage and the operator "
        "(docs/metrics.md; alerts in docs/runbook.md)",
        "editable": False,
        "panels": panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["kustos", "etcd"],
        "templating": {
            "list": [
                datasource,
                _variable("namespace", "Namespace", "label_values(kustos_etcdcluster_members, namespace)"),
                _variable(
                    "cluster",
                    "EtcdCluster",
                    'label_values(kustos_etcdcluster_members{namespace=~"$namespace"}, name)',
                ),
            ]
        },
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "utc",
        "title": "kustos",
        "uid": UID,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"
