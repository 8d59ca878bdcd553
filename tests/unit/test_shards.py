"""How the suite's sessions learn each module's duration for the next deal."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import shards


def case(classname: str, seconds: float, outcome: str = "") -> ET.Element:
    element = ET.Element("testcase", classname=classname, name="t", time=str(seconds))
    if outcome:
        ET.SubElement(element, outcome, message="boom")
    return element


def test_a_module_with_a_failed_test_teaches_nothing_and_the_others_add_up() -> None:
    cases = [
        (
            "a",
            [
                case("tests.integration.test_x", 10),
                case("tests.integration.test_x", 5),
                case("tests.integration.test_y", 900, "failure"),
            ],
        ),
        (
            "b",
            [
                case("tests.unit.test_p", 1),
                case("tests.unit.test_q", 2),
                case("tests.integration.test_z", 3, "error"),
                case("", 4, "error"),
            ],
        ),
    ]
    assert shards.passed_module_seconds(cases) == {"test_x.py": 15.0, "unit": 3.0}


def test_one_slow_run_does_not_move_the_median_and_old_runs_are_forgotten(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs: dict[str, list[float]] = {"test_x.py": [100.0]}  # an older file's single figure, read as one run
    for seconds in (110.0, 105.0, 300.0, 95.0, 102.0):  # one run on a loaded machine
        runs = shards.with_run(runs, {"test_x.py": seconds})
    assert runs["test_x.py"] == [300.0, 95.0, 102.0]
    measured = tmp_path / "module-seconds.json"
    monkeypatch.setattr(shards, "MEASURED_SECONDS", measured)
    monkeypatch.setattr(shards, "KNOWN_SECONDS", tmp_path / "none.json")
    # A file an older runner kept five runs in: its last three count.
    measured.write_text('{"test_x.py": [110.0, 105.0, 300.0, 95.0, 102.0], "test_old.py": 42.0}')
    assert shards.module_seconds() == {"test_x.py": 102.0, "test_old.py": 42.0}


def test_a_module_made_faster_is_dealt_on_its_new_time_after_two_runs() -> None:
    """Stop 33's real nodes: 1,000 s of module time gone at once; five runs of memory dealt
    the next run on the old figures, and the real-node session ended 325 s before the last."""
    runs: dict[str, list[float]] = {"test_real.py": [500.0, 520.0, 480.0]}
    for seconds in (130.0, 125.0):
        runs = shards.with_run(runs, {"test_real.py": seconds})
    assert shards.statistics.median(runs["test_real.py"]) == 130.0


def test_the_last_runs_tests_are_listed_slowest_first_with_their_session() -> None:
    cases = [("a", [case("tests.integration.test_x", 10)]), ("b", [case("tests.unit.test_p", 90.25)])]
    assert shards.slowest_first(cases) == [
        "90.2\tb\ttests.unit.test_p::t",
        "10.0\ta\ttests.integration.test_x::t",
    ]


def test_a_failed_run_keeps_only_its_failing_clusters_and_the_newest_two_runs(tmp_path: Path) -> None:
    run = tmp_path / "kustos-tests-new"
    sessions = [shards.Session(0), shards.Session(1)]
    for s, code in zip(sessions, (1, 0), strict=True):
        (run / f"session-{s.label}").mkdir(parents=True)
        (run / f"{s.label}.xml").write_text("<testsuites/>")
        s.process = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"], text=True)
        s.process.wait()
    shards.drop_passed_sessions(run, sessions)
    assert sorted(p.name for p in run.iterdir()) == ["a.xml", "b.xml", "session-a"]

    for age, name in enumerate(("newest", "older", "oldest")):
        (tmp_path / f"kustos-tests-{name}").mkdir()
        mark = tmp_path / f"kustos-tests-{name}" / shards.FINISHED
        mark.touch()
        os.utime(mark, (1_000_000 - age, 1_000_000 - age))
    shards.prune_old_runs(tmp_path)
    # The run without its mark is still going (or another checkout's): never touched.
    left = sorted(p.name for p in tmp_path.glob("kustos-tests-*"))
    assert left == ["kustos-tests-new", "kustos-tests-newest", "kustos-tests-older"]
