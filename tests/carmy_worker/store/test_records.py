"""Records built for the caller: the one of last resort is the same as the ordinary one."""

from __future__ import annotations

from carmy_worker.store import records


def test_the_panic_of_last_resort_is_an_ordinary_tool_panic() -> None:
    exec_id = "exec_0b9d7c1e-5f3a-4e2b-9c41-7d2a8e6f1b30"
    assert records.panic(exec_id, "t") == records.failed(exec_id, "t", records.panic_error())
