"""The console's live overview: the sampler against a real Redis (workers as they register and
heartbeat, real executions counted per second, a dead worker leaving the frame), the derivation
of rates and quantiles on known inputs, and the page and its stream (``/console/live``) over a
real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
import redis.asyncio
from starlette.applications import Starlette
from starlette.routing import Route

from api.app import create_app
from api.console.assets import STATIC_PATH
from api.console.entrance import ConsoleEntrance
from api.console.frame import LiveFrame, WorkerRow
from api.console.framing import DEAD_SHOWN_MS
from api.console.guard import Guard
from api.console.live import Sampler
from api.console.pages.overview import OverviewPage
from api.console.rates import Step, Window, grown, quantile
from api.console.routes import static
from api.console.session import Sessions
from api.settings import ApiKey
from carmy_worker.store import jobs, keys, metrics
from carmy_worker.store.roster import Liveness
from carmy_worker.store.submit import Submit
from carmy_worker.wire import ExecutionJob, WorkerInfo, msgpack_encoder
from tests.conftest import asgi_client
from tests.support import NO_REDIS, Proc, Stack, app_settings, serving, wait_until, wait_until_async

DEAD_AFTER = 3.0
SAMPLER_NAME = "console-sampler"
SEP = metrics.SEP


# --- the derivation, on known inputs ------------------------------------------------------------

def histogram(**at: int) -> list[int]:
    """Non-cumulative counts of ``metrics.BUCKETS_MS``, given as ``b<index>=count``."""
    counts = [0] * (len(metrics.BUCKETS_MS) + 1)
    for name, n in at.items():
        counts[int(name[1:])] = n
    return counts


def test_quantiles_interpolate_within_their_bucket() -> None:
    # 100 runs between 5 and 10 ms (bucket 3): spread evenly, as Prometheus assumes.
    assert quantile(histogram(b3=100), 0.5) == pytest.approx(7.5)
    assert quantile(histogram(b3=100), 0.99) == pytest.approx(9.95)
    # 90 fast runs (under 1 ms) and 10 slow ones (50 to 100 ms): the median is fast, the p99 slow.
    fast_and_slow = histogram(b0=90, b6=10)
    assert quantile(fast_and_slow, 0.5) == pytest.approx(50 / 90)
    assert quantile(fast_and_slow, 0.99) == pytest.approx(50 + 50 * 9 / 10)
    # Past the last edge (60 s) nothing more can be said than "over 60 s".
    assert quantile(histogram(b15=3), 0.5) == metrics.BUCKETS_MS[-1]
    assert quantile(histogram(), 0.5) is None


def test_counters_grow_and_a_reset_counts_from_zero() -> None:
    before = {b"a": b"5", b"b": b"7", b"c": b"1"}
    after = {b"a": b"5", b"b": b"9", b"c": b"0", b"d": b"2"}
    assert grown(before, after) == {b"b": 2, b"d": 2}  # c went down to 0 (a flushed Redis): nothing new
    assert grown({b"x": b"10"}, {b"x": b"3"}) == {b"x": 3}


def step(ms: int, **tools: tuple[int, int, list[int]]) -> Step:
    """A step in which each tool finished n executions, e of them errors, with these run buckets."""
    executions: dict[bytes, int] = {}
    run: dict[bytes, int] = {}
    for tool, (n, e, buckets) in tools.items():
        executions[SEP.join((tool, "completed", "")).encode()] = n - e
        executions[SEP.join((tool, "failed", "TOOL_ERROR")).encode()] = e
        run.update({f"{tool}{SEP}{i}".encode(): c for i, c in enumerate(buckets) if c})
        run[f"{tool}{SEP}sum".encode()] = 12345  # not a bucket: left out
    return Step.between(ms, executions, run)


def test_a_step_counts_completions_and_errors_per_second() -> None:
    s = step(500, fast=(10, 2, histogram(b1=10)), slow=(1, 0, histogram(b9=1)))
    assert (s.finished, s.errors) == (11, 2)
    assert s.per_second(s.finished) == 22.0 and s.per_second(s.errors) == 4.0
    assert s.tools["fast"].buckets == histogram(b1=10)
    cancelled = Step.between(1000, {SEP.join(("t", "cancelled", "CANCELLED")).encode(): 3}, {})
    assert (cancelled.finished, cancelled.errors) == (3, 0)  # a cancellation is no error


def test_the_window_covers_its_last_steps_only() -> None:
    window = Window(2)
    window.push(step(1000, old=(4, 4, histogram(b14=4))))
    window.push(step(1000, busy=(10, 0, histogram(b2=10))))
    assert window.tools["old"].errors == 4
    window.push(step(1000, busy=(10, 1, histogram(b3=10))))
    assert "old" not in window.tools  # quiet for a whole window: gone from the table
    busy = window.tools["busy"]
    assert window.ms == 2000 and window.per_second(busy.finished) == 10.0 and busy.errors == 1
    assert quantile(busy.buckets, 0.5) == pytest.approx(5.0)  # the 10th of 20 runs: the top of bucket 2


# --- the sampler against Redis ------------------------------------------------------------------

@pytest.fixture
async def ar(stack: Stack) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(stack.redis_url)
    yield client
    await client.aclose()


def info(worker_id: str, *, group: str = "g-fake", concurrency: int = 4) -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, started_ms=int(time.time() * 1000), tools=[], group=group,
                      host="host-" + worker_id, pid=4242, concurrency=concurrency)


async def present(liveness: Liveness, worker: WorkerInfo, *, seen_ago_ms: int = 0) -> None:
    """As a worker does: its info written, then a heartbeat (``seen_ago_ms`` back: one that died then)."""
    await liveness.register(worker.worker_id, msgpack_encoder.encode(worker))
    await liveness.heartbeat(worker.worker_id, offset_ms=-seen_ago_ms)


def row(frame: LiveFrame, worker_id: str) -> WorkerRow | None:
    return next((w for w in frame.workers if w.id == worker_id), None)


async def test_workers_are_shown_as_they_register_heartbeat_and_drain(ar: redis.asyncio.Redis) -> None:
    liveness = Liveness(ar, dead_after=DEAD_AFTER)
    await present(liveness, info("fake-a", concurrency=8))
    await present(liveness, info("fake-b", group="g-other"))
    await liveness.drain("fake-b")
    frame = await Sampler(ar, dead_after=DEAD_AFTER).tick()
    a, b = row(frame, "fake-a"), row(frame, "fake-b")
    assert a == WorkerRow(id="fake-a", host="host-fake-a", pid=4242, group="g-fake", slots=8, busy=0,
                          last_seen=a.last_seen if a else 0, draining=False, alive=True)
    assert b is not None and b.draining and b.alive and b.group == "g-other"


async def ticks_until(sampler: Sampler, test: Callable[[LiveFrame], object], what: str) -> LiveFrame:
    """Samples until a frame passes ``test``."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        frame = await sampler.tick()
        if test(frame):
            return frame
        await asyncio.sleep(0.05)
    raise TimeoutError(what)


