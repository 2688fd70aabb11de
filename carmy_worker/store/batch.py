"""Script calls made in the same turn of the event loop, sent to Redis together, on a connection
that keeps them in flight.

Under load many executions reach the same step at once (a LEASE hands a worker several jobs, an
API process submits the calls of many clients), and each script call used to be a write of its
own, on a connection of its own. On these machines that write, which also wakes Redis, is most
of a round trip's CPU, on both sides. ``Batch`` collects the calls made during one turn of the
loop and writes them at the end of it, in one write. Not a transaction: each script is as atomic
as it always was, and each caller gets its own reply or error.

The write is made by the turn's last callback itself, on a connection the batch keeps (a
``_Line``): no task, no pool checkout and none of redis-py's per-command machinery stand between
a call and Redis (they were about 70 µs of a lone call's round trip). Calls of later
turns go out on the same connection while earlier ones still wait: Redis answers in order, and
one reader hands each caller its reply. A connection that fails fails the calls in flight on it
(they may or may not have run, as with any command cut off), and the next call opens another; so
does a call that finds the connection closed or reset while idle (it is replaced first), or
stalled (``STALL_S``). A connection stalled that long is also dropped, its calls failed as a cut
connection's: a node that hangs (a stopped process, a partition without a reset) would otherwise
hold them until it woke, on a client without a reply timeout (a worker's SETTLE: the outcome of
a tool that ran, which the worker sends again, to whoever serves its keys by then).

An ``eager`` batch (a worker's SETTLEs) writes a call at once instead of at the end of its turn
while Redis has little else of the batch's to run: a lone call when none is in flight (one
client: the SETTLE goes out before the rest of the turn runs), and a call sent with its follow-up
(a full worker's SETTLE with the LEASE of its slot's next job, in one write) when at most
``EAGER_BEHIND`` calls are. Redis then runs them while the worker goes on with the rest of its
turn: jobs that end together (a full worker's) reach their next jobs sooner. Not under load: a
write per call then costs both sides more CPU than the overlap saves (the no-op at 64 clients
lost 8 to 20 % with every call written at once). Measured in bench/README.md, "Issue 14, SETTLE
written at once".

Only for scripts whose writes do not wait for replicas (``store.durable``): those keep their
own call and ``WAIT``.

**On a Redis Cluster** (a ``StoreCluster`` client) a batch keeps a line per node: each call is
written to the primary of its keys' slot, with the other calls of its turn for that node (one
write per node). A call a node refused (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``:
nothing ran) is sent again on its own through the cluster client, which follows the redirection,
as one Redis's ``NOSCRIPT`` is; a line that fails fails its calls in flight (they may have run:
never sent again) and has the slot table reloaded, and until it is, calls go out one by one
through the cluster client (which reloads it first), as they do before the table's first load.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Coroutine
from typing import Any, cast

from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError, NoScriptError, ReadOnlyError, ResponseError

from carmy_worker.deadlines import Deadlines
from carmy_worker.loop import running_loop
from carmy_worker.store.checkout import buffered_reply, is_broken, is_stale
from carmy_worker.store.cluster import REDIRECTED, NodePool, StoreCluster, as_redis
from carmy_worker.store.scripts import Runs, Script, answered_within, bind, hung, run, send_before

# An eager batch writes a call with its follow-up at once while at most this many of its calls
# are still at Redis (see the module; at 8 the scale-out rows gained more, the no-op at 64 clients
# lost 8 %).
EAGER_BEHIND = 1

# A connection whose oldest call has waited this long for its reply takes no new calls (they go
# out on another), and is dropped: the calls on it fail with a ``ConnectionError``, as on a
# connection cut (they may have run). A primary gone silent (a stopped process, a partition: no
# reset, no close) would otherwise hold them, and every later call, where a client without a
# reply timeout (the workers') waits for TCP to give up, or for the node to wake and run them
# after a replica took its place. Far longer than any of our scripts takes; the loops' reply
# timeout (``runtime.queue.REPLY_TIMEOUT_S``) is the same.
STALL_S = 5.0
# How often the lines' deadlines are looked at (one timer for all of them): a stalled line is
# dropped up to this much later than ``STALL_S``.
STALL_TICK_S = 0.25
_stalls = Deadlines(tick=STALL_TICK_S)

# Replies saying a call did not run and may be sent again as it is (through ``scripts.run``, which
# loads a script Redis lacks and, on a cluster, follows a node's redirection).
NOT_RUN = (NoScriptError, *REDIRECTED)


class _Call:
    __slots__ = ("args", "before", "follows", "future", "keys", "script", "sent", "sent_at")

    def __init__(self, script: Script, keys: list[Any], args: list[Any], future: asyncio.Future[Any],
                 follows: FollowUp | None = None, sent: asyncio.Future[None] | None = None,
                 before: tuple[Any, ...] | None = None) -> None:
        self.script = script
        self.keys = keys
        self.args = args
        self.future = future
        self.follows = follows  # the FollowUp this call is (sent right behind the call before it)
        self.sent = sent  # set once the call is written (``Batch.call``)
        self.sent_at = 0.0  # the loop's time when it was written
        self.before = before  # a plain command written just ahead of it (``Batch.call``)


class _Dropped:
    """A command in flight whose reply nobody reads: the PING written ahead of a batch's calls
    (``Batch(reply_last=True)``), or a call's ``before``."""

    __slots__ = ("sent_at",)

    def __init__(self, sent_at: float) -> None:
        self.sent_at = sent_at


