"""Where a test run's CPU goes: CPU seconds per kind of process, sampled from /proc.

Whether a run of the suite waits on the 2 cores or on timers, and which processes the cores
were busy with (issue 26, item 5), so that cuts go where the time is.
Processes are sampled every ``--interval`` seconds; one that lives a shorter time is missed,
and the difference to the machine's whole CPU time (``/proc/stat``) is printed as "unsampled"
(short ``kubectl``, ``etcdctl`` and ``kustos`` CLI calls, mostly).

Usage: ``python -m benchmarks.suite_cpu --seconds 2700 [--interval 5]`` beside a run, or
``python -m benchmarks.suite_cpu --while-pid PID``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
PYTHON_KINDS = (
    ("kustos.cli run", "operator (kustos run)"),
    ("kustos run", "operator (kustos run)"),
    ("pytest", "pytest (tests, recorders)"),
    ("moto", "moto (cloud fakes)"),
    ("kustos", "kustos CLI / agents"),
)


def kind(cmdline: str) -> str:
    """A short name for what a process is, from its command line."""
    argv = cmdline.split()
    if not argv:
        return "(kernel threads)"
    program = Path(argv[0]).name.split("-v")[0]
    if "python" in program:
        return next((name for needle, name in PYTHON_KINDS if needle in cmdline), "python (other)")
    if program == "etcd":
        return "etcd (control plane)" if "--name=node0" in cmdline else "etcd (members)"
    return program


@dataclass
class Seen:
    """One process: its CPU seconds when first and last sampled."""

    first: float
    last: float
    cmdline: str


def sample(into: dict[tuple[str, str], Seen]) -> None:
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            stat = (process / "stat").read_text()
            cmdline = (process / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ProcessLookupError):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        seconds = (int(fields[11]) + int(fields[12])) / HZ
        key = (process.name, fields[19])  # pid and start time: a reused pid is another process
        if key in into:
            into[key].last = seconds
        else:
            into[key] = Seen(seconds, seconds, cmdline)


def machine_seconds() -> float:
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return (sum(int(v) for v in cpu) - int(cpu[3]) - int(cpu[4])) / HZ  # all but idle and iowait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--while-pid", type=int)
    parser.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args()
    seen: dict[tuple[str, str], Seen] = {}
    sample(seen)
    at_start = {key: process.first for key, process in seen.items()}
    machine_start, started = machine_seconds(), time.monotonic()

    watched: int | None = args.while_pid
    seconds: float = args.seconds

    def running() -> bool:
        if watched:
            return Path(f"/proc/{watched}").exists()
        return time.monotonic() - started < seconds

    while running():
        time.sleep(args.interval)
        sample(seen)
    wall = time.monotonic() - started
    busy = machine_seconds() - machine_start
    by_kind: dict[str, float] = {}
    for key, process in seen.items():
        name = kind(process.cmdline)
        by_kind[name] = by_kind.get(name, 0.0) + process.last - at_start.get(key, 0.0)
    sampled = sum(by_kind.values())
    print(f"{wall:.0f} s of wall time, {busy:.0f} CPU-s busy ({busy / wall:.2f} cores of {os.cpu_count()})")
    for name, spent in sorted(by_kind.items(), key=lambda item: -item[1])[:20]:
        print(f"{spent:9.1f}  {100 * spent / busy:5.1f} %  {name}")
    unsampled = busy - sampled
    print(f"{unsampled:9.1f}  {100 * unsampled / busy:5.1f} %  unsampled (shorter than one interval)")


if __name__ == "__main__":
    main()