@pytest.mark.slow
async def test_a_dead_worker_is_shown_dead_then_leaves_the_frame(ar: redis.asyncio.Redis) -> None:
    liveness, sampler = Liveness(ar, dead_after=DEAD_AFTER), Sampler(ar, dead_after=DEAD_AFTER)
    await present(liveness, info("fake-dying"))
    alive = row(await sampler.tick(), "fake-dying")
    assert alive is not None and alive.alive
    # Silent for just over dead_after. (Redis just started being watched counts as the end of a
    # gap: for one dead_after more, the roster gives workers the benefit of the doubt, so wait.)
    dead_ms = int(DEAD_AFTER * 1000)
    await present(liveness, info("fake-dying"), seen_ago_ms=dead_ms + 1)
    await ticks_until(sampler, lambda f: (r := row(f, "fake-dying")) is not None and not r.alive, "shown dead")
    await present(liveness, info("fake-dying"), seen_ago_ms=dead_ms + DEAD_SHOWN_MS + 1000)
    await ticks_until(sampler, lambda f: row(f, "fake-dying") is None, "gone")


async def test_a_group_queue_backing_up_is_in_the_frame(ar: redis.asyncio.Redis) -> None:
    liveness, sampler = Liveness(ar, dead_after=DEAD_AFTER), Sampler(ar, dead_after=DEAD_AFTER)
    await present(liveness, info("fake-q", group="g-backlog"))
    before = await sampler.tick()
    submit = Submit(ar, retention=600)
    for _ in range(3):
        job = ExecutionJob(execution_id=keys.new_execution_id(), tool="nobody_runs_it", arguments=b"{}")
        await submit(job, group="g-backlog", idempotent=True, workers_alive=True, max_pending=100,
                     queue_wait_ms=3_600_000, admission_ms=3_600_000)
    frame = await sampler.tick()
    assert frame.point is not None and before.point is not None
    assert [(q.due, q.length) for q in frame.queues if q.group == "g-backlog"] == [(3, 3)]
    assert frame.point.queued == before.point.queued + 3 and frame.point.pending == before.point.pending + 3


