"""The summary of which integration modules ran pods on the process runner, without a reason."""

from __future__ import annotations

from pathlib import Path

from tests.integration.runner_use import RunnerUse

STARTED = (
    "2026-11-26 07:00:00,0 INFO kustos.devcluster.runner: starting pod {} on pytest-1-worker-1 at 10.6.2.1\n"
)


def test_pods_started_during_a_module_count_for_it_and_a_half_written_line_waits(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text(STARTED.format("ns/a-0") + "INFO something else\n" + STARTED.format("ns/b-0")[:30])
    use = RunnerUse(log)
    use.count("tests/integration/test_a.py")
    with log.open("a") as more:
        more.write(STARTED.format("ns/b-0")[30:])
    use.count("tests/integration/test_b.py")

    assert use.pods == {
        "tests/integration/test_a.py": {"ns/a-0"},
        "tests/integration/test_b.py": {"ns/b-0"},
    }


def test_the_summary_names_modules_without_a_reason_and_reasons_without_pods(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text(STARTED.format("ns/a-0") + STARTED.format("ns/a-1"))
    use = RunnerUse(log)
    use.count("test_a.py")
    use.count("test_b.py")  # nothing new

    lines = use.report({"test_a.py": None, "test_b.py": "a reason", "test_c.py": None})

    assert lines == [
        "test_a.py: 2 pods on the process runner, no reason given (pytest.mark.process_runner)",
        "test_b.py: gives a reason for the process runner but ran no pod on it",
    ]


def test_a_session_whose_agent_never_logged_reports_nothing(tmp_path: Path) -> None:
    use = RunnerUse(tmp_path / "absent.log")
    use.count("test_a.py")
    assert use.report({"test_a.py": None}) == []
