"""The streams' check (``chaos.streams``) on made-up histories: each row finds what it names, and
nothing in a run where every stream held to the id it named."""

from __future__ import annotations

from chaos.model import RecordSeen, Stream
from chaos.streams import read, reconcile_streams


def stream(started: str | None, completed: str | None = None, *, status: str | None = "completed",
           code: str | None = None, answered: bool = True) -> Stream:
    return Stream(t0=1.0, t1=2.0, api="http://api", started=started, completed=completed or started,
                  status=status, code=code, answered=answered)


def record(xid: str, status: str = "completed", code: str | None = None) -> RecordSeen:
    return RecordSeen(xid=xid, tool="named", status=status, error_code=code)


def test_streams_that_held_to_their_ids_pass() -> None:
    streams = [
        stream("exec_a"),
        stream("exec_b", status="failed", code="QUEUE_FULL", answered=False),  # refused, nothing created
        stream("exec_c", status="failed", code="STORE_UNAVAILABLE", answered=False),  # ran after all: info
        stream("exec_d", status="failed", code="STORE_UNAVAILABLE", answered=False),
        Stream(t0=1.0, t1=2.0, api="http://api", started="exec_e", error="RemoteProtocolError: cut"),  # cut off
    ]
    table = reconcile_streams(streams, [record("exec_a"), record("exec_c"), record("exec_e")])
    assert table.violations() == {}
    assert (table.streams, table.ended, table.answered) == (5, 4, 1)
    assert table.refused == {"QUEUE_FULL": 1, "STORE_UNAVAILABLE": 2}
    assert table.unavailable_recorded == 1


def test_each_row_names_the_execution_its_stream_named() -> None:
    streams = [
        stream("exec_a", "exec_other"),  # misnamed
        stream("exec_b"),  # answered, no record
        stream("exec_c"),  # answered completed, recorded failed
        stream("exec_d", status="failed", code="NO_WORKERS", answered=False),  # refused, yet recorded
        Stream(t0=1.0, t1=2.0, api="http://api", started="exec_f", attempt=2, stale=1),  # cut off, stale
    ]
    table = reconcile_streams(streams, [record("exec_a"), record("exec_c", "failed", "TOOL_PANIC"),
                                        record("exec_d")])
    assert table.misnamed == ["exec_a"]
    assert table.answered_unrecorded == ["exec_b"]
    assert table.unlike == ["exec_c"]
    assert table.refused_recorded == ["exec_d"]
    assert table.stale_progress == ["exec_f"]
    assert table.retried == 1
    assert table.named() == {"exec_a", "exec_b", "exec_c", "exec_d", "exec_f"}
    assert set(table.violations()) == {"streams misnamed", "streamed answers without a record",
                                       "streamed answers unlike their records",
                                       "streams refused by SUBMIT, yet recorded",
                                       "streams with an attempt's progress after a later attempt's"}


def test_a_stream_is_read_for_the_id_it_named_and_its_end() -> None:
    lines = ["event: execution.started", 'data: {"execution_id":"exec_a","tool":"named"}', "",
             "event: tool.started", 'data: {"execution_id":"exec_a","tool":"named"}', "",
             "event: execution.completed",
             'data: {"execution_id":"exec_a","status":"failed","error":{"code":"STORE_UNAVAILABLE"},"replayed":false}']
    got = Stream(t0=1.0, t1=0.0, api="http://api")
    read(iter(lines), got)
    assert (got.started, got.completed, got.status, got.code, got.answered) == (
        "exec_a", "exec_a", "failed", "STORE_UNAVAILABLE", False)


def progress(attempt: int) -> list[str]:
    return ["event: tool.progress",
            f'data: {{"execution_id":"exec_a","tool":"named","progress":1,"message":"{attempt}"}}', ""]


def test_a_stream_counts_each_progress_event_of_an_attempt_after_a_later_ones() -> None:
    lines = ["event: execution.started", 'data: {"execution_id":"exec_a","tool":"named"}', "",
             *progress(1), *progress(1), *progress(2), *progress(1), *progress(2), *progress(1),
             "event: execution.completed", 'data: {"execution_id":"exec_a","status":"completed","replayed":false}']
    got = Stream(t0=1.0, t1=0.0, api="http://api")
    read(iter(lines), got)
    assert (got.attempt, got.stale, got.completed) == (2, 2, "exec_a")
    clean = Stream(t0=1.0, t1=0.0, api="http://api")
    read(iter([*progress(1), *progress(2), *progress(2), *progress(3)]), clean)
    assert (clean.attempt, clean.stale) == (3, 0)