@pytest.mark.usefixtures("four_partitions")
async def test_the_frame_adds_up_every_partition(ar: redis.asyncio.Redis) -> None:
    """With four partitions, a worker's busy count is its running executions in each, a queue's
    depth its partitions' added up; the workers are partition 0's roster."""
    await present(Liveness(ar, dead_after=DEAD_AFTER), info("fake-cells", group="g-cells"))
    for partition in keys.partitions():
        await ar.sadd(keys.running("fake-cells", partition), *(keys.new_execution_id(partition)
                                                              for _ in range(partition + 1)))
        await ar.zadd(jobs.queue_name("g-cells", partition), {keys.new_execution_id(partition): 0})
    try:
        sampler = Sampler(ar, dead_after=DEAD_AFTER)
        await sampler.tick()  # learns the worker's info, and so its group's queue
        frame = await sampler.tick()
        cells = row(frame, "fake-cells")
        assert cells is not None and cells.alive and cells.busy == 1 + 2 + 3 + 4
        assert [(q.due, q.length) for q in frame.queues if q.group == "g-cells"] == [(4, 4)]
    finally:
        await ar.delete(*(keys.running("fake-cells", p) for p in keys.partitions()),
                        *(jobs.queue_name("g-cells", p) for p in keys.partitions()))


async def test_a_redis_that_lost_its_scripts_is_read_all_the_same(ar: redis.asyncio.Redis) -> None:
    sampler = Sampler(ar, dead_after=DEAD_AFTER)
    await sampler.tick()
    await ar.script_flush()  # a restarted Redis, or a new primary: PULSE is loaded again
    frame = await sampler.tick()
    assert frame.error == "" and frame.point is not None


async def test_an_unreachable_redis_makes_a_frame_that_says_so() -> None:
    client = redis.asyncio.Redis.from_url(NO_REDIS, socket_connect_timeout=1)
    try:
        sampler = Sampler(client, dead_after=DEAD_AFTER)
        frame = await sampler.tick()
        assert frame.point is None and frame.error.startswith("Redis does not answer")
        assert sampler.seq == 1 and b"Redis does not answer" in sampler.frame_json  # viewers are told
    finally:
        await client.aclose()


# --- real executions ----------------------------------------------------------------------------

@pytest.fixture
async def sampling(ar: redis.asyncio.Redis) -> AsyncIterator[Sampler]:
    """A sampler running as the console runs it, in the background."""
    sampler = Sampler(ar, dead_after=DEAD_AFTER)
    task = asyncio.create_task(sampler.run())
    yield sampler
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def seen(sampler: Sampler, test: Callable[[LiveFrame], object]) -> Callable[[], object]:
    def check() -> object:
        return sampler.frame is not None and test(sampler.frame)
    return check


def tool_row(frame: LiveFrame, tool: str) -> Any:
    return next((t for t in frame.tools if t.tool == tool), None)


@pytest.mark.slow
async def test_real_executions_are_counted_per_second(client: httpx.AsyncClient, worker: Proc,
                                                      sampling: Sampler) -> None:
    await wait_until_async(seen(sampling, lambda f: any(w.alive and w.slots for w in f.workers)),
                           what="the real worker in a frame, with its slots")
    def counted(frame: LiveFrame) -> bool:
        row = tool_row(frame, "echo")
        return row is not None and row.runs >= 3 and row.p50 is not None

    for i in range(3):
        answer = await client.post("/agent/execute", json={"tool": "echo", "arguments": {"text": str(i)}})
        assert answer.status_code == 200, answer.text
    await wait_until_async(seen(sampling, counted), what="three echo calls counted")
    echo = tool_row(sampling.frame, "echo") if sampling.frame else None
    assert echo is not None and echo.errors == 0 and 0 < echo.p50 <= echo.p99 <= 1000
    # Each second's rate times that second's length, summed over the charts' points: the three calls.
    points = json.loads(sampling.history_json())["points"]
    counts = [p["completions"] * (p["t"] - q["t"]) / 1000 for q, p in itertools.pairwise(points)]
    assert sum(counts) == pytest.approx(3)

    failed = await client.post("/agent/execute", json={"tool": "explode", "arguments": {}})
    assert failed.json()["status"] == "failed"
    await wait_until_async(seen(sampling, lambda f: (r := tool_row(f, "explode")) is not None and r.errors > 0),
                           what="the failure counted as an error")


