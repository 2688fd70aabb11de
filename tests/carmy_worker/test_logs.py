"""Log lines: one per record whatever a caller sends, in text and in JSON."""

from __future__ import annotations

import json
import logging
import sys

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
