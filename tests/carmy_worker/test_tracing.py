"""carmy_worker.tracing in process: settings, traceparent strings, the trace id in result bodies,
jobs of older APIs, and the JSON-lines export. The cross-process trace is in tests/e2e/test_tracing.py."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from api.settings import ApiSettings
from carmy_worker import tracing
from carmy_worker.sdk.errors import error
from carmy_worker.settings import SettingsError, TracingSettings, WorkerSettings, env_tracing
from carmy_worker.store import records
from carmy_worker.wire import ExecutionJob, Record, job_decoder, msgpack_encoder

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("raw", "expected"), [
    (None, TracingSettings()), ("", TracingSettings()), ("off", TracingSettings()), ("OFF", TracingSettings()),
    ("otlp", TracingSettings("otlp")), ("file:/tmp/spans.jsonl", TracingSettings("file", "/tmp/spans.jsonl")),
])
def test_settings(raw: str | None, expected: TracingSettings) -> None:
    env = {} if raw is None else {"CARMY_TRACING": raw}
    assert env_tracing(env) == expected
    assert WorkerSettings.from_env(env).tracing == ApiSettings.from_env(env).tracing == expected


@pytest.mark.parametrize("raw", ["on", "file:", "jaeger", "true"])
def test_bad_settings_are_refused(raw: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_TRACING"):
        env_tracing({"CARMY_TRACING": raw})


@pytest.mark.parametrize(("value", "trace_id"), [
    (TRACEPARENT, TRACE), (f" {TRACEPARENT} ", TRACE), (None, None), ("", None), ("garbage", None),
    (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),  # W3C ids are lowercase
    (f"00-{'0' * 32}-00f067aa0ba902b7-01", None), (f"00-{TRACE}-{'0' * 16}-01", None),
    (f"ff-{TRACE}-00f067aa0ba902b7-01", None),
])
def test_trace_id_of(value: str | None, trace_id: str | None) -> None:
    assert tracing.trace_id_of(value) == trace_id


@pytest.mark.parametrize("record", [
    records.completed("exec_1", "echo", b'{"a":{"b":[1]}}', cacheable=True, duration_ms=3),
    records.failed("exec_1", "echo", error("INVALID_ARGUMENTS", "no")),
    records.timed_out("exec_1", "echo", 5.0, idempotent=True),
    records.panic("exec_1", "echo"),
])
def test_trace_id_goes_last_in_agent(record: Record) -> None:
    body = tracing.with_trace_id(record.body, TRACE)
    before, after = json.loads(record.body), json.loads(body)
    assert after["_agent"].pop("trace_id") == TRACE
    assert after == before
    assert list(json.loads(body)["_agent"])[-1] == "trace_id"


def test_a_job_without_traceparent_still_decodes() -> None:
    """A job an older API queued (no field) decodes with none; an older worker ignores the field."""

    class OldJob(msgspec.Struct, kw_only=True):
        execution_id: str
        tool: str
        arguments: bytes

    old = job_decoder.decode(msgpack_encoder.encode(OldJob(execution_id="e", tool="t", arguments=b"{}")))
    assert old.traceparent is None
    new = msgpack_encoder.encode(ExecutionJob(execution_id="e", tool="t", arguments=b"{}", traceparent=TRACEPARENT))
    assert job_decoder.decode(new).traceparent == TRACEPARENT
    assert msgspec.msgpack.decode(new, type=OldJob).tool == "t"


def test_off_imports_no_sdk() -> None:
    code = ("import sys; from carmy_worker import tracing; from carmy_worker.settings import TracingSettings; "
            "assert tracing.start(TracingSettings(), service='x') is None; "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_spans_to_a_file(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    t = tracing.start(TracingSettings("file", str(path)), service="unit")
    assert t is not None
    request = t.start("POST /agent/execute", TRACEPARENT, {"url.path": "/agent/execute"}, server=True)
    traceparent = t.traceparent(request)
    assert tracing.trace_id_of(traceparent) == TRACE
    t.interval("carmy.queued", traceparent, {"carmy.tool": "echo"}, 1_000, 2_000)
    request.end()
    t.shutdown()  # exports what is left
    spans = {s["name"]: s for s in map(json.loads, path.read_text().splitlines())}
    assert spans["carmy.queued"]["parent_span_id"] == spans["POST /agent/execute"]["span_id"]
    assert spans["carmy.queued"]["start_ns"] == 1_000 and spans["carmy.queued"]["end_ns"] == 2_000
    assert spans["POST /agent/execute"]["parent_span_id"] == "00f067aa0ba902b7"
    assert {s["trace_id"] for s in spans.values()} == {TRACE}
    assert {s["service"] for s in spans.values()} == {"unit"}


def otlp_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(otlp_installed(), reason="the otlp extra is installed")
def test_otlp_without_its_extra_says_what_to_install() -> None:
    # A command that installs it: no package named carmy is published, so 'pip install
    # carmy[otlp]' finds nothing to install.
    with pytest.raises(SettingsError, match=r"pip install opentelemetry-exporter-otlp-proto-http\b"):
        tracing.start(TracingSettings("otlp"), service="x")


def test_a_batch_exported_after_shutdown_writes_nothing_anywhere(tmp_path: Path) -> None:
    """An export that outlives its processor's shutdown must not write through a closed fd whose
    number the kernel has given to another file (or socket) since."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext

    from carmy_worker.tracing.jsonl import JsonLinesExporter

    span = ReadableSpan(name="late", context=SpanContext(trace_id=1, span_id=2, is_remote=False))
    exporter = JsonLinesExporter(str(tmp_path / "spans.jsonl"))
    assert exporter.export([span]).name == "SUCCESS"
    exporter.shutdown()
    with (tmp_path / "other").open("wb") as other:  # likely the very number the exporter had
        result = exporter.export([span])
        other.flush()
    assert result.name == "FAILURE"
    assert (tmp_path / "spans.jsonl").read_text().count("late") == 1
    assert (tmp_path / "other").read_bytes() == b""
    exporter.shutdown()  # twice is harmless