@pytest.mark.slow
async def test_a_running_execution_takes_a_slot(client: httpx.AsyncClient, stack: Stack, worker: Proc,
                                                sampling: Sampler) -> None:
    # The gate holds the execution until a frame has shown it: a tool that only slept could end
    # between two samples on a busy machine, and the busy slot would never be seen.
    call = asyncio.create_task(client.post("/agent/execute", json={"tool": "gate", "arguments": {"tag": "slot"}}))
    try:
        await wait_until_async(seen(sampling, lambda f: any(w.busy for w in f.workers)
                                    and f.point is not None and f.point.in_flight >= 1),
                               what="a busy slot while the gate is shut")
    finally:
        (stack.tmp / "gate-open-slot").touch()
        assert (await call).status_code == 200
    await wait_until_async(seen(sampling, lambda f: not any(w.busy for w in f.workers)), what="the slot freed")


@pytest.mark.slow
async def test_a_killed_worker_leaves_the_frame_within_seconds(stack: Stack, worker: Proc, sampling: Sampler) -> None:
    doomed = stack.worker()
    pid = doomed.pid
    await wait_until_async(seen(sampling, lambda f: any(w.pid == pid and w.alive for w in f.workers)),
                           what="the second worker alive in a frame")
    doomed.kill()  # SIGKILL: no goodbye, only its silence tells
    killed = time.monotonic()
    await wait_until_async(seen(sampling, lambda f: any(w.pid == pid and not w.alive for w in f.workers)),
                           what="the killed worker shown dead")
    # dead_after, a second's sampling and margin; twice dead_after if a busy machine made a gap in which
    # nobody reached Redis (the roster then gives workers one dead_after more: store/roster.py).
    assert time.monotonic() - killed < 2 * DEAD_AFTER + 3
    await wait_until_async(seen(sampling, lambda f: all(w.pid != pid for w in f.workers)),
                           what="the killed worker gone from the frame")
    assert time.monotonic() - killed < 2 * DEAD_AFTER + DEAD_SHOWN_MS / 1000 + 5


# --- the stream ---------------------------------------------------------------------------------

@contextlib.contextmanager
def live_server(redis_url: str, rotate: float = 10.0) -> Iterator[tuple[str, OverviewPage]]:
    """The overview's routes behind the console's guard (open: an API without keys), under uvicorn
    (a real server: a client leaving is a real disconnect), the sampler run by the app's lifespan
    as the console runs it."""
    client = redis.asyncio.Redis.from_url(redis_url, client_name=SAMPLER_NAME)
    page = OverviewPage(Sampler(client, dead_after=DEAD_AFTER), rotate=rotate)
    sessions = redis.asyncio.Redis.from_url(redis_url)  # the guard's reads (the session secret): not the sampler's
    guard = Guard(Sessions(app_settings(redis_url), sessions), authenticates=False)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(page.sampler.run())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()
        await sessions.aclose()

    routes = [ConsoleEntrance([Route(STATIC_PATH + "/{name:path}", static),
                               guard.page("/console", page.get), guard.page("/console/live", page.live)])]
    with serving(Starlette(routes=routes, lifespan=lifespan)) as base:
        yield base, page


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, bytes]]:
    name = ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, line[6:].encode()


@pytest.mark.slow
async def test_the_stream_sends_history_then_a_frame_a_second_and_ends_with_its_client(stack: Stack) -> None:
    with live_server(stack.redis_url) as (base, page):
        await wait_until_async(lambda: page.sampler.seq >= 2, what="two frames sampled")
        received: list[tuple[str, bytes]] = []
        async with httpx.AsyncClient(timeout=30) as client, client.stream("GET", base + "/console/live") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for name, data in events(response):
                received.append((name, data))
                if sum(n == "frame" for n, _ in received) >= 3:
                    break
            assert page.streams == 1
        names = [n for n, _ in received]
        assert names[0] == "history" and names[1:] == ["frame"] * 3
        history = json.loads(received[0][1])["points"]
        assert len(history) >= 2 and all(p["t"] for p in history)
        seqs = [json.loads(d)["seq"] for n, d in received if n == "frame"]
        assert seqs == sorted(set(seqs))  # each frame once, in order
        wait_until(lambda: page.streams == 0, timeout=10, what="the stream ended with its client")


@pytest.mark.slow
async def test_a_stream_ends_by_itself_so_that_it_never_holds_a_shutdown_up(stack: Stack) -> None:
    with live_server(stack.redis_url, rotate=1.5) as (base, page):
        async with httpx.AsyncClient(timeout=30) as client, client.stream("GET", base + "/console/live") as response:
            names = [name async for name, _ in events(response)]  # to its end, which the server chose
        assert names[0] == "history" and names[-1] == "end" and "frame" in names
        wait_until(lambda: page.streams == 0, timeout=10, what="the stream ended")


