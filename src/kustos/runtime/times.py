"""Times as Kubernetes writes them: RFC 3339 timestamps (UTC, whole seconds or micro), Go-style durations."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_rfc3339(moment: datetime) -> str:
    """A MicroTime (a Lease's acquireTime and renewTime): RFC 3339 with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def parse_duration(text: str) -> timedelta:
    """Go-style durations as the spec takes them: 90s, 5m, 1h30m, 500ms."""
    total, number = 0.0, ""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    i = 0
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    return timedelta(seconds=total)


def cron_ticks(schedule: str, after: datetime) -> Iterator[datetime]:
    """The ticks of a five-field cron ``schedule`` (UTC) after ``after``. An invalid schedule
    raises ValueError, at once or at the first tick (one that never fires, as Feb 30). cronsim
    (~0.9 MiB resident) is imported by the first call: an operator with no schedule never
    loads it."""
    from cronsim import CronSim, CronSimError

    try:
        ticks = CronSim(schedule, after)
    except CronSimError as err:
        raise ValueError(f"invalid cron schedule {schedule!r}: {err}") from err
    while True:
        try:
            yield next(ticks)
        except (CronSimError, StopIteration) as err:
            raise ValueError(f"cron schedule {schedule!r} has no tick after {after}") from err
