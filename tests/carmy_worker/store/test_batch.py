"""Script calls of one turn of the event loop go out together, on a connection that keeps them in flight,
each caller getting its own answer."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio
import uvloop
from redis.exceptions import ConnectionError, DataError, ResponseError, TimeoutError

from carmy_worker.deadlines import Deadlines
from carmy_worker.store import batch as batch_module
from carmy_worker.store.batch import Batch, FollowUp
from carmy_worker.store.checkout import is_broken
from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.scripts import Script
from tests.support import RedisServer, new_tmp, private_redis, turns_until, wait_until_async

# Appends ARGV[1] to a list and answers with the list's length; fails on demand.
APPEND = Script("TEST_APPEND", """
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return redis.call('RPUSH', KEYS[1], ARGV[1])
""")

# Keeps Redis busy for ARGV[1] ms, then appends 'spun' to a list.
SPIN = Script("TEST_SPIN", """
local function ms() local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000) end
local stop = ms() + tonumber(ARGV[1])
while ms() < stop do end
return redis.call('RPUSH', KEYS[1], 'spun')
""")


class CountingWrites:
    """Counts the writes made on Redis connections (asyncio's ``StreamWriter.writelines``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made = 0
        original = asyncio.StreamWriter.writelines

        def writelines(writer: asyncio.StreamWriter, data: Any) -> None:
            self.made += 1
            original(writer, data)

        monkeypatch.setattr(asyncio.StreamWriter, "writelines", writelines)


async def clients(r: redis.asyncio.Redis) -> int:
    return len(await r.client_list())


@pytest.mark.parametrize("reply_last", [False, True])
async def test_a_command_before_a_call_goes_in_the_same_write_and_its_reply_is_dropped(
        reply_last: bool, ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """``before`` (a large job's staged SET: store.submit): run just ahead of its call, no write
    of its own; its reply, even an error, is nobody's, and every call still gets its own."""
    batch = Batch(ar, reply_last=reply_last)
    await batch.call(APPEND, ["warm"], ["x"])  # the batch's connection is open, the script loaded
    await ar.set("text", "not a number")
    writes = CountingWrites(monkeypatch)
    replies = await asyncio.gather(
        batch.call(APPEND, ["l"], ["a"], before=("RPUSH", "l", "before a")),
        batch.call(APPEND, ["l"], ["b"]),
        batch.call(APPEND, ["l"], ["c"], before=("INCR", "text")),  # an error reply
        batch.call(APPEND, ["l"], ["fail"], before=("RPUSH", "l", "before fail")), return_exceptions=True)
    assert writes.made == 1
    assert replies[:3] == [2, 3, 4]  # each call's own reply, none of a command before it
    assert isinstance(replies[3], ResponseError) and "asked to fail" in str(replies[3])
    assert await ar.lrange("l", 0, -1) == [b"before a", b"a", b"b", b"c", b"before fail"]


async def test_a_call_sent_again_on_its_own_sends_its_before_command_again() -> None:
    """A call Redis did not run (here NOSCRIPT: a Redis that never saw the script; on a cluster,
    a redirection) goes again through ``scripts.run``, its ``before`` just ahead of it: to the node
    that serves its keys by then, which may not have had it."""
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            reply = await Batch(client).call(APPEND, ["l"], ["a"], before=("RPUSH", "l", "before"))
            assert await client.lrange("l", 0, -1) == [b"before", b"before", b"a"]
            assert reply == 3
        finally:
            await client.aclose()


@pytest.mark.parametrize("reply_last", [False, True])
async def test_calls_of_one_turn_go_out_in_one_write_each_with_its_own_reply(
        reply_last: bool, ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    script = Batch(ar, reply_last=reply_last).script(APPEND)
    await script(keys=["warm"], args=["x"])  # the batch's connection is open
    writes = CountingWrites(monkeypatch)
    replies = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(20)))
    assert writes.made == 1
    assert sorted(replies) == list(range(1, 21))
    assert await ar.lrange("l", 0, -1) == [str(i).encode() for i in range(20)]  # in the order called


@pytest.mark.parametrize("reply_last", [False, True])
async def test_calls_of_later_turns_go_out_while_earlier_ones_wait_on_the_same_connection(
        reply_last: bool, ar: redis.asyncio.Redis) -> None:
    batch = Batch(ar, reply_last=reply_last)
    slow, script = batch.script(SPIN), batch.script(APPEND)
    await slow(keys=["warm"], args=["0"])  # loaded: the spin itself goes out in the batch
    before = await clients(ar)
    spinning = asyncio.ensure_future(slow(keys=["l"], args=["150"]))
    # The spin written: the next call goes out behind it, in flight with it.
    await turns_until(lambda: batch._in_flight() == 1, "the spin written")
    appended = await script(keys=["l"], args=["after"])
    assert spinning.done()  # Redis answers in order: the spin's reply came first
    assert (await spinning, appended) == (1, 2)
    assert await clients(ar) == before  # no other connection was opened for it


class Append(FollowUp):
    """A follow-up that appends ``value`` to list ``key``."""

    def __init__(self, script: Any, key: str, value: str) -> None:
        super().__init__()
        self.call = (script, [key], [value])

    def make(self) -> tuple[Any, list[Any], list[Any]]:
        return self.call


@pytest.mark.parametrize("reply_last", [False, True])
async def test_an_eager_batch_writes_a_lone_call_at_once_and_one_behind_another_with_the_turn(
        reply_last: bool, ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    appending = APPEND
    eager, lazy = Batch(ar, eager=True, reply_last=reply_last), Batch(ar)
    await asyncio.gather(eager.call(appending, ["warm"], ["x"]), lazy.call(appending, ["warm"], ["x"]))
    writes = CountingWrites(monkeypatch)
    first = eager.call(appending, ["l"], ["1"])
    assert writes.made == 1  # written as it was made
    other = lazy.call(appending, ["lazy"], ["1"])
    second = eager.call(appending, ["l"], ["2"])
    assert writes.made == 1  # the other batch's call, and one behind a call in flight, wait for the turn's end
    assert await asyncio.gather(first, second, other) == [1, 2, 1]
    assert writes.made == 3


@pytest.mark.parametrize("reply_last", [False, True])
async def test_an_eager_batch_writes_a_call_and_its_follow_up_at_once_unless_redis_has_more_of_it(
        reply_last: bool, ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    appending, spinning = APPEND, SPIN
    batch = Batch(ar, eager=True, reply_last=reply_last)
    script = batch.script(appending)
    await asyncio.gather(batch.call(appending, ["warm"], ["x"]), batch.call(spinning, ["warm"], ["0"]))
    writes = CountingWrites(monkeypatch)
    then = Append(appending, "l", "then")
    settled = script.send(["l"], ["first"], then)
    assert writes.made == 1  # both, in one write, before this turn goes on
    assert await settled == 1
    assert then.reply is not None and await then.reply == 2

    # Redis kept busy by this batch's calls, written and not answered yet:
    busy = [batch.call(spinning, ["busy"], ["100"]) for _ in range(batch_module.EAGER_BEHIND + 1)]
    await turns_until(lambda: batch._in_flight() == len(busy), "the busy calls written")
    made = writes.made
    behind = script.send(["l"], ["second"], Append(appending, "l", "its then"))
    assert writes.made == made  # it goes out with the turn, not at once
    assert await behind == 3
    await asyncio.gather(*busy)
    assert await ar.lrange("l", 0, -1) == [b"first", b"then", b"second", b"its then"]


async def test_an_idle_connection_redis_closed_is_replaced_without_failing_a_call(ar: redis.asyncio.Redis) -> None:
    script = Batch(ar).script(APPEND)
    assert await script(keys=["l"], args=["a"]) == 1
    assert await ar.client_kill_filter(_type="normal", skipme=True) >= 1  # the batch's connection
    assert await script(keys=["l"], args=["b"]) == 2


async def test_a_failed_connection_fails_the_calls_in_flight_on_it_and_the_next_call_opens_another(
        ar: redis.asyncio.Redis, redis_server: RedisServer) -> None:
    impatient = redis.asyncio.Redis.from_url(redis_server.url, socket_timeout=0.2)
    batch = Batch(impatient)
    slow, script = batch.script(SPIN), batch.script(APPEND)
    try:
        await slow(keys=["warm"], args=["0"])
        results = await asyncio.gather(slow(keys=["l"], args=["600"]), script(keys=["l"], args=["a"]),
                                       return_exceptions=True)
        assert all(isinstance(r, TimeoutError) for r in results), results
        assert redis_server.client().llen("l") == 2  # waits for the spin to end; "a" ran after it
        assert await script(keys=["l"], args=["b"]) == 3
    finally:
        await impatient.aclose()


async def test_an_argument_that_cannot_be_sent_fails_its_call_only(ar: redis.asyncio.Redis) -> None:
    script = Batch(ar).script(APPEND)
    results = await asyncio.gather(script(keys=["l"], args=["a"]), script(keys=["l"], args=[None]),
                                   return_exceptions=True)
    assert results[0] == 1
    assert isinstance(results[1], DataError)


@pytest.mark.parametrize("reply_last", [False, True])
async def test_an_error_is_its_callers_only(reply_last: bool, ar: redis.asyncio.Redis) -> None:
    script = Batch(ar, reply_last=reply_last).script(APPEND)
    results = await asyncio.gather(script(keys=["l"], args=["a"]), script(keys=["l"], args=["fail"]),
                                   script(keys=["l"], args=["b"]), return_exceptions=True)
    assert results[0] == 1 and results[2] == 2
    assert isinstance(results[1], ResponseError) and "asked to fail" in str(results[1])


@pytest.mark.parametrize("reply_last", [False, True])
async def test_scripts_a_restarted_redis_lost_are_loaded_again(reply_last: bool, ar: redis.asyncio.Redis) -> None:
    script = Batch(ar, reply_last=reply_last).script(APPEND)
    await script(keys=["l"], args=["warm"])
    await ar.script_flush()
    replies = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(3)))
    assert sorted(replies) == [2, 3, 4]


@pytest.mark.parametrize("reply_last", [False, True])
async def test_a_cancelled_caller_leaves_the_others_their_answers(reply_last: bool, ar: redis.asyncio.Redis) -> None:
    batch = Batch(ar, reply_last=reply_last)
    script = batch.script(APPEND)
    first = asyncio.ensure_future(script(keys=["l"], args=["a"]))
    gone = asyncio.ensure_future(script(keys=["l"], args=["b"]))
    last = asyncio.ensure_future(script(keys=["l"], args=["c"]))
    await turns_until(lambda: len(batch._waiting) == 3, "the three calls queued in the same turn")
    gone.cancel()
    assert sorted([await first, await last]) == [1, 2]
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert await ar.lrange("l", 0, -1) == [b"a", b"c"]  # cancelled before it was sent: never ran


async def test_a_failed_connection_fails_every_call_of_the_batch() -> None:
    dead = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    script = Batch(dead).script(APPEND)
    results = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, (ConnectionError, OSError)) for r in results), results
    await dead.aclose()


