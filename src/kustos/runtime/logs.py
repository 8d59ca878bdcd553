"""Structured logs: every line of a reconcile carries its controller, object key and id."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

_controller: contextvars.ContextVar[str | None] = contextvars.ContextVar("controller", default=None)
_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("key", default=None)
_reconcile_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("reconcile_id", default=None)


@contextlib.contextmanager
def reconcile_context(controller: str, key: str, reconcile_id: str) -> Iterator[None]:
    tokens = (_controller.set(controller), _key.set(key), _reconcile_id.set(reconcile_id))
    try:
        yield
    finally:
        _reconcile_id.reset(tokens[2])
        _key.reset(tokens[1])
        _controller.reset(tokens[0])


def current_controller() -> str | None:
    """The controller whose reconcile this code runs in (None: outside any reconcile)."""
    return _controller.get()


class ContextFilter(logging.Filter):
    """Copies the reconcile context onto each record, so every formatter can show it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.controller = _controller.get()
        record.key = _key.get()
        record.reconcile_id = _reconcile_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for attribute in ("controller", "key", "reconcile_id"):
            value = getattr(record, attribute, None)
            if value:
                entry[attribute] = value
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{a}={getattr(record, a)}"
            for a in ("controller", "key", "reconcile_id")
            if getattr(record, a, None)
        )
        return f"{line} {context}" if context else line


def setup_logging(level: str = "info", json_logs: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        JsonFormatter() if json_logs else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
