"""Drive an HTTP endpoint with wrk (a C load generator, so the client is never the bottleneck)
and read its numbers back.

wrk takes the request and the checks from a Lua script written per run: every response is
checked for the expected status and body text, and ``done()`` prints one parseable line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = "wrk is not installed: apt-get install wrk (Debian/Ubuntu), brew install wrk (macOS)"
_RESULT = "WRK_RESULT "
_SAMPLE = "WRK_SAMPLE "

_LUA = """
wrk.method = {method}
wrk.body = {body}
{headers}
local expect_status = {status}
local expect_text = {text}
local threads = {{}}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  bad = 0
  sample = ""
end

function response(status, headers, body)
  body = body or ""
  if status ~= expect_status or (expect_text ~= nil and not string.find(body, expect_text, 1, true)) then
    bad = bad + 1
    if sample == "" then sample = status .. " " .. string.sub(body, 1, 300):gsub("\\n", " ") end
  end
end

function done(summary, latency, requests)
  local unexpected, sample_out = 0, ""
  for _, t in ipairs(threads) do
    unexpected = unexpected + t:get("bad")
    if sample_out == "" then sample_out = t:get("sample") end
  end
  local e = summary.errors
  io.write(string.format(
    '{result}{{"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"socket_errors":%d,"timeouts":%d,"unexpected":%d}}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.connect + e.read + e.write, e.timeout, unexpected))
  io.write("{sample}" .. sample_out .. "\\n")
end
"""


@dataclass(frozen=True)
class Request:
    """What every connection sends, and what it must get back."""

    path: str
    method: str = "GET"
    body: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    expect_status: int = 200
    expect_text: str | None = None


@dataclass(frozen=True)
class LoadResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int  # socket errors, timeouts and unexpected answers
    sample: str  # the first unexpected answer, if any

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def available() -> bool:
    return shutil.which("wrk") is not None


def lua_string(value: str | None) -> str:
    # json.dumps escapes like Lua 5.1 for ASCII text (all the benchmark sends); it would write
    # \uXXXX for other characters, which LuaJIT does not read.
    return "nil" if value is None else json.dumps(value)


def script(request: Request) -> str:
    headers = "\n".join(f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in request.headers)
    return _LUA.format(method=lua_string(request.method), body=lua_string(request.body), headers=headers,
                       status=request.expect_status, text=lua_string(request.expect_text),
                       result=_RESULT, sample=_SAMPLE)


def run(base: str, request: Request, *, clients: int, seconds: float, workdir: Path) -> LoadResult:
    """``clients`` connections, each sending ``request`` back to back for ``seconds``."""
    lua = workdir / "wrk.lua"
    lua.write_text(script(request))
    # One wrk thread per core is enough to keep 64 connections busy on this kind of machine.
    threads = min(clients, 2)
    args = ["wrk", "-t", str(threads), "-c", str(clients), "-d", f"{seconds}s", "--timeout", "30s",
            "-s", str(lua), base + request.path]
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60, check=False)
    return parse(done.stdout, done.stderr)


def parse(stdout: str, stderr: str = "") -> LoadResult:
    lines = stdout.splitlines()
    found = [line[len(_RESULT):] for line in lines if line.startswith(_RESULT)]
    if not found:
        raise RuntimeError(f"wrk printed no result:\n{stdout}\n{stderr}")
    raw = json.loads(found[-1])
    sample = next((line[len(_SAMPLE):] for line in lines if line.startswith(_SAMPLE)), "")
    return LoadResult(
        requests=raw["requests"], seconds=raw["duration_us"] / 1e6, p50_ms=raw["p50_us"] / 1000,
        p99_ms=raw["p99_us"] / 1000, max_ms=raw["max_us"] / 1000,
        errors=raw["socket_errors"] + raw["timeouts"] + raw["unexpected"], sample=sample,
    )