async def test_a_primary_demoted_to_a_replica_fails_the_connection_not_only_the_call(
        redis_server: RedisServer) -> None:
    """READONLY is what a Sentinel client's primary says once it became a replica: redis-py's own
    reader then drops the connection, so that the next call finds the new primary. The batch
    reads its replies itself, and must do the same, not keep writing to the replica."""
    replica = RedisServer(new_tmp(), replica_of=redis_server.port)
    replica.start()
    client = redis.asyncio.Redis(host="127.0.0.1", port=replica.port)
    try:
        await client.script_load(APPEND.source)  # known there: the reply is READONLY, not NOSCRIPT
        batch = Batch(client)
        script = batch.script(APPEND)
        results = await asyncio.gather(*(script(keys=["l"], args=[str(i)]) for i in range(3)), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results), results  # every call on it
        assert batch._line is None  # given up: the next call opens another connection
    finally:
        await client.aclose()
        replica.stop()


class ResettingProxy:
    """A TCP proxy in front of Redis that can reset the connections it carries (as a load
    balancer or a NAT dropping an idle connection does)."""

    def __init__(self, redis_port: int) -> None:
        self._redis_port = redis_port
        self._clients: list[asyncio.StreamWriter] = []
        self._upstream: list[asyncio.StreamWriter] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> ResettingProxy:
        self._server = await asyncio.start_server(self._carry, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self.reset_all()
        self._server.close()
        await self._server.wait_closed()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self._redis_port)
        self._clients.append(writer)
        self._upstream.append(upstream_writer)
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            self._pipes.add(asyncio.ensure_future(self._pipe(source, sink)))

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await source.read(65536):
                sink.write(data)

    def reset_all(self) -> None:
        for writer in self._clients:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()  # with SO_LINGER 0: a reset, not a close
        for writer in self._upstream:
            writer.transport.abort()
        self._clients.clear()
        self._upstream.clear()


