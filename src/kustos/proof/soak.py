"""The soak's judge: is the operator flat after scenarios in a loop, or what grew?

The soak samples the operator's /metrics (process RSS and open file descriptors, its asyncio
tasks, and the reconcile time histogram) while scenarios loop. A leak shows as a level that
keeps rising, so the first third of the samples is compared with the last third: medians for
levels (one busy moment does not count), and the mean reconcile time of each window from the
histogram's sum and count. Growth within both a ratio and an absolute margin is noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Limits", "Sample", "sample_of", "soak_summary", "what_grew"]

MIB = 1024 * 1024
RECONCILE_TIME = "controller_runtime_reconcile_time_seconds"


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the soak began
    rss: float  # bytes
    open_fds: float
    tasks: float
    reconciles: float  # reconciles finished so far (every controller)
    reconcile_seconds: float  # their total time


def _total(metrics: Mapping[str, float], name: str) -> float:
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def sample_of(at: float, metrics: Mapping[str, float]) -> Sample:
    """One sample from a parsed /metrics page (``name{labels}`` -> value)."""
    return Sample(
        at=at,
        rss=metrics["process_resident_memory_bytes"],
        open_fds=metrics["process_open_fds"],
        tasks=metrics["kustos_asyncio_tasks"],
        reconciles=_total(metrics, RECONCILE_TIME + "_count"),
        reconcile_seconds=_total(metrics, RECONCILE_TIME + "_sum"),
    )


@dataclass(frozen=True)
class Limits:
    """How much a level may rise from the first third to the last before it counts as growth:
    beyond the ratio *and* the margin."""

    rss_ratio: float = 1.25
    rss_margin: float = 24 * MIB
    fds_ratio: float = 1.25
    fds_margin: float = 16
    tasks_ratio: float = 1.5
    tasks_margin: float = 24
    latency_ratio: float = 4.0
    latency_margin: float = 1.0  # seconds: a busy shared machine slows every reconcile


@dataclass(frozen=True)
class _Windows:
    first: Sequence[Sample]
    last: Sequence[Sample]

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> _Windows:
        if len(samples) < 6:
            raise ValueError(f"a soak needs at least 6 samples to judge, it has {len(samples)}")
        third = len(samples) // 3
        return cls(samples[:third], samples[-third:])

    def levels(self, level: Callable[[Sample], float]) -> tuple[float, float]:
        return statistics.median(map(level, self.first)), statistics.median(map(level, self.last))

    def latencies(self) -> tuple[float | None, float | None]:
        return _mean_reconcile(self.first), _mean_reconcile(self.last)


def _mean_reconcile(window: Sequence[Sample]) -> float | None:
    """Mean reconcile time within a window (None when no reconcile finished in it)."""
    count = window[-1].reconciles - window[0].reconciles
    return (window[-1].reconcile_seconds - window[0].reconcile_seconds) / count if count > 0 else None


def _grew(before: float, after: float, ratio: float, margin: float) -> bool:
    return after > before * ratio and after - before > margin


def what_grew(samples: Sequence[Sample], limits: Limits = Limits()) -> list[str]:
    """One sentence per quantity that grew beyond its limits (empty: flat)."""
    windows = _Windows.of(samples)
    grown: list[str] = []
    rss = windows.levels(lambda s: s.rss)
    if _grew(*rss, limits.rss_ratio, limits.rss_margin):
        grown.append(f"RSS grew from {rss[0] / MIB:.0f} MiB to {rss[1] / MIB:.0f} MiB")
    fds = windows.levels(lambda s: s.open_fds)
    if _grew(*fds, limits.fds_ratio, limits.fds_margin):
        grown.append(f"open file descriptors grew from {fds[0]:.0f} to {fds[1]:.0f}")
    tasks = windows.levels(lambda s: s.tasks)
    if _grew(*tasks, limits.tasks_ratio, limits.tasks_margin):
        grown.append(f"asyncio tasks grew from {tasks[0]:.0f} to {tasks[1]:.0f}")
    first, last = windows.latencies()
    if (
        first is not None
        and last is not None
        and _grew(first, last, limits.latency_ratio, limits.latency_margin)
    ):
        grown.append(f"mean reconcile time grew from {first:.2f} s to {last:.2f} s")
    return grown


def soak_summary(samples: Sequence[Sample]) -> str:
    """First third against last third, for the report (and a failure's message)."""
    windows = _Windows.of(samples)
    rss, fds, tasks = (windows.levels(lambda s: s.rss), windows.levels(lambda s: s.open_fds),
                       windows.levels(lambda s: s.tasks))  # fmt: skip
    first, last = windows.latencies()
    latency = "n/a" if first is None or last is None else f"{first:.3f} → {last:.3f} s"
    return (
        f"over {samples[-1].at - samples[0].at:.0f} s, {len(samples)} samples: "
        f"RSS {rss[0] / MIB:.0f} → {rss[1] / MIB:.0f} MiB, open fds {fds[0]:.0f} → {fds[1]:.0f}, "
        f"asyncio tasks {tasks[0]:.0f} → {tasks[1]:.0f}, mean reconcile {latency}"
    )
