"""A real Prometheus (built from its Go module) on loopback, scraping the tests' operator with
the chart's alert rules, and the dashboard's picture drawn from what it stored."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from kustos.devcluster import binaries
from kustos.devcluster.ports import free_port
from kustos.install.dashboard import dashboard

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "helm" / "kustos" / "files" / "prometheus-rules.yaml"


@dataclass
class Prometheus:
    process: subprocess.Popen[bytes]
    url: str
    log_file: Path

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts now pending or firing."""
        response = httpx.get(f"{self.url}/api/v1/alerts", timeout=5)
        response.raise_for_status()
        return list(response.json()["data"]["alerts"])

    def state(self, alert: str, **labels: str) -> str | None:
        """pending, firing, or None when the alert is not active for those labels."""
        for active in self.alerts():
            found = active["labels"]
            if found.get("alertname") == alert and all(found.get(k) == v for k, v in labels.items()):
                return str(active["state"])
        return None

    def query(self, expr: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        response.raise_for_status()
        return list(response.json()["data"]["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": start, "end": end, "step": step}
        response = httpx.get(f"{self.url}/api/v1/query_range", params=params, timeout=10)
        response.raise_for_status()
        return list(response.json()["data"]["result"])

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""


def rules_waiting(seconds: str) -> dict[str, Any]:
    """The chart's rules with every ``for`` shortened to ``seconds``: the test checks what the
    expressions see, not minutes of waiting (promtool's unit tests pin the durations)."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = seconds
    return dict(rules)


@contextmanager
def running_prometheus(target: str, work: Path, interval: str = "1s") -> Iterator[Prometheus]:
    """Prometheus scraping ``target`` (host:port) every ``interval`` and evaluating the rules as often."""
    binaries.build_missing("prometheus")
    work.mkdir(parents=True, exist_ok=True)
    (work / "rules.yaml").write_text(yaml.safe_dump(rules_waiting("3s")))
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": ["rules.yaml"],
        # honor_labels as the chart's ServiceMonitor: the objects' own namespace label stays.
        "scrape_configs": [
            {"job_name": "kustos", "honor_labels": True, "static_configs": [{"targets": [target]}]}
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_file = work / "prometheus.log"
    with log_file.open("ab") as sink:
        process = subprocess.Popen(
            [str(binaries.binary_path("prometheus")), "--config.file", str(work / "prometheus.yml"),
             "--storage.tsdb.path", str(work / "data"), "--web.listen-address", f"127.0.0.1:{port}"],
            stdout=sink, stderr=sink,
        )  # fmt: skip
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}", log_file)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise AssertionError(
                    f"prometheus exited with {process.returncode}:\n{prometheus.log()[-3000:]}"
                )
            try:
                if httpx.get(f"{prometheus.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready within 30s:\n{prometheus.log()[-3000:]}")
            time.sleep(0.2)
        yield prometheus
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def render_dashboard(prometheus: Prometheus, start: float, end: float, out: Path) -> Path:
    """The chart's dashboard drawn with matplotlib from Prometheus's data: a panel per graph, in
    the dashboard's rows and order, every variable taken as "all"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = dashboard()["panels"]
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for panel in panels:
        if panel["type"] == "row":
            rows.append((panel["title"], []))
        else:
            rows[-1][1].append(panel)
    columns = max(len(graphs) for _, graphs in rows)
    columns = min(columns, 3)
    lines = sum((len(graphs) + columns - 1) // columns for _, graphs in rows)
    figure, axes = plt.subplots(lines, columns, figsize=(6 * columns, 2.6 * lines), squeeze=False)
    step = max(1.0, (end - start) / 200)
    line = 0
    for row_title, graphs in rows:
        for i, panel in enumerate(graphs):
            axis = axes[line + i // columns][i % columns]
            for target in panel["targets"]:
                expr = target["expr"].replace('=~"$namespace"', '=~".*"').replace('=~"$cluster"', '=~".*"')
                for series in prometheus.query_range(expr, start, end, step):
                    xs = [float(t) - start for t, _ in series["values"]]
                    ys = [float(v) for _, v in series["values"]]
                    axis.step(xs, ys, where="post", label=_legend(target["legendFormat"], series["metric"]))
            axis.set_title(f"{row_title}: {panel['title']}", fontsize=9, loc="left")
            axis.tick_params(labelsize=7)
            axis.set_xlabel("seconds", fontsize=7)
            if axis.get_legend_handles_labels()[0]:
                axis.legend(fontsize=6, loc="upper left")
            else:
                axis.text(0.5, 0.5, "no data", ha="center", va="center", transform=axis.transAxes, fontsize=8)
        for i in range(len(graphs), ((len(graphs) + columns - 1) // columns) * columns):
            axes[line + i // columns][i % columns].axis("off")
        line += (len(graphs) + columns - 1) // columns
    figure.suptitle(
        "kustos dashboard (rendered from the alert test's Prometheus with matplotlib)", fontsize=11
    )
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=80)
    plt.close(figure)
    return out