async def calls_after_a_reset(redis_port: int) -> list[object]:
    async with ResettingProxy(redis_port) as proxy:
        client = RedisConnector(f"redis://127.0.0.1:{proxy.port}").store_client(max_connections=4, wait=1.0,
                                                                                socket_timeout=2)
        script = Batch(client).script(APPEND)
        try:
            await script(keys=["reset"], args=["warm"])  # loaded, and the batch's connection open
            proxy.reset_all()
            # Reset under the idle connection: the loop hears of it before anyone writes.
            await wait_until_async(lambda: all(is_broken(c) for c in client.connection_pool._in_use_connections),
                                   what="the reset seen")
            return [await asyncio.wait_for(script(keys=["reset"], args=[str(i)]), 5) for i in range(2)]
        finally:
            await client.aclose()


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_connection_reset_while_idle_is_replaced_without_failing_a_call(
        run: Callable[[Any], Any], ar: redis.asyncio.Redis, redis_server: RedisServer) -> None:
    # uvloop closes a reset transport at once and keeps the error for the next read: writing on
    # it raised in the batch's callback, and every later call waited for ever.
    port = int(redis_server.url.rsplit(":", 1)[1].split("/")[0])
    assert run(calls_after_a_reset(port)) == [2, 3]


async def test_calls_waiting_for_a_connection_are_not_left_waiting_when_its_opening_is_cancelled(
        ar: redis.asyncio.Redis) -> None:
    batch = Batch(ar)
    script = batch.script(APPEND)
    first = asyncio.ensure_future(script(keys=["l"], args=["a"]))
    # The first call's turn is over: a connection is being opened.
    await turns_until(lambda: batch._opening is not None, "a connection being opened")
    batch._opening.cancel()  # before its first step, as a loop shutting down cancels its tasks
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await script(keys=["l"], args=["b"]) == 1  # "a" never went out


