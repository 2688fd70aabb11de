"""How long after its caller goes away a running tool gets ``CancelledError``.

``python -m bench.cancel_latency [N]``: one API and one worker on a private Redis; N times over
JSON and N times over SSE, a call to ``bench.tools.linger`` is started, the client disconnects
once the tool runs, and the tool writes the instant the cancellation reached it.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.processes import RedisServer, free_port, wait_until
from bench.procs import START_TIMEOUT, Processes


def disconnect_json(base: str, tag: str, marks: Path) -> float:
    with contextlib.suppress(httpx.ReadTimeout):  # on which httpx closes the connection
        httpx.post(base + "/agent/execute", json={"tool": "linger", "arguments": {"tag": tag}},
                   timeout=httpx.Timeout(5, read=0.3))
    return time.time()


def disconnect_sse(base: str, tag: str, marks: Path) -> float:
    with httpx.Client() as client, client.stream(
        "POST", base + "/agent/execute", json={"tool": "linger", "arguments": {"tag": tag}},
        headers={"accept": "text/event-stream"},
    ) as response:
        seen = ""
        for chunk in response.iter_text():
            seen += chunk
            if "tool.started" in seen:
                break
        # tool.started is the worker's claim: a caller gone before the tool's first step cancels
        # a tool that never ran, and there is no CancelledError to time.
        wait_until((marks / f"started-{tag}").exists, 5, f"start of {tag}")
    return time.time()


def main(n: int = 20) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="carmy-cancel-"))
    redis_server = RedisServer(workdir)
    redis_server.start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        with Processes(workdir, redis_server.url, "cancel") as procs:
            marks = {"BENCH_MARKS": str(workdir)}
            worker = procs.start("worker", [sys.executable, "-m", "carmy_worker", "bench.tools"], marks)
            worker.wait_for_log("serving", START_TIMEOUT)
            api = procs.start("api", [sys.executable, "-m", "api"], {"CARMY_PORT": str(port)})
            api.wait_for_http(base + "/.well-known/agent", START_TIMEOUT)
            wait_until(lambda: "linger" in httpx.get(base + "/agent/tools").text, 10, "catalog")
            for name, disconnect in (("JSON", disconnect_json), ("SSE", disconnect_sse)):
                delays = []
                for i in range(n):
                    tag = f"{name}-{i}"
                    gone = disconnect(base, tag, workdir)
                    mark = workdir / f"cancelled-{tag}"
                    wait_until(mark.exists, 5, f"cancellation of {tag}")
                    delays.append((float(mark.read_text()) - gone) * 1000)
                delays.sort()
                print(f"{name}: n={n} p50={statistics.median(delays):.1f} ms max={delays[-1]:.1f} ms "
                      "from the client's disconnect to CancelledError in the tool")
    finally:
        redis_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
