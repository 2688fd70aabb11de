"""Log lines: one per record whatever a caller sends, in text and in JSON."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import sys
import threading
from collections.abc import Iterator

import pytest

from carmy_worker import logs
from carmy_worker.logs import JsonFormatter, TextFormatter

FORGED = "tool\n2026-11-30 12:00:00,000 INFO carmy.api request outcome=completed"


def record(message: str = "request %s", *args: object, **fields: object) -> logging.LogRecord:
    r = logging.LogRecord("carmy.api", logging.INFO, __file__, 1, message, args, None)
    r.carmy = fields
    return r


def test_a_newline_in_a_field_cannot_forge_a_text_line() -> None:
    line = TextFormatter().format(record(tool=FORGED, status_code=404))
    assert "\n" not in line
    assert 'tool="tool\\n2026-11-30 12:00:00,000 INFO carmy.api request outcome=completed"' in line
    assert line.endswith(" status_code=404")


def test_a_newline_in_the_message_cannot_forge_a_text_line() -> None:
    assert "\n" not in TextFormatter().format(record("unknown tool %s", FORGED))


def test_plain_values_stay_unquoted() -> None:
    line = TextFormatter().format(record(tool="search_products", duration_ms=1.5))
    assert line.endswith(" tool=search_products duration_ms=1.5")


def test_a_traceback_still_spans_its_lines() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        r = logging.LogRecord("carmy.worker", logging.ERROR, __file__, 1, "tool raised", (), sys.exc_info())
    assert "Traceback (most recent call last)" in TextFormatter().format(r).splitlines()[1]


def test_json_lines_keep_the_value_exactly() -> None:
    line = JsonFormatter().format(record(tool=FORGED))
    assert "\n" not in line
    assert json.loads(line)["tool"] == FORGED


def test_json_lines_are_json_dumps_bytes() -> None:
    # People and tests grep the log for '"event": "execution"': the spacing and the escaping
    # stay json.dumps's. A field named like a base key does not replace it; other values are str()ed.
    r = record("request", event="request", tool="café", status_code=200, replayed=False, error_code=None,
               level="forged", at=logging.INFO.__class__)
    r.created, r.msecs = 1764460800.25, 250.0
    assert JsonFormatter().format(r) == json.dumps({
        "ts": "2025-11-30T00:00:00.250Z", "level": "info", "logger": "carmy.api", "message": "request",
        "event": "request", "tool": "café", "status_code": 200, "replayed": False, "error_code": None,
        "at": "<class 'int'>",
    })



def test_an_exception_ending_a_thread_is_a_log_line(caplog: pytest.LogCaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A thread a tool starts and leaves behind may crash: its traceback is an error line of the
    # log, in its format, not bare text printed in the middle of it.
    def crash() -> None:
        raise RuntimeError("left behind")

    root = logging.getLogger()
    handlers, level, hook = root.handlers[:], root.level, threading.excepthook
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):  # set by configure
        monkeypatch.setattr(logging, name, getattr(logging, name))
    try:
        logs.configure("json")
        root.handlers[:], root.level = handlers, level  # keep only the hook, and pytest's capture
        thread = threading.Thread(target=crash, name="stray")
        with caplog.at_level(logging.ERROR):
            thread.start()
            thread.join(5)
    finally:
        root.handlers[:], root.level, threading.excepthook = handlers, level, hook
    [line] = caplog.records
    assert line.getMessage() == "uncaught exception in thread stray"
    assert line.exc_info is not None and repr(line.exc_info[1]) == "RuntimeError('left behind')"


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """``logs.configure("json")`` writing to a buffer, undone afterwards (pytest's capture included)."""
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    for name in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing", "_handler"):
        target = logs if name == "_handler" else logging
        monkeypatch.setattr(target, name, getattr(target, name))
    root = logging.getLogger()
    handlers, level, hook = root.handlers[:], root.level, threading.excepthook
    try:
        logs.configure("json")
        yield stream
    finally:
        root.handlers[:], root.level, threading.excepthook = handlers, level, hook


def alone() -> None:
    """Only the handler ``configure`` set up, as in a served process: pytest adds its capture
    handler to the root for each phase of a test."""
    assert logs._handler is not None
    logging.getLogger().handlers[:] = [logs._handler]


FIELDS = {"event": "request", "tool": "café\n", "status_code": 200, "replayed": False, "error_code": None}


def test_info_line_is_the_line_logger_info_writes(configured: io.StringIO) -> None:
    alone()
    log = logging.getLogger("carmy.api")
    logs.info_line(log, "request", FIELDS)  # off the event loop: written at once
    log.info("request", extra={"carmy": FIELDS})
    fast, slow = configured.getvalue().splitlines()
    # Byte for byte, but for the time of day (the two lines may be a millisecond apart).
    assert re.fullmatch(r'\{"ts": "\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", (.*)', fast)
    assert fast.partition('Z", ')[2] == slow.partition('Z", ')[2]


async def test_lines_of_a_loop_turn_are_written_together_and_in_order(configured: io.StringIO) -> None:
    alone()
    log = logging.getLogger("carmy.api")
    logs.info_line(log, "request", {**FIELDS, "n": 1})
    logs.info_line(log, "request", {**FIELDS, "n": 2})
    assert configured.getvalue() == ""  # waiting for the end of this turn
    log.warning("not a request")  # any other record goes out after the lines logged before it
    logs.info_line(log, "request", {**FIELDS, "n": 3})
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    lines = [json.loads(line) for line in configured.getvalue().splitlines()]
    assert [line.get("n", line["message"]) for line in lines] == [1, 2, "not a request", 3]


def test_a_line_logged_on_a_new_loop_is_written_when_the_old_loop_closed_first(configured: io.StringIO) -> None:
    """A flush scheduled on a loop that closed before it ran is not waited for."""
    alone()
    log = logging.getLogger("carmy.api")

    async def one(n: int) -> None:
        logs.info_line(log, "request", {**FIELDS, "n": n})

    loop = asyncio.new_event_loop()

    def log_then_stop() -> None:
        logs.info_line(log, "request", {**FIELDS, "n": 1})  # schedules its flush...
        loop.stop()  # ...which this turn does not run: the loop stops, then closes

    loop.call_soon(log_then_stop)
    loop.run_forever()
    loop.close()
    assert configured.getvalue() == ""
    asyncio.run(one(2))  # the next loop writes both lines at the end of its turn
    assert [json.loads(line)["n"] for line in configured.getvalue().splitlines()] == [1, 2]


def test_info_line_honours_the_level(configured: io.StringIO) -> None:
    alone()
    log = logging.getLogger("carmy.quiet")
    log.setLevel(logging.WARNING)
    try:
        logs.info_line(log, "request", FIELDS)
    finally:
        log.setLevel(logging.NOTSET)
    assert configured.getvalue() == ""


def test_info_line_goes_through_logging_when_others_listen(configured: io.StringIO,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    # pytest's capture (or a host application's handler) on the root: they get the record too.
    with caplog.at_level(logging.INFO, logger="carmy.api"):
        logs.info_line(logging.getLogger("carmy.api"), "request", FIELDS)
    [record] = caplog.records
    assert record.getMessage() == "request" and record.carmy == FIELDS  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", [
    "plain", 'quote " and \\ backslash', "café ☕ \U0001f600", "\x00\n\u2028", "", 0, -12, 10**30, 1.5, 1e-7, 3.0,
    float("nan"), float("inf"), float("-inf"), True, False, None, [1, "a"], {"nested": {"x": None}}, (1, 2),
    logging.INFO.__class__, b"bytes",
])
def test_json_lines_are_json_dumps_bytes_whatever_the_value(value: object) -> None:
    r = record("request", event="request", value=value, ts="forged")
    r.created, r.msecs = 1764460800.25, 250.0
    assert JsonFormatter().format(r) == json.dumps({
        "ts": "2025-11-30T00:00:00.250Z", "level": "info", "logger": "carmy.api", "message": "request",
        "event": "request", "value": value,
    }, default=str)


def test_json_lines_with_a_key_that_is_not_text_are_json_dumps_bytes_too() -> None:
    r = record("request", event="request")
    r.carmy = {1: "one", "event": "request", None: 2}  # type: ignore[attr-defined]
    r.created, r.msecs = 1764460800.25, 250.0
    assert JsonFormatter().format(r) == json.dumps({
        "ts": "2025-11-30T00:00:00.250Z", "level": "info", "logger": "carmy.api", "message": "request",
        1: "one", "event": "request", None: 2})