class _Line:
    """A connection held by a batch, and the calls written on it whose replies are to come, in
    the order Redis answers them."""

    __slots__ = ("broken", "conn", "dropped", "in_flight", "ran", "reader")

    def __init__(self, conn: AbstractConnection) -> None:
        self.conn = conn
        self.in_flight: deque[_Call | _Dropped] = deque()
        self.dropped = 0  # _Dropped among them: what is in flight less the calls
        self.reader: asyncio.Task[None] | None = None  # reads while calls are in flight, then ends
        self.broken = False
        # The scripts Redis has run calls of on this connection (forgotten on a NOSCRIPT: a
        # SCRIPT FLUSH): a call of one of them runs as it is written (``Batch.call``'s ``sent``).
        self.ran: set[str] = set()

    def usable(self, now: float) -> bool:
        if self.broken or not self.conn.is_connected:
            return False
        if not self.in_flight:  # anything to read was not asked for (a close by the server, say)
            return not is_stale(self.conn)
        # Reset or closed under it, nothing written now would be answered; stalled, maybe never.
        return not is_broken(self.conn) and now - self.in_flight[0].sent_at < STALL_S


class Batch:
    """The script calls of one turn of the event loop, on one client, sent together; an
    ``eager`` one writes a call at once while Redis has little else of it to run (see the
    module)."""

    def __init__(self, redis: Redis, *, eager: bool = False, reply_last: bool = False,
                 node: NodePool | None = None) -> None:
        self._redis = redis
        # On a cluster: a batch per node (``_nodes``, by name), each on that node's connections.
        self._cluster = redis if isinstance(redis, StoreCluster) and node is None else None
        self._nodes: dict[str, Batch] = {}
        self._pool: Any = node if node is not None else None if self._cluster else redis.connection_pool
        self.eager = eager
        # Redis writes its replies after a command in the reverse order of the clients they go
        # to: the caller's own reply, added last, goes out first, and a PUBLISH of its scripts
        # (a final event its API waits for) after it, a write and a wake-up later. A PING ahead
        # of each write gives this connection a reply before the scripts run, and their events
        # go out first (a worker's SETTLE: bench/README.md, "Issue 14, the last part", its
        # "Redis's order of replies").
        self.reply_last = reply_last
        self._waiting: list[_Call] = []  # called during this turn
        self._unsent: list[_Call] = []  # sent at the end of their turn, waiting for a connection
        self._line: _Line | None = None
        self._opening: asyncio.Task[None] | None = None  # getting a connection for the calls unsent
        self._tasks: set[asyncio.Task[Any]] = set()  # kept referenced until they are done

    def script(self, script: Script) -> Runs:
        """``script``, called like one, its calls batched here."""
        return bind(self._redis, script, batch=self)

    def call(self, script: Script, keys: list[Any], args: list[Any], *, hold: bool = False,
             follows: FollowUp | None = None, sent: asyncio.Future[None] | None = None,
             before: tuple[Any, ...] | None = None) -> asyncio.Future[Any]:
        """Queue one call; it goes out with the others of this turn of the loop, or at once if
        the batch is eager, none of its calls is in flight or waiting, and it is not told to
        ``hold`` it (for a call to follow it in the same write: ``flush_if_quiet``). ``sent`` is
        set once the call has been written to a connection on which Redis has run its script
        before: what Redis reads next from anyone, it reads after this call, which runs as it
        is. Else (a new connection, a script Redis may not have, which it would refuse and the
        batch send again, later: ``NOT_RUN``; a cluster whose slot table is not loaded) it is
        never set, nor for a call that fails first.

        ``before``: a plain command (a large value's ``SET``: ``store.staging``) written just ahead
        of the call, in the same write: no round trip of its own. Its reply is dropped; the
        script checks what it needs of it. A call sent again on its own (``NOT_RUN``) sends it
        again first, to whichever node serves its keys by then."""
        if self._cluster is not None:
            return self._routed(self._cluster, script, keys, args, hold, follows, sent, before)
        loop = running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._waiting.append(_Call(script, keys, args, future, follows, sent, before))
        if len(self._waiting) == 1:  # the first of this turn
            if self.eager and not hold and not self._in_flight():
                self._send()
            else:  # the send runs once the turn is over
                loop.call_soon(self._send)
        return future

    def _routed(self, cluster: StoreCluster, script: Script, keys: list[Any], args: list[Any], hold: bool,
                follows: FollowUp | None, sent: asyncio.Future[None] | None,
                before: tuple[Any, ...] | None) -> asyncio.Future[Any]:
        """A call on a cluster: in the batch of its slot's primary, or, while the slot table is
        not loaded (or is to be reloaded), alone through the cluster client."""
        if cluster._initialize or not keys:
            future: asyncio.Future[Any] = running_loop().create_future()
            self._spawn(_one(as_redis(cluster), _Call(script, keys, args, future, follows, sent, before)))
            return future
        node = cluster.primary_for(keys[0])
        batch = self._nodes.get(node.name)
        if batch is None or cast(NodePool, batch._pool).node is not node:
            batch = self._nodes[node.name] = Batch(as_redis(cluster), eager=self.eager, reply_last=self.reply_last,
                                                   node=NodePool(cluster, node))
        return batch.call(script, keys, args, hold=hold, follows=follows, sent=sent, before=before)

    def flush_if_quiet(self) -> None:
        """Send what waits for the end of this turn now, if this batch is eager and at most
        ``EAGER_BEHIND`` of its calls are still at Redis (see the module)."""
        for batch in self._nodes.values():
            batch.flush_if_quiet()
        if self.eager and self._in_flight() <= EAGER_BEHIND:
            self._send()

    def _lost(self) -> None:
        """A line to a node failed: the slot table is reloaded before the next call."""
        if isinstance(self._redis, StoreCluster):
            self._redis.reload_slots()

    def _in_flight(self) -> int:
        if self._nodes:
            return sum(batch._in_flight() for batch in self._nodes.values())
        line = self._line
        return len(line.in_flight) - line.dropped if line is not None else 0

    def _send(self) -> None:
        if not self._waiting:  # an eager batch sent them already
            return
        self._unsent += self._waiting
        self._waiting = []
        if self._opening is None:
            self._write()

    def _write(self) -> None:
        calls, self._unsent = [call for call in self._unsent if not call.future.done()], []
        if not calls:  # callers cancelled meanwhile: never sent, never run
            return
        line, now = self._line, running_loop().time()
        if line is None or not line.usable(now):
            self._unsent = calls
            self._replace(line)
            return
        chunks: list[bytes] = []
        sent: list[_Call] = []
        entries: list[_Call | _Dropped] = []  # what is in flight once written, in Redis's order
        for call in calls:
            try:
                packed = line.conn.pack_command(*call.script.command(call.keys, call.args))
                if call.before is not None:
                    packed[:0] = line.conn.pack_command(*call.before)
            except Exception as exc:  # an argument Redis cannot be sent (None, say): that call's error
                _fail(call.future, exc)
            else:
                chunks += packed
                call.sent_at = now
                sent.append(call)
                if call.before is not None:
                    entries.append(_Dropped(now))
                entries.append(call)
        if sent and self.reply_last:
            chunks[:0] = line.conn.pack_command("PING")
        # The connection's stream writer (redis-py's own attribute), written without waiting for
        # it to drain: the calls in flight are bounded by their callers, who wait for replies.
        writer = line.conn._writer
        assert writer is not None  # usable(): connected
        try:
            writer.writelines(chunks)
        except Exception:  # refused at once (a transport closed meanwhile): nothing went out
            self._unsent = sent + self._unsent
            self._replace(line)
            return
        if sent and self.reply_last:
            entries.insert(0, _Dropped(now))
        line.dropped += len(entries) - len(sent)
        line.in_flight += entries
        for call in sent:
            if call.sent is not None and call.script.name in line.ran:
                _answer(call.sent, None)
        if line.reader is None and line.in_flight:
            line.reader = self._spawn(self._read(line))
            line.reader.add_done_callback(functools.partial(self._reader_ended, line))

    def _replace(self, line: _Line | None) -> None:
        """Give up ``line`` (None: there is none yet) and open another; the calls unsent go out
        on it, or fail with the error of opening it."""
        self._line = None
        if line is not None and not line.broken:
            line.broken = True
            if line.reader is None:  # nothing in flight: nobody else will give it back
                self._spawn(self._give_back(line.conn))
        self._opening = self._spawn(self._open())
        self._opening.add_done_callback(self._opened)

    async def _open(self) -> None:
        try:
            # A hung node accepts the connection (its kernel does) and answers none of
            # redis-py's handshake: bounded as a line is (one timer per connection opened).
            async with answered_within(STALL_S, "no answer to a new connection"):
                conn = await self._pool.get_connection()
        except BaseException as exc:
            self._lost()
            calls, self._unsent = self._unsent, []
            for call in calls:
                _fail(call.future, exc)
            raise
        finally:
            self._opening = None
        self._line = _Line(conn)
        self._write()

    async def _read(self, line: _Line) -> None:
        """Hand each call in flight on ``line`` its reply, in order, until none is left; a call
        with a follow-up behind it (``FollowUp``) gets its reply once the follow-up has had its
        own, and the follow-up's ``answered`` is called at once: what it brings (a worker's next
        job) starts before whoever waits for the call before it (that job's tail) goes on."""
        conn = line.conn
        held: tuple[_Call, Any] | None = None  # answered once the follow-up behind it is
        try:
            while line.in_flight:
                # Replies that came together are taken from the parser as they are: the read,
                # with its timeout, is for one still to come.
                reply: Any = buffered_reply(conn)
                if reply is NOT_ENOUGH_DATA:
                    try:
                        reply = await _next_reply(line)
                    except ResponseError as exc:  # the script's error, read whole: the connection is fine
                        reply = exc
                if isinstance(reply, ReadOnlyError):
                    # A primary demoted to a replica under a Sentinel client: nothing on this
                    # connection can write any more, as redis-py's own reader says when it reads
                    # the reply itself (SentinelManagedConnection). The calls on it fail, with
                    # the connection, and the next goes to the new primary.
                    raise ConnectionError("the previous primary is now a replica")
                call = line.in_flight.popleft()
                if isinstance(call, _Dropped):
                    line.dropped -= 1
                    continue
                if isinstance(reply, NOT_RUN):  # a restarted Redis lost the script, a node redirected: not run
                    line.ran.discard(call.script.name)
                    self._spawn(_one(self._redis, call))
                elif isinstance(reply, Exception):
                    _fail(call.future, reply)
                else:
                    line.ran.add(call.script.name)
                    if held is None and line.in_flight and _leads(line.in_flight[0]):
                        held = (call, reply)
                        continue
                    _answer(call.future, reply)
                if call.follows is not None and call.future.done():
                    _follow_up_answered(call.follows, call.future)
                if held is not None:
                    _answer(held[0].future, held[1])
                    held = None
        except BaseException as exc:  # the connection failed (redis-py closed it): every call on it did, or may have
            self._lost()
            if held is not None:
                _answer(held[0].future, held[1])
            line.broken = True
            if self._line is line:
                self._line = None
            calls = [call for call in line.in_flight if isinstance(call, _Call)]
            line.in_flight.clear()
            for call in calls:
                _fail(call.future, exc)
            await self._give_back(conn)
            raise
        finally:
            line.reader = None
        if line.broken:  # given up while its calls were answered (it stalled): back to the pool
            await self._give_back(conn)

    # A task cancelled before its first step (the loop shutting down) never runs its own
    # ``finally``: these settle what it would have.

    def _opened(self, task: asyncio.Task[None]) -> None:
        if self._opening is task:
            self._opening = None
            calls, self._unsent = self._unsent, []
            for call in calls:
                call.future.cancel()

    def _reader_ended(self, line: _Line, task: asyncio.Task[None]) -> None:
        if line.reader is task:
            line.reader, line.broken = None, True
            if self._line is line:
                self._line = None
            while line.in_flight:
                call = line.in_flight.popleft()
                if isinstance(call, _Call):
                    call.future.cancel()
            with contextlib.suppress(RuntimeError):  # a closed loop takes its connections with it
                self._spawn(self._give_back(line.conn))

    async def _give_back(self, conn: AbstractConnection) -> None:
        try:
            await conn.disconnect()
        finally:
            await self._pool.release(conn)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(_settled(self._tasks))
        return task