async def test_a_connection_whose_oldest_call_stalled_takes_no_new_calls(
        ar: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_module, "STALL_S", 0.05)
    # The stalled connection's own calls are dropped only when its deadline is next looked at:
    # not during this test (the next one is about that).
    monkeypatch.setattr(batch_module, "_stalls", Deadlines(tick=60))
    batch = Batch(ar)
    slow, script = batch.script(SPIN), batch.script(APPEND)
    await slow(keys=["warm"], args=["0"])
    before, opened = await clients(ar), await connections_opened(ar)
    spinning = asyncio.ensure_future(slow(keys=["l"], args=["300"]))
    await turns_until(lambda: batch._in_flight() == 1, "the spin written")
    await asyncio.sleep(2 * batch_module.STALL_S)  # the stall itself: its reply waited for longer than STALL_S
    appended = await script(keys=["l"], args=["after"])  # on another connection, answered after the spin
    assert (await spinning, appended) == (1, 2)
    assert await connections_opened(ar) == opened + 1
    # The stalled connection, answered at last, is given up: one connection is left to the batch.
    for _ in range(500):
        if await clients(ar) == before:
            break
        await asyncio.sleep(0.01)
    assert await clients(ar) == before


@pytest.mark.parametrize("connected", [True, False], ids=["on-its-connection", "opening-one"])
@pytest.mark.slow
async def test_calls_on_a_hung_redis_fail_as_on_a_cut_connection_once_stalled_and_the_next_go_out_anew(
        connected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis that hangs (stopped: it takes in what is written and answers nothing, and nothing
    resets the connection) on a client without a reply timeout, a worker's: the calls in flight
    fail once the oldest has waited ``STALL_S``, as on a cut connection (they may have run), and
    so do calls waiting for a new connection whose handshake it never answers, where both used
    to wait for the node to wake; the next call, once it answers, goes out anew."""
    monkeypatch.setattr(batch_module, "STALL_S", 0.5)
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)  # the batch's: no connection yet
        other = redis.asyncio.Redis.from_url(server.url)
        script = Batch(client, eager=True).script(APPEND)
        try:
            assert await other.rpush("l", "a") == 1
            if connected:
                await script(keys=["warm"], args=["x"])  # the batch's connection is open
            server.pause()
            started = time.monotonic()
            try:
                with pytest.raises(ConnectionError, match="hung or cut off"):
                    async with asyncio.timeout(30):  # the test's bound: it used to wait for Redis to wake
                        await asyncio.gather(script(keys=["l"], args=["b"]), script(keys=["l"], args=["c"]))
                waited = time.monotonic() - started
            finally:
                server.resume()
            assert 0.5 - 0.05 <= waited < 0.5 + 5
            # The next call is answered. What the dropped connection carried ran when Redis woke
            # (it had taken it in), or never: "may have run", as on any connection cut.
            assert await script(keys=["l"], args=["d"]) in (2, 4)
            assert (await other.lrange("l", 0, -1))[0] == b"a"
        finally:
            await client.aclose()
            await other.aclose()


async def connections_opened(r: redis.asyncio.Redis) -> int:
    return int((await r.info("stats"))["total_connections_received"])


async def test_a_reply_last_batch_writes_a_ping_ahead_of_its_calls(ar: redis.asyncio.Redis) -> None:
    """Redis writes a caller's reply before the messages its scripts published (it queues the
    last client it has something for first): a PING ahead of the calls gives the batch's
    connection its reply first, and the messages go out before it (``Batch(reply_last=True)``)."""
    appending = APPEND
    batch = Batch(ar, eager=True, reply_last=True)
    await batch.call(appending, ["warm"], ["x"])
    seen: list[str] = []
    async with ar.monitor() as monitor:
        async def watch() -> None:
            while True:
                command = await monitor.next_command()
                if command["client_type"] != "lua" and not command["command"].startswith("CLIENT"):
                    seen.append(command["command"].split()[0])

        watching = asyncio.ensure_future(watch())
        first = batch.call(appending, ["l"], ["1"])  # written at once
        rest = [batch.call(appending, ["l"], [str(i)]) for i in range(2, 5)]  # with the turn, in one write
        assert await asyncio.gather(first, *rest) == [1, 2, 3, 4]
        await wait_until_async(lambda: seen.count("EVALSHA") == 4, 10, what="MONITOR to see the four calls")
        watching.cancel()
    assert seen == ["PING", "EVALSHA", "PING", "EVALSHA", "EVALSHA", "EVALSHA"]


class Recorded(Append):
    """An ``Append`` that notes in ``order`` when its reply was taken."""

    def __init__(self, script: Any, key: str, value: str, order: list[str]) -> None:
        super().__init__(script, key, value)
        self.order = order

    def answered(self, reply: asyncio.Future[Any]) -> None:
        if "follow-up" not in self.order:
            self.order.append("follow-up")
        super().answered(reply)


async def test_a_follow_up_takes_its_reply_before_the_caller_of_the_call_it_follows_goes_on(
        ar: redis.asyncio.Redis) -> None:
    """What a SETTLE's LEASE brings (a slot's next job) starts before the job whose SETTLE it
    was resumes its tail."""
    appending = APPEND
    batch = Batch(ar, eager=True, reply_last=True)
    await batch.call(appending, ["warm"], ["x"])
    order: list[str] = []
    then = Recorded(appending, "l", "then", order)
    settled = batch.script(appending).send(["l"], ["first"], then)

    async def caller() -> None:
        assert await settled == 1
        order.append("caller")

    await caller()
    assert order == ["follow-up", "caller"]
    assert then.reply is not None and await then.reply == 2


async def test_a_follow_up_that_fails_takes_its_error_and_the_call_it_follows_its_reply(
        ar: redis.asyncio.Redis) -> None:
    appending = APPEND
    batch = Batch(ar, eager=True, reply_last=True)
    await batch.call(appending, ["warm"], ["x"])
    order: list[str] = []
    then = Recorded(appending, "l", "fail", order)
    settled = batch.script(appending).send(["l"], ["first"], then)
    assert await asyncio.wait_for(settled, 5) == 1
    assert order == ["follow-up"]
    assert then.reply is not None and isinstance(then.reply.exception(), ResponseError)
    assert await batch.call(appending, ["l"], ["next"]) == 2  # the connection is fine


async def test_a_call_says_when_it_has_been_written_and_never_if_it_failed_first() -> None:
    """``sent`` is set once the call is on its connection, before Redis answers (a stopped Redis
    answers nothing, yet the call is written), if Redis has run its script on that connection
    (else Redis might refuse it, NOSCRIPT, and it would be sent again later); a call whose
    connection never opens fails without setting it. (The API begins an SSE stream on it:
    ``Submit.send``.)"""
    with private_redis() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        batch = Batch(client)
        try:
            first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            await batch.call(APPEND, ["warm"], ["x"], sent=first)  # the batch's connection is open
            assert not first.done()  # Redis had not seen the script: it loaded it, and ran it anew
            await batch.call(APPEND, ["warm"], ["y"])  # run on the batch's connection this time
            server.pause()
            try:
                sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                reply = batch.call(APPEND, ["l"], ["a"], sent=sent)
                assert not sent.done()  # queued for the end of this turn
                async with asyncio.timeout(10):
                    await sent
                assert not reply.done()  # written, and not answered: Redis is stopped
            finally:
                server.resume()
            assert await reply == 1
        finally:
            await client.aclose()
    dead = redis.asyncio.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    with pytest.raises((ConnectionError, OSError)):
        await Batch(dead).call(APPEND, ["l"], ["a"], sent=never)
    assert not never.done()
    await dead.aclose()
