"""The chart's alert rules pass promtool's checks and its unit tests: each alert fires on the
series that should page someone and stays quiet on the ones that should not
(tests/unit/alerts/kustos_test.yaml); each has a summary and a runbook section.

promtool is built from its pinned Go module when missing, as helm is for test_chart.py:
nothing here skips.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kustos.devcluster import binaries

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "helm" / "kustos" / "files" / "prometheus-rules.yaml"
RULE_TESTS = Path(__file__).parent / "alerts" / "kustos_test.yaml"
RUNBOOK = REPO / "docs" / "runbook.md"


@pytest.fixture(scope="module")
def promtool() -> Path:
    binaries.build_missing("promtool")
    return binaries.binary_path("promtool")


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, cwd=cwd, check=False)


def test_promtool_checks_the_rules(promtool: Path) -> None:
    result = _run(promtool, "check", "rules", RULES)

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_each_alert_fires_when_it_should_and_only_then(promtool: Path, tmp_path: Path) -> None:
    groups = yaml.safe_load(RULES.read_text())
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # wording is not what these tests pin (see the test file)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(groups))
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)

    result = _run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_unit_tested_says_what_to_do_and_has_a_runbook_section() -> None:
    tested = {
        case["alertname"]
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    headings = {line[3:].strip() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    for alert in _alerts():
        name = alert["alert"]
        assert name in tested, f"{name} has no promtool test that fires it"
        assert name in headings, f"{name} has no section in docs/runbook.md"
        assert alert["annotations"]["summary"].strip(), name
        assert alert["annotations"]["runbook_url"].endswith(f"docs/runbook.md#{name.lower()}"), name
        assert alert["labels"]["severity"] in ("warning", "critical"), name
