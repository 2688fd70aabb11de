"""Logging for both processes: one JSON object a line by default, readable text on request.

Execution lines carry their fields in ``extra={"carmy": {...}}``; the JSON formatter puts them
at the top level. Argument values and results are never logged; request ids only as a hash.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
import threading
import time
from typing import Any

_BASE = frozenset({"ts", "level", "logger", "message", "exc"})


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``, then the record's
    ``carmy`` fields, then ``exc``. The bytes are ``json.dumps``'s (``", "`` and ``": "``, ASCII),
    which people and tests grep (``"event": "execution"``).

    Written for the lines logged per request and per execution: one reused encoder (``json.dumps``
    with ``default`` builds a new one per call), and the timestamp's text up to the second built
    once per second rather than by ``strftime`` on every line.
    """

    _encoder = json.JSONEncoder(default=str)

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:  # two threads may both rebuild it: same text, no harm
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        line: dict[str, Any] = {
            "ts": f"{self._second_text}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "carmy", None)
        if isinstance(fields, dict):
            if _BASE.isdisjoint(fields):
                line.update(fields)
            else:
                line.update((k, v) for k, v in fields.items() if k not in _BASE)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return self._encoder.encode(line)



class TextFormatter(logging.Formatter):
    """``time level logger message key=value ...``, one line per record: a value that could
    break the line or be read as another field (a caller's tool name with a newline, say) is
    quoted with its control characters escaped. Only a traceback spans lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        return _UNSAFE.sub(lambda m: json.dumps(m.group())[1:-1], super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, "carmy", None)
        if isinstance(fields, dict):
            text += " " + " ".join(f"{k}={_value(v)}" for k, v in fields.items() if v is not None)
        return text


_UNSAFE = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")


def _value(value: Any) -> str:
    text = str(value)
    if text and not any(c.isspace() or c in '="' for c in text) and not _UNSAFE.search(text):
        return text
    return json.dumps(text)


def configure(fmt: str) -> None:
    """Send every log line to stderr in ``fmt`` ("json" or "text").

    For the whole process (only the entry points call it): neither format shows where a line
    was logged from nor its thread or process, so records do not look them up (the logging
    HOWTO's "Optimization": a third of the cost of a line logged per request).
    """
    logging._srcfile = None  # no caller lookup (sys._getframe) per record
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("arq").setLevel(logging.WARNING)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """An exception that ends a thread (one a tool started and left behind, say) is logged like
    any error, not printed as bare text in the middle of the log."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("carmy").error("uncaught exception in thread %s", name, exc_info=args.exc_value)


def request_id_hash(request_id: str | None) -> str | None:
    """Enough to correlate the lines of one request id, not enough to read it."""
    if request_id is None:
        return None
    return hashlib.sha256(request_id.encode(errors="surrogatepass")).hexdigest()[:16]
