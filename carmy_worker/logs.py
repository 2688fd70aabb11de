"""Logging for both processes: one JSON object a line by default, readable text on request.

Execution lines carry their fields in ``extra={"carmy": {...}}``; the JSON formatter puts them
at the top level. Argument values and results are never logged; request ids only as a hash.

The lines logged per request and per execution go through ``info_line``: the same line as
``logger.info(message, extra={"carmy": fields})``, without a ``LogRecord`` or the handler's
write and flush per line. On the event loop, once ``configure`` has set up the process's
handler, the line is kept in memory and written with the others of the same turn of the loop,
in one write, when the turn ends; any other record written meanwhile goes out after them, so
the order is kept. A process killed outright (SIGKILL) loses at most the lines of its last turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import sys
import threading
import time
from typing import Any, TextIO

from carmy_worker.loop import running_loop_or_none

_BASE = frozenset({"ts", "level", "logger", "message", "exc"})


class _Clock:
    """``ts`` of a JSON line, with the text up to the second built once a second rather than by
    ``strftime`` on every line."""

    def __init__(self) -> None:
        self._second = -1
        self._second_text = ""

    def iso(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:  # two threads may both rebuild it: same text, no harm
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(msecs):03d}Z"


_encoder = json.JSONEncoder(default=str)


def _json_line(ts: str, level: str, logger: str, message: str, fields: object, exc: str | None = None) -> str:
    line: dict[Any, Any] = {"ts": ts, "level": level, "logger": logger, "message": message}
    if isinstance(fields, dict):
        if _BASE.isdisjoint(fields):
            line.update(fields)
        else:
            line.update((k, v) for k, v in fields.items() if k not in _BASE)
    if exc:
        line["exc"] = exc
    return _encoder.encode(line)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``message``, then the record's
    ``carmy`` fields, then ``exc``. The bytes are ``json.dumps``'s (``", "`` and ``": "``, ASCII),
    which people and tests grep (``"event": "execution"``).

    Written for the lines logged per request and per execution: one reused encoder (``json.dumps``
    with ``default`` builds a new one per call), and the timestamp's text up to the second built
    once per second rather than by ``strftime`` on every line.
    """

    def __init__(self) -> None:
        super().__init__()
        self._clock = _Clock()

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return _json_line(self._clock.iso(record.created, record.msecs), record.levelname.lower(), record.name,
                          record.getMessage(), getattr(record, "carmy", None), exc)


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


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The process's handler (``configure``): records as any ``StreamHandler`` writes them, and
    the lines of ``info_line``, which on the event loop wait for the end of the loop's turn.

    Every write of the stream is made under the handler's lock, and a record written while
    lines wait goes out after them.
    """

    def __init__(self, stream: TextIO, fmt: str) -> None:
        super().__init__(stream)
        self.json = fmt == "json"
        self.setFormatter(JsonFormatter() if self.json else TextFormatter())
        self._clock = _Clock()
        self._waiting: list[str] = []
        self._flush_due = False
        self._flush_loop: asyncio.AbstractEventLoop | None = None  # where the due flush was scheduled

    def serves(self, logger: logging.Logger) -> bool:
        """Whether ``logger``'s records reach this handler alone, unfiltered (as ``configure``
        left them): only then may a line skip ``logging``."""
        current: logging.Logger | None = logger
        while current is not None:
            if current.filters:
                return False
            if current.parent is None:  # the root
                return len(current.handlers) == 1 and current.handlers[0] is self and not self.filters
            if current.handlers or not current.propagate:
                return False
            current = current.parent
        return False  # pragma: no cover - every logger's chain ends at the root

    def line(self, logger: logging.Logger, message: str, fields: dict[str, Any]) -> None:
        """Write ``logger.info(message, extra={"carmy": fields})``'s line (see the module)."""
        if self.json:
            created = time.time()
            text = _json_line(self._clock.iso(created, (created - int(created)) * 1000), "info", logger.name,
                              message, fields)
        else:
            record = logger.makeRecord(logger.name, logging.INFO, "(unknown file)", 0, message, (), None,
                                       extra={"carmy": fields})
            text = self.format(record)
        loop = running_loop_or_none()
        with self.lock:  # type: ignore[union-attr]
            self._waiting.append(text + self.terminator)
            if loop is None:
                self._flush_quietly()
            elif not self._flush_due or self._flush_loop is not loop:
                # (A flush due on another loop, closed before it ran, would never come.)
                self._flush_due, self._flush_loop = True, loop
                loop.call_soon(self._flush_quietly)

    def emit(self, record: logging.LogRecord) -> None:
        self._write_waiting()  # under the lock: Handler.handle holds it
        super().emit(record)

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write_waiting()
            super().flush()

    def _flush_quietly(self) -> None:
        with contextlib.suppress(Exception):  # as logging does: a log that cannot be written fails nothing
            self.flush()

    def _write_waiting(self) -> None:
        self._flush_due = False
        if self._waiting:
            text = "".join(self._waiting)
            self._waiting.clear()
            self.stream.write(text)


_handler: LineHandler | None = None


def info_line(logger: logging.Logger, message: str, fields: dict[str, Any]) -> None:
    """``logger.info(message, extra={"carmy": fields})``: the same line, cheaper.

    Skips ``logging``'s record and per-line write once ``configure`` has set up the process's
    handler and nobody has added another (pytest's capture, a host application's handlers):
    then it is ``logger.info`` itself. The level is honoured either way.
    """
    handler = _handler
    if handler is None or not handler.serves(logger):
        logger.info(message, extra={"carmy": fields})
    elif logger.isEnabledFor(logging.INFO):
        handler.line(logger, message, fields)


def configure(fmt: str) -> None:
    """Send every log line to stderr in ``fmt`` ("json" or "text").

    For the whole process (only the entry points call it): neither format shows where a line
    was logged from nor its thread or process, so records do not look them up (the logging
    HOWTO's "Optimization": a third of the cost of a line logged per request).
    """
    global _handler
    logging._srcfile = None  # no caller lookup (sys._getframe) per record
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    _handler = LineHandler(sys.stderr, fmt)
    root = logging.getLogger()
    root.handlers[:] = [_handler]
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