@pytest.mark.slow
async def test_viewers_share_the_sampler_s_one_connection(stack: Stack) -> None:
    with live_server(stack.redis_url) as (base, page):
        async def frames(client: httpx.AsyncClient, n: int) -> list[int]:
            seqs: list[int] = []
            async with client.stream("GET", base + "/console/live") as response:
                async for name, data in events(response):
                    if name == "frame":
                        seqs.append(json.loads(data)["seq"])
                        if len(seqs) == n:
                            return seqs
            raise AssertionError("the stream ended")

        async with httpx.AsyncClient(timeout=30) as client:
            viewers = asyncio.gather(*(frames(client, 4) for _ in range(5)))
            await wait_until_async(lambda: page.streams == 5, what="five viewers")
            connections = await sampler_connections(stack.redis_url)
            await viewers
        # However many watch, Redis sees the sampler's one reading a second, on one connection.
        assert connections <= 1
        wait_until(lambda: page.streams == 0, timeout=10, what="every stream ended")


async def sampler_connections(redis_url: str) -> int:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return sum(1 for c in await client.client_list() if c.get("name") == SAMPLER_NAME)
    finally:
        await client.aclose()


class Scripts(HTMLParser):
    """What a page loads, and what the policy would refuse: inline code and style."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("script", "link"):
            self.sources.append(found.get("src") or found.get("href") or "")
        if (tag == "script" and "src" not in found) or tag == "style":
            self.inline.append(tag)
        self.inline += [f"{tag} {name}" for name in found if name == "style" or name.startswith("on")]


async def test_the_page_shows_the_latest_frame_without_javascript(stack: Stack, ar: redis.asyncio.Redis) -> None:
    await present(Liveness(ar, dead_after=DEAD_AFTER), info("fake-paged", concurrency=6))
    with live_server(stack.redis_url) as (base, page):
        await wait_until_async(lambda: page.sampler.frame is not None, what="a first frame")
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            answer = await client.get("/console", headers={"accept": "text/html"})
            assert answer.status_code == 200
            assert "script-src 'self'" in answer.headers["content-security-policy"]
            html = answer.text
            assert "<code>fake-paged</code>" in html and "host-fake-paged" in html
            assert 'data-field="pending"' in html and 'data-live="/console/live"' in html
            parsed = Scripts()
            parsed.feed(html)
            assert parsed.inline == []
            loaded = [src for src in parsed.sources if src.startswith(STATIC_PATH)]
            assert {src.split("?")[0].rsplit("/", 1)[1] for src in loaded} >= {"overview.css", "charts.js",
                                                                                  "overview.js"}
            for src in loaded:
                assert (await client.get(src)).status_code == 200, src


@pytest.mark.slow
async def test_the_app_with_the_console_on_shows_a_call_live(stack: Stack, worker: Proc) -> None:
    with serving(create_app(app_settings(stack.redis_url, console=True))) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            page = await client.get("/console", headers={"accept": "text/html"})
            assert page.status_code == 200 and 'data-live="/console/live"' in page.text
            async with client.stream("GET", "/console/live") as response:
                assert response.status_code == 200
                # A tool no other test here calls: its row can only come from this call.
                called = await client.post("/agent/execute", json={"tool": "words", "arguments": {"text": "a b"}})
                assert called.status_code == 200
                async for name, data in events(response):
                    if name == "frame" and any(t["tool"] == "words" for t in json.loads(data)["tools"]):
                        break


async def test_the_stream_needs_a_session_when_the_api_authenticates(stack: Stack) -> None:
    settings = app_settings(stack.redis_url, console=True, api_keys={"a-key-0123456789abcdef": ApiKey(principal="p")})
    async with asgi_client(create_app(settings)) as client:
        answer = await client.get("/console/live", headers={"accept": "text/event-stream"})
        assert answer.status_code == 401  # an EventSource is no navigation: told, not redirected
        assert not answer.headers["content-type"].startswith("text/event-stream")


async def test_a_head_of_the_stream_is_its_head_alone(stack: Stack) -> None:
    """Not held for the stream's minutes, as a GET is (the console's streams end after minutes):
    the next request on the same connection was answered only once the stream had ended."""
    with live_server(stack.redis_url, rotate=300) as (base, page):
        async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=1)) as client:
            head = await client.head(base + "/console/live")
            assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")
            assert head.content == b""
            after = await client.get(base + "/console")  # the same connection, kept alive
        assert after.status_code == 200 and page.streams == 0
