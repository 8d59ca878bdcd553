"""Run the test suite as parallel pytest sessions, each on a control plane of its own.

The integration suite mostly waits: on etcd elections, failure timeouts, kwok's node
timings, operator backoffs. One session on 2 cores leaves the machine idle much of the time.
Two sessions side by side left 41 % of it idle, three still 36 % once the tests' reads were
served in-process (integration/api_reads.py); four keep it busy (6 % idle) and finished in 28-32
minutes against 31-34 for three and 43 for two (docs/benchmarks.md, issue 26 item 5). They
are separate processes, not pytest-xdist workers: a session enters a private mount
namespace at import, which a process with threads (as xdist's workers are) cannot do.

Modules are dealt to sessions by their last known duration (longest first, to the session
with the least so far). Modules that start real nodes share one session: kube-proxy's
nftables table is one per machine. The least-privilege check needs every module's requests:
each session writes what it found unused (``KUSTOS_SHARD_REPORT``) and this runner fails the
run if a permission went unused in every session.

Each run writes to ``$TMPDIR/kustos-tests-*``: every session's JUnit report and its
cluster's state (logs, audit log, etcd data). A passing run removes it; a failed one keeps
the reports and the failing sessions' clusters, and only the newest two failed runs are kept.

Usage: ``python -m tests.shards [--sessions N] [pytest arguments...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from kustos.devcluster.paths import cache_root

REPO = Path(__file__).resolve().parents[1]
INTEGRATION = REPO / "tests" / "integration"
UNIT = "tests/unit"
# Seconds per module from a full run here; a module not listed counts as DEFAULT_SECONDS.
KNOWN_SECONDS = INTEGRATION / "module_seconds.json"
# This machine's figures of its last runs, preferred to the checked-in ones: their median, so that
# one run on a loaded machine does not deal the next (stop 31's did, and that run took 36 minutes).
MEASURED_SECONDS = cache_root() / "module-seconds.json"
# Three: one loaded run cannot deal the next, and a module made faster is dealt on its new time
# after two runs (five kept the real-node modules' old times for three runs, stop 33).
KEPT_RUNS = 3
# Every test of the last run, slowest first, with its session: where the suite's time went.
LAST_RUN_TESTS = cache_root() / "last-run-tests.tsv"
DEFAULT_SECONDS = 60.0
# A failed run keeps its failing sessions' clusters (each up to a few GB) in the temp directory:
# the newest two, marked FINISHED once the run has ended.
KEPT_FAILED_RUNS = 2
FINISHED = "finished"
# How a module that starts real nodes says so (its pytestmark).
REAL_NODES_MARK = "pytest.mark.real_nodes"


@dataclass
class Session:
    """One pytest process and the modules dealt to it."""

    index: int
    modules: list[str] = field(default_factory=list)
    seconds: float = 0.0
    process: subprocess.Popen[str] | None = None

    @property
    def label(self) -> str:
        return chr(ord("a") + self.index)


def module_seconds() -> dict[str, float]:
    figures: dict[str, float] = json.loads(KNOWN_SECONDS.read_text()) if KNOWN_SECONDS.exists() else {}
    figures.update({name: statistics.median(runs[-KEPT_RUNS:]) for name, runs in measured_runs().items()})
    return figures


def measured_runs() -> dict[str, list[float]]:
    """Each module's seconds in this machine's last runs, oldest first (an older file kept one
    figure per module)."""
    found = json.loads(MEASURED_SECONDS.read_text()) if MEASURED_SECONDS.exists() else {}
    return {name: runs if isinstance(runs, list) else [runs] for name, runs in found.items()}


def needs_real_nodes(module: Path) -> bool:
    return REAL_NODES_MARK in module.read_text()


def deal(modules: list[Path], sessions: int, seconds: dict[str, float], unit: bool = True) -> list[Session]:
    """Longest first, each to the session with the least so far; the real-node modules as one
    unit, and the unit tests as one more."""
    units: list[tuple[float, list[str]]] = []
    real = [m for m in modules if needs_real_nodes(m)]
    if real:
        units.append((sum(seconds.get(m.name, DEFAULT_SECONDS) for m in real), [rel(m) for m in real]))
    units += [(seconds.get(m.name, DEFAULT_SECONDS), [rel(m)]) for m in modules if m not in real]
    if unit:
        units.append((seconds.get("unit", DEFAULT_SECONDS), [UNIT]))
    dealt = [Session(i) for i in range(sessions)]
    for cost, paths in sorted(units, key=lambda unit: -unit[0]):
        least = min(dealt, key=lambda s: s.seconds)
        least.modules += paths
        least.seconds += cost
    return [s for s in dealt if s.modules]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def start(session: Session, out: Path, pytest_args: list[str]) -> None:
    env = {**os.environ, "KUSTOS_SHARD_REPORT": str(out / f"least-privilege-{session.label}.json")}
    session.process = subprocess.Popen(
        [sys.executable, "-m", "pytest", *session.modules, *pytest_args,
         f"--basetemp={out / ('session-' + session.label)}", f"--junitxml={out / session.label}.xml"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    threading.Thread(target=relay, args=(session,), daemon=True).start()


def relay(session: Session) -> None:
    """Each session's output, line by line, marked with its letter."""
    assert session.process is not None and session.process.stdout is not None
    for line in session.process.stdout:
        sys.stdout.write(f"[{session.label}] {line}")
        sys.stdout.flush()