def _settled(tasks: set[asyncio.Task[Any]]) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # the error was each caller's: retrieved, so asyncio does not log it again

    return done


async def _next_reply(line: _Line) -> Any:
    """The next reply on ``line``, read by its reader; ``ConnectionError`` once the oldest call
    in flight has waited ``STALL_S`` for it (up to ``STALL_TICK_S`` later), when redis-py has
    dropped the connection (as it does when a read is cancelled): nothing more will be read on it.
    The deadline is one entry in ``_stalls``, not a timer per read (about 1.3 µs a read), and
    none where the connection has a reply timeout of its own (the API's: 1 s)."""
    if line.conn.socket_timeout is not None:
        return await line.conn.read_response()
    due = line.in_flight[0].sent_at + STALL_S - running_loop().time()
    task = _stalls.start(max(due, 0.0))
    try:
        return await line.conn.read_response()
    except asyncio.CancelledError:
        if _stalls.expired(task):
            raise hung("no reply", STALL_S) from None
        raise
    finally:
        _stalls.stop(task)


async def _one(redis: Redis, call: _Call) -> None:
    """``call`` on its own (``scripts.run`` loads a script Redis does not have), within
    ``STALL_S`` as a line's calls are: on a cluster it may go to a node that hangs (the slot table
    not yet reloaded). Not the calls' usual path, so a timer of its own costs nothing."""
    try:
        async with answered_within(STALL_S):
            if call.before is not None:
                await send_before(redis, call.before)
            reply = await run(redis, call.script, call.keys, call.args)
    except BaseException as exc:
        _fail(call.future, exc)
        if isinstance(exc, asyncio.CancelledError):
            raise
        return
    _answer(call.future, reply)


