"""An API process stopped (SIGTERM) while calls wait for their outcome: open requests get 30 s
(README, "Serving"), and a call still waiting a second before that answers ``503
SERVER_STOPPING``, retryable, in the protocol's envelope, JSON or SSE alike. It used to be cut
short by uvicorn's bare text ``500 Internal Server Error``, with a traceback in the log. The
execution goes on: a retry with the same ``request_id`` at another API process gets its outcome,
and the tool ran once."""

from __future__ import annotations

import concurrent.futures
import signal

import httpx
import pytest

from bench.processes import wait_until
from tests import sse
from tests.support import Stack

HOLD_S = 34  # past the 30 s grace, so that the calls are still waiting when it ends
TAG = "api-stop"


@pytest.mark.timeout(180)
def test_calls_waiting_when_the_grace_ends_answer_server_stopping_and_their_executions_go_on(stack: Stack) -> None:
    stack.worker()
    api, base = stack.api()
    started = stack.tmp / f"hold-start-{TAG}"
    bodies = {kind: {"tool": "hold", "arguments": {"seconds": HOLD_S, "tag": TAG}, "request_id": f"stop-{kind}"}
              for kind in ("json", "sse")}
    with concurrent.futures.ThreadPoolExecutor(2) as pool, httpx.Client(base_url=base, timeout=90) as client:
        json_call = pool.submit(client.post, "/agent/execute", json=bodies["json"])
        sse_call = pool.submit(client.post, "/agent/execute", json=bodies["sse"],
                               headers={"accept": "text/event-stream"})
        wait_until(lambda: started.exists() and len(started.read_text().split()) == 2, 30, "both tools started")
        api.signal(signal.SIGTERM)
        answer, stream = json_call.result(), sse_call.result()

    assert answer.status_code == 503
    assert answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    assert body["status"] == "failed"
    error = body["error"]
    assert (error["code"], error["category"], error["retryable"], error["retry_after"]) == (
        "SERVER_STOPPING", "capacity", True, 1)
    assert body["execution_id"] in error["message"]  # where to read it: GET /agent/executions/{id}

    assert stream.status_code == 200  # the stream had begun
    events = sse.parse(stream.text)
    name, final = events[-1]
    assert name == "execution.completed"  # always the last frame, with the result body
    assert (final["status"], final["error"]["code"]) == ("failed", "SERVER_STOPPING")

    # It stopped once they were answered, not killed: uvicorn raises the signal it handled again
    # once it has shut down, as the process's exit status.
    assert api.popen.wait(30) == -signal.SIGTERM
    log = api.output()
    assert "Traceback" not in log and "Exception in ASGI application" not in log

    # The executions went on: a retry at another API process gets each one's outcome.
    _, other = stack.api()
    with httpx.Client(base_url=other, timeout=60) as client:
        for kind, first in (("json", body["execution_id"]), ("sse", final["execution_id"])):
            retried = client.post("/agent/execute", json=bodies[kind])
            assert retried.status_code == 200, retried.text
            assert retried.json()["execution_id"] == first
            assert retried.json()["status"] == "completed"
    assert len(started.read_text().split()) == 2  # each tool ran once