def stop_all(sessions: list[Session]) -> None:
    """Interrupt every session as Ctrl-C would, so each tears its cluster down."""
    for s in sessions:
        if s.process and s.process.poll() is None:
            s.process.send_signal(signal.SIGINT)


def interrupted(signum: int, frame: object) -> None:
    """A CI timeout's SIGTERM, handled as Ctrl-C: the sessions tear their clusters down."""
    raise KeyboardInterrupt


def reports(out: Path, sessions: list[Session]) -> list[tuple[str, list[ET.Element]]]:
    """Each session's label and test cases, from its JUnit XML (parsed once: the durations and
    the failures both read it)."""
    found = []
    for s in sessions:
        report = out / f"{s.label}.xml"
        if report.exists():
            found.append((s.label, list(ET.parse(report).iter("testcase"))))
    return found


def record_seconds(cases: list[tuple[str, list[ET.Element]]]) -> None:
    """Add this run's module durations to the last runs', for the next deal."""
    merged = with_run(measured_runs(), passed_module_seconds(cases))
    MEASURED_SECONDS.parent.mkdir(parents=True, exist_ok=True)
    MEASURED_SECONDS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    LAST_RUN_TESTS.write_text("".join(f"{line}\n" for line in slowest_first(cases)))


def slowest_first(cases: list[tuple[str, list[ET.Element]]]) -> list[str]:
    """``seconds, session, test`` per test case, tab-separated, the slowest first."""
    rows = [
        (float(case.get("time") or 0), label, f"{case.get('classname', '')}::{case.get('name', '')}")
        for label, session_cases in cases
        for case in session_cases
    ]
    return [f"{seconds:.1f}\t{label}\t{test}" for seconds, label, test in sorted(rows, reverse=True)]


def passed_module_seconds(cases: list[tuple[str, list[ET.Element]]]) -> dict[str, float]:
    """Seconds per module whose tests all passed or were skipped: a failed one stopped early or
    waited out a timeout, and says nothing of how long it takes."""
    totals: dict[str, float] = {}
    failed: set[str] = set()
    for _label, session_cases in cases:
        for case in session_cases:
            classname = case.get("classname", "")
            if "." not in classname:
                continue  # an error outside any module (collection, a session fixture)
            name = "unit" if classname.startswith("tests.unit") else classname.split(".")[-1] + ".py"
            totals[name] = totals.get(name, 0.0) + float(case.get("time") or 0)
            if case.find("failure") is not None or case.find("error") is not None:
                failed.add(name)
    return {name: round(seconds, 1) for name, seconds in totals.items() if name not in failed}


def with_run(runs: dict[str, list[float]], run: dict[str, float]) -> dict[str, list[float]]:
    """``runs`` with this run's figures appended, each module's last ``KEPT_RUNS`` kept."""
    merged = {name: list(figures) for name, figures in runs.items()}
    for name, seconds in run.items():
        merged[name] = [*merged.get(name, []), seconds][-KEPT_RUNS:]
    return merged