class FollowUp:
    """A script call to send right behind another, in the same write on the same connection:
    Redis runs it just after that one, and both replies come back together. ``make`` gives the
    call (script, keys, arguments) as it is about to go out, or None to send nothing; ``reply``
    is its future once it was sent (None: it never was, and never ran)."""

    def __init__(self) -> None:
        self.reply: asyncio.Future[Any] | None = None

    def make(self) -> tuple[Script, list[Any], list[Any]] | None:
        raise NotImplementedError

    def answered(self, reply: asyncio.Future[Any]) -> None:
        """Called as soon as ``reply`` is done, whoever reads it later (or nobody: a shutdown)."""
        if not reply.cancelled():
            reply.exception()  # retrieved: an error nobody reads is not news


def _follow_up_answered(follow_up: FollowUp, reply: asyncio.Future[Any]) -> None:
    """``follow_up.answered(reply)``, called by the reader itself: an error of it is reported
    as one of a done callback would be, never taken for the connection's."""
    try:
        follow_up.answered(reply)
    except Exception as exc:
        running_loop().call_exception_handler({"message": "a FollowUp failed to take its reply", "exception": exc})


def _leads(next_call: _Call | _Dropped) -> bool:
    """Whether the call just read is followed by a ``FollowUp`` of its own (the next in flight)."""
    return isinstance(next_call, _Call) and next_call.follows is not None


def _answer(future: asyncio.Future[Any], reply: Any) -> None:
    if not future.done():
        future.set_result(reply)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if future.done():
        return
    if isinstance(exc, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(exc)
