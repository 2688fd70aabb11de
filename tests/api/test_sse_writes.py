"""``SseStream`` writes the frames of events that came together in one body message, and never
holds a frame while it waits."""

from __future__ import annotations

from starlette.types import Message

from api.endpoints.relay import SseStream
from api.events.mailbox import Mailbox
from carmy_worker.wire import Record, completed_event, event_decoder, started_event

RECORD = Record(status_code=200, body=b'{"status":"completed"}', tool="t", status="completed")


class Sent:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.bodies.append(message["body"])


async def test_execution_started_goes_out_at_once_when_nothing_else_is_waiting() -> None:
    sent = Sent()
    await SseStream(sent, Mailbox(), keepalive=15).start("e", "t")
    assert sent.bodies == [b'event: execution.started\ndata: {"execution_id":"e","tool":"t"}\n\n']


async def test_events_that_came_together_go_out_in_one_write() -> None:
    sent, box = Sent(), Mailbox()
    box.put_nowait(started_event("e", "t"))  # reached the API before SUBMIT's reply
    stream = SseStream(sent, box, keepalive=15)
    await stream.start("e", "t")
    assert sent.bodies == []  # held: tool.started is relayed next, in this turn
    await stream.event(event_decoder.decode(await box.get()))
    [first] = sent.bodies
    assert first.startswith(b"event: execution.started\n") and b"\n\nevent: tool.started\n" in first

    box.put_nowait(completed_event("e", "t", 1, True))
    box.put_nowait(b"final")  # anything waiting: the frame before it is held
    await stream.event(event_decoder.decode(await box.get()))
    assert len(sent.bodies) == 1
    await stream.finish(RECORD, replayed=False)
    last = sent.bodies[-1]
    assert last.startswith(b"event: tool.completed\n") and b"\n\nevent: execution.completed\n" in last
