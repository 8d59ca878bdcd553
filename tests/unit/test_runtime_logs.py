"""Structured logs: a reconcile's lines carry controller, key and reconcile id; other lines do not."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from kustos.runtime.logs import ContextFilter, JsonFormatter, TextFormatter, reconcile_context, setup_logging

CONTEXT_FIELDS = ("controller", "key", "reconcile_id")


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger("kustos.test.logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        yield logger, stream, handler
    finally:
        logger.handlers.clear()
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_json_lines_carry_the_reconcile_context_only_inside_it(
    capture: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    logger.info("before")
    with reconcile_context("etcd", "team-a/main", "abc123def456"):
        logger.warning("member %s lost", "main-2")
    logger.info("after")
    before, inside, after = (json.loads(line) for line in _lines(stream))
    assert inside["msg"] == "member main-2 lost"
    assert inside["level"] == "warning"
    assert inside["logger"] == "kustos.test.logs"
    assert (inside["controller"], inside["key"], inside["reconcile_id"]) == (
        "etcd",
        "team-a/main",
        "abc123def456",
    )
    assert inside["ts"].endswith("+00:00")
    for outside in (before, after):
        assert not any(field in outside for field in CONTEXT_FIELDS)
        assert outside["level"] == "info"


def test_json_lines_carry_the_exception(
    capture: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    try:
        raise ValueError("bad spec")
    except ValueError:
        logger.exception("reconcile failed")
    [entry] = [json.loads(line) for line in _lines(stream)]
    assert entry["level"] == "error"
    assert "ValueError: bad spec" in entry["error"]
    assert "Traceback" in entry["error"]


def test_text_lines_append_the_reconcile_context_only_inside_it(
    capture: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(TextFormatter("%(levelname)s %(name)s: %(message)s"))
    logger.info("before")
    with reconcile_context("etcd", "team-a/main", "abc123"):
        logger.info("inside")
    logger.info("after")
    assert _lines(stream) == [
        "INFO kustos.test.logs: before",
        "INFO kustos.test.logs: inside controller=etcd key=team-a/main reconcile_id=abc123",
        "INFO kustos.test.logs: after",
    ]


def test_nested_contexts_restore_the_outer_one(
    capture: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())
    with reconcile_context("outer", "a", "1"):
        with reconcile_context("inner", "b", "2"):
            logger.info("x")
        logger.info("y")
    inner, outer = (json.loads(line) for line in _lines(stream))
    assert (inner["controller"], inner["key"], inner["reconcile_id"]) == ("inner", "b", "2")
    assert (outer["controller"], outer["key"], outer["reconcile_id"]) == ("outer", "a", "1")


def test_the_context_is_restored_after_an_exception() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    with pytest.raises(RuntimeError), reconcile_context("c", "k", "r"):
        raise RuntimeError
    ContextFilter().filter(record)
    assert (record.controller, record.key, record.reconcile_id) == (None, None, None)  # type: ignore[attr-defined]


async def test_concurrent_reconciles_keep_their_own_context(
    capture: tuple[logging.Logger, io.StringIO, logging.StreamHandler[io.StringIO]],
) -> None:
    logger, stream, handler = capture
    handler.setFormatter(JsonFormatter())

    async def reconcile(key: str) -> None:
        with reconcile_context("etcd", key, f"id-{key}"):
            for step in range(3):
                logger.info("step %d", step)
                await asyncio.sleep(0)

    await asyncio.gather(*(reconcile(key) for key in ("a", "b", "c")))
    entries = [json.loads(line) for line in _lines(stream)]
    assert len(entries) == 9
    assert all(entry["reconcile_id"] == f"id-{entry['key']}" for entry in entries)
    assert {entry["key"] for entry in entries} == {"a", "b", "c"}


def test_a_record_without_the_filter_formats_without_context() -> None:
    record = logging.LogRecord("plain", logging.INFO, __file__, 1, "hi", None, None)
    assert json.loads(JsonFormatter().format(record))["msg"] == "hi"
    assert TextFormatter("%(message)s").format(record) == "hi"


# ---- setup_logging -----------------------------------------------------------------------

NOISY = ("httpx", "httpx2", "httpcore")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    noisy = {name: logging.getLogger(name).level for name in NOISY}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, value in noisy.items():
            logging.getLogger(name).setLevel(value)


@pytest.mark.usefixtures("restore_logging")
@pytest.mark.parametrize(
    ("level", "expected"), [("debug", logging.DEBUG), ("info", logging.INFO), ("WARNING", 30)]
)
def test_setup_logging_sets_the_root_level(level: str, expected: int) -> None:
    setup_logging(level)
    root = logging.getLogger()
    assert root.level == expected
    assert len(root.handlers) == 1
    for name in NOISY:
        assert logging.getLogger(name).level == logging.WARNING


@pytest.mark.usefixtures("restore_logging")
def test_setup_logging_json_writes_context_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", json_logs=True)
    log = logging.getLogger("kustos.test.setup")
    log.debug("hidden")
    with reconcile_context("etcd", "ns/x", "r1"):
        log.info("shown")
    logging.getLogger("httpx").info("noise")
    [line] = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert (entry["msg"], entry["controller"], entry["key"], entry["reconcile_id"]) == (
        "shown",
        "etcd",
        "ns/x",
        "r1",
    )


@pytest.mark.usefixtures("restore_logging")
def test_setup_logging_text_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("debug")
    with reconcile_context("etcd", "ns/x", "r1"):
        logging.getLogger("kustos.test.setup").debug("details")
    [line] = capsys.readouterr().err.splitlines()
    assert line.endswith("DEBUG kustos.test.setup: details controller=etcd key=ns/x reconcile_id=r1")


@pytest.mark.usefixtures("restore_logging")
def test_setup_logging_rejects_an_unknown_level() -> None:
    with pytest.raises(ValueError, match="Unknown level"):
        setup_logging("chatty")
