"""Lists of jobs over partitions (store.jobstore): every listing is per partition (everyone's
jobs, the dead letters, and a principal's, which spread unless it has a quota), so a list
merges them, newest first, as one list would be.

A page ends with a ``Cursor``: the score and id of the last job it looked at. The next page
starts strictly after it in every partition at once (scores descending, then ids descending, as
``ZREVRANGEBYSCORE`` orders ties), so pages neither repeat a job nor skip one, whichever
partition each is in and however the other partitions grew in between.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from carmy_worker.store import keys
from carmy_worker.wire import is_digits

if TYPE_CHECKING:
    from carmy_worker.store.jobstore import JobState

SCAN_PAGES = 20  # pages of a listing one list looks through at most, for a status that is rare


@dataclass(frozen=True, order=True)
class Cursor:
    """Where a page of a list ended: the last job looked at, by its score in the listing (µs it
    was created; ms it was dead-lettered) and its id."""

    score: int
    job_id: str

    def text(self) -> str:
        """The cursor as a client sends it back (``parse``)."""
        return f"{self.score}:{self.job_id}"

    @classmethod
    def parse(cls, text: str) -> Cursor | None:
        """A cursor a client sent back; None if it is not one."""
        score, _, job_id = text.partition(":")
        if not is_digits(score) or len(score) > 20 or not keys.is_job_id(job_id):
            return None
        return cls(int(score), job_id)


@dataclass(frozen=True)
class Page:
    """Jobs newest first, and where the next page starts (None: the list is at its end)."""

    jobs: list[JobState]
    after: Cursor | None


Reader = Callable[[list[str]], Awaitable[list["JobState | None"]]]


async def listed(redis: Redis, read_many: Reader, listings: list[str], *, owner: str | None, status: str | None,
                 limit: int, after: Cursor | None = None) -> Page:
    """Up to ``limit`` jobs of ``listings`` (merged newest first) after ``after``: only ``owner``'s
    and ``status``'s if given. Looks at most ``SCAN_PAGES`` pages past the cursor, and forgets
    listed jobs whose hash expired."""
    page = max(limit, 50)
    merged = _Merged(redis, listings, after, page)
    found: list[JobState] = []
    looked, cursor = 0, after
    while len(found) < limit and looked < SCAN_PAGES * page:
        batch = await merged.take(page)
        if not batch:
            return Page(found, None)
        states = await read_many([job_id for _, job_id, _ in batch])
        gone = [(listing, job_id) for (_, job_id, listing), state in zip(batch, states, strict=True) if state is None]
        if gone:
            async with redis.pipeline(transaction=False) as pipe:
                for listing, job_id in gone:
                    pipe.zrem(listing, job_id)
                await pipe.execute()
        for (score, job_id, _), state in zip(batch, states, strict=True):
            looked += 1
            cursor = Cursor(score, job_id)
            if state is None or (status is not None and state.status != status):
                continue
            if owner is not None and state.owner != owner:
                continue
            found.append(state)
            if len(found) == limit:
                break
    return Page(found, cursor)


class _Merged:
    """(score, job id, listing) of every listing after a cursor, newest first over them all."""

    def __init__(self, redis: Redis, listings: list[str], after: Cursor | None, page: int) -> None:
        self._walks = [_Walk(redis, listing, after, page) for listing in listings]
        self._heads: list[tuple[int, str, int]] = []  # (-score, inverted id, walk): heapq pops the smallest
        self._started = False

    async def take(self, n: int) -> list[tuple[int, str, str]]:
        """The next ``n`` (fewer at the end)."""
        if not self._started:  # every listing's first page at once: one round trip, not one a partition
            self._started = True
            for i, entry in enumerate(await asyncio.gather(*(walk.next() for walk in self._walks))):
                self._push(i, entry)
        taken: list[tuple[int, str, str]] = []
        while self._heads and len(taken) < n:
            negative, inverted, i = heapq.heappop(self._heads)
            taken.append((-negative, _inverted(inverted), self._walks[i].listing))
            await self._advance(i)
        return taken

    async def _advance(self, i: int) -> None:
        self._push(i, await self._walks[i].next())

    def _push(self, i: int, entry: tuple[int, str] | None) -> None:
        if entry is not None:
            heapq.heappush(self._heads, (-entry[0], _inverted(entry[1]), i))


class _Walk:
    """One listing's (score, id) after a cursor, newest first, read a page at a time. A page is
    read from the cursor's score inclusive and what is not after it dropped; a page full of ties
    at one score is read again twice as long, so that a walk never stalls on them."""

    def __init__(self, redis: Redis, listing: str, after: Cursor | None, page: int) -> None:
        self.redis, self.listing, self.page = redis, listing, page
        self._at, self._size = after, page
        self._buffer: deque[tuple[int, str]] = deque()
        self._ended = False

    async def next(self) -> tuple[int, str] | None:
        while not self._buffer and not self._ended:
            await self._read()
        if not self._buffer:
            return None
        entry = self._buffer.popleft()
        self._at = Cursor(*entry)
        return entry

    async def _read(self) -> None:
        at = self._at
        rows = await self.redis.zrevrangebyscore(self.listing, "+inf" if at is None else at.score, "-inf",
                                                 start=0, num=self._size, withscores=True)
        entries = [(int(score), raw.decode()) for raw, score in rows]
        self._buffer.extend(e for e in entries if at is None or Cursor(*e) < at)
        self._ended = len(rows) < self._size
        self._size = self.page if self._buffer else self._size * 2


def _inverted(job_id: str) -> str:
    """An id whose order is the reverse of ``job_id``'s (ids are ASCII), for a min-heap."""
    return job_id.translate(_INVERT)


_INVERT = str.maketrans({chr(c): chr(127 - c) for c in range(128)})
