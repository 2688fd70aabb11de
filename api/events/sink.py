"""The audit sink (``CARMY_AUDIT_SINK``): a background task of each API process that writes the
audit trail's entries as JSON lines, one object a line with the fields ``GET /agent/audit``
answers, to stdout or appended to a file.

Every API process with a sink reads the trail in one consumer group (``store.shipment``), so an
entry is written by one of them only. A batch is acknowledged once its lines are written and
flushed: a process killed between the two leaves its batch pending, and another process (or
itself, restarted) writes it again after ``CLAIM_IDLE_MS`` — at least once across a crash,
exactly once otherwise. Redis errors never reach the API: the loop waits (0.1 s doubling up to
5 s) and goes on, creating the group again if Redis lost it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
import uuid
from typing import Protocol

from redis.exceptions import RedisError, ResponseError

from carmy_worker.store.connect import RedisConnector
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.shipment import Lot, Shipment, group_lost
from carmy_worker.wire import json_encoder

log = logging.getLogger("carmy.api")

BATCH = 100  # entries read (and lines written) at once
BLOCK_MS = 1_000  # how long a read waits for new entries: also how often stale ones are looked for
CLAIM_EVERY_S = 5.0  # how often this process looks for entries a dead one left pending
FORGET_EVERY_S = 600.0  # how often it forgets consumers long gone
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.1, 5.0
REPLY_MARGIN_S = 5.0  # a blocked read's reply may take BLOCK_MS and this before the connection counts as lost


class Lines(Protocol):
    """Where the lines go: ``write`` returns once they are written and flushed."""

    def write(self, lines: bytes) -> None: ...


class Stdout:
    def write(self, lines: bytes) -> None:
        sys.stdout.buffer.write(lines)
        sys.stdout.buffer.flush()


class AppendFile:
    """A file opened for appending, written with one ``write`` per batch: processes sharing it
    (O_APPEND) never interleave inside a batch. Opened again for each batch, so that a log
    rotation that moves the file away is followed at once."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, lines: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            written = os.write(fd, lines)
            while written < len(lines):  # a short write (a full disk frees up, a signal)
                written += os.write(fd, lines[written:])
        finally:
            os.close(fd)


def lines_for(sink: str) -> Lines:
    """The writer of a validated ``AuditSettings.sink`` (``stdout`` or ``file:<path>``)."""
    return Stdout() if sink == "stdout" else AppendFile(sink.removeprefix("file:"))


def consumer_name() -> str:
    """This process's name in the group: unique, and telling an operator where it ran."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def audit_sink(connector: RedisConnector, sink: str, *, connect_timeout: float) -> AuditSink:
    """The sink of a validated ``AuditSettings.sink``, on a client of its own: its blocking reads
    hold a connection that the API's pool must not lend."""
    client = connector.client(socket_connect_timeout=connect_timeout, socket_timeout=BLOCK_MS / 1000 + REPLY_MARGIN_S)
    return AuditSink(Shipment(client, consumer_name()), lines_for(sink))


class AuditSink:
    """Ships the trail's entries to ``lines`` until cancelled (``run``); ``close`` then."""

    def __init__(self, shipment: Shipment, lines: Lines) -> None:
        self.shipment = shipment
        self.lines = lines
        self._claimed_at = 0.0
        self._forgot_at = 0.0

    async def run(self) -> None:
        """Join the group, ship what this consumer left pending, then new entries and stale
        ones as they come; after any failure, wait and start over."""
        backoff = MIN_BACKOFF_S
        while True:
            try:
                await self.shipment.join()
                while await self._ship(await self.shipment.pending(BATCH)):
                    pass
                while True:
                    await self._turn()
                    stop_if_cancelled()
                    backoff = MIN_BACKOFF_S
            except asyncio.CancelledError:
                raise
            except ResponseError as exc:
                raise_if_cancelled(exc)
                if group_lost(exc):  # a Redis that restarted empty: join again at once
                    log.warning("audit sink: the consumer group was lost (%s); creating it again", exc)
                    await asyncio.sleep(MIN_BACKOFF_S)
                else:
                    backoff = await self._wait(exc, backoff)
            except (RedisError, OSError) as exc:
                raise_if_cancelled(exc)
                backoff = await self._wait(exc, backoff)

    async def close(self) -> None:
        """Close its Redis client (after ``run`` was cancelled)."""
        await self.shipment.redis.aclose()

    async def _turn(self) -> None:
        now = time.monotonic()
        if now - self._claimed_at >= CLAIM_EVERY_S:
            self._claimed_at = now
            await self._ship(await self.shipment.claim_stale(BATCH))
        if now - self._forgot_at >= FORGET_EVERY_S:
            self._forgot_at = now
            await self.shipment.forget_gone_consumers()
        await self._ship(await self.shipment.read(BATCH, BLOCK_MS))

    async def _ship(self, lot: Lot) -> bool:
        """Write ``lot``'s lines, then acknowledge it; whether there was anything."""
        if lot.entries:
            lines = b"".join(json_encoder.encode(entry) + b"\n" for entry in lot.entries)
            # In a thread: a slow disk or a blocked stdout must not stall the API's event loop.
            await asyncio.to_thread(self.lines.write, lines)
        await self.shipment.ack(lot.ids)
        return bool(lot.ids)

    @staticmethod
    async def _wait(exc: Exception, backoff: float) -> float:
        log.warning("audit sink: %s; trying again in %.1f s", exc, backoff)
        await asyncio.sleep(backoff)
        return min(backoff * 2, MAX_BACKOFF_S)