def failures(cases: list[tuple[str, list[ET.Element]]]) -> list[str]:
    """Each failed or erred test of every session, one line each: the sessions' output
    interleaves, and CI shows only the tail of it."""
    lines = []
    for label, session_cases in cases:
        for case in session_cases:
            for kind in ("failure", "error"):
                found = case.find(kind)
                if found is not None:
                    message = (found.get("message") or "").splitlines()[:1]
                    test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
                    lines.append(f"[{label}] {kind.upper()} {test}: {''.join(message)[:300]}")
    return lines


def unused_everywhere(out: Path, sessions: list[Session]) -> list[str]:
    """Permissions that no session used and docs/install.md does not justify (each session that
    started the control plane wrote what it left unused)."""
    reports = [out / f"least-privilege-{s.label}.json" for s in sessions]
    found = [set(json.loads(r.read_text())["unjustified"]) for r in reports if r.exists()]
    return sorted(set.intersection(*found)) if found else []


def drop_passed_sessions(out: Path, sessions: list[Session]) -> None:
    """A failed run keeps the failing sessions' clusters to read (logs, audit, etcd data) and
    every session's report; a passing session's cluster is gigabytes nobody reads."""
    for s in sessions:
        if s.process is not None and s.process.returncode == 0:
            shutil.rmtree(out / f"session-{s.label}", ignore_errors=True)


def prune_old_runs(tmp: Path, kept: int = KEPT_FAILED_RUNS) -> None:
    """Only the newest ``kept`` failed runs stay: each holds a failing session's cluster. A run
    still going (another checkout's suite on this machine) has no FINISHED mark: left alone."""
    runs = sorted(
        (run for run in tmp.glob("kustos-tests-*") if (run / FINISHED).exists()),
        key=lambda run: (run / FINISHED).stat().st_mtime,
        reverse=True,
    )
    for old in runs[kept:]:
        shutil.rmtree(old, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=int(os.environ.get("KUSTOS_TEST_SESSIONS", "4")))
    parser.add_argument("--modules", nargs="*", help="integration modules (default: all, and the unit tests)")
    args, pytest_args = parser.parse_known_args()
    every = sorted(INTEGRATION.glob("test_*.py"))
    modules = [INTEGRATION / Path(m).name for m in args.modules] if args.modules else every
    sessions = deal(modules, max(1, args.sessions), module_seconds(), unit=not args.modules)
    prune_old_runs(Path(tempfile.gettempdir()))
    out = Path(tempfile.mkdtemp(prefix="kustos-tests-"))
    for s in sessions:
        print(f"[{s.label}] about {s.seconds / 60:.0f} min: {' '.join(Path(m).name for m in s.modules)}")
    started = time.monotonic()
    signal.signal(signal.SIGTERM, interrupted)
    try:
        for s in sessions:
            start(s, out, pytest_args)
        codes = [s.process.wait() for s in sessions if s.process]
    except KeyboardInterrupt:
        stop_all(sessions)
        for s in sessions:
            if s.process:
                s.process.wait()
        return 130
    cases = reports(out, sessions)
    record_seconds(cases)
    took = time.monotonic() - started
    print(f"\n{len(sessions)} sessions in {took:.0f} s; exit codes {codes}; reports in {out}")
    failed = any(codes)
    if failed:
        print("\n".join(failures(cases)))
        drop_passed_sessions(out, sessions)
        (out / FINISHED).touch()
    # Only a whole run that passed can say a permission is never needed.
    unused = [] if failed or args.modules else unused_everywhere(out, sessions)
    if unused:
        print("the chart grants permissions no request of any session used and docs/install.md does not "
              "justify:\n" + "\n".join(f"  {g}" for g in unused))  # fmt: skip
        return 1
    if not failed:
        # A passing run's sessions leave about 6 GB (etcd data, audit logs); a few runs filled
        # this machine's disk. A failed run keeps them to read.
        shutil.rmtree(out, ignore_errors=True)
        print(f"passed: {out} removed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
