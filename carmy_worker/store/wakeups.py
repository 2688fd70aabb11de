"""A worker's wait for work in every partition at once (``CARMY_REDIS_PARTITIONS`` > 1).

A group of workers has one queue per partition, each with its wake list, and a cluster refuses a
``BLPOP`` over keys of several slots: an idle worker waits on each partition's wake list, on a
connection each (``Leases.wait_and_take``: ``BLPOP`` then LEASE, as with one partition), so that
a job in any partition wakes it within milliseconds. As soon as one wait returns, the others are
ended early (``CLIENT UNBLOCK``: their LEASE runs at once, taking what is due there), so that a
round looks at every partition and ends together; the next round starts its claims one
partition further (round robin), so that a busy partition does not starve another.

**Never more than its free slots.** Only the worker's free slots, shared out over the
partitions starting with the one whose turn it is (``claim_shares``), are leased, and claimed in
Lua with the lease: the claims of a round never exceed them, whichever waits return. A partition
whose share is nought leases nothing; its LEASE still says how many jobs are due there (every
LEASE reply does: ``store.hints``), and sets its wake tokens right, so the worker's next look
takes them with one LEASE of that partition alone (``WakeableWorker._wait_for_work``) rather
than waiting on every partition again. A round used to lease up to the free slots in every
partition and hand back what it could not claim (FINISH, a wake token each): at load, with a
few jobs in each of 16 partitions, that was nearly three FINISHes per call, and each woke another
worker into a round of its own. ``kept_and_surplus`` still hands back anything beyond the free
slots (FINISH: due again at its old score, one idle worker woken), should a reply hold more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from carmy_worker.store import keys
from carmy_worker.store.leases import Lease, Leases, unblock

# How long a round waits for the waits it ended early once one returned: their LEASE runs as soon
# as the node reads the CLIENT UNBLOCK, so a node that has not answered by then is hung or cut
# off. Those waits are given up (their connections dropped, their partitions left out of the next
# rounds for a while: ``leases.reach``), so that a hung primary holds up neither the leases the
# round took elsewhere nor the next rounds; a LEASE such a node runs when it wakes is handed back
# by the heartbeat.
ENDED_WITHIN_S = 0.5


def claim_shares(free: int, count: int) -> list[int]:
    """How many of ``free`` slots each of ``count`` partitions may claim in one round, the first
    (the one whose turn it is) first: as even as can be, summing to ``free``."""
    return [free // count + (1 if i < free % count else 0) for i in range(count)]


def kept_and_surplus(taken: Sequence[Lease], free: int) -> tuple[list[Lease], list[Lease]]:
    """What a round keeps of ``taken`` (in the round's order): every claimed lease (there are no
    more than ``free``), then unclaimed ones while slots are left; and what it hands back."""
    kept = [lease for lease in taken if lease.claim is not None]
    surplus: list[Lease] = []
    for lease in taken:
        if lease.claim is None:
            (kept if len(kept) < free else surplus).append(lease)
    return kept, surplus


async def wait_on_every_partition(leases: Leases, redis: Redis, queues: Sequence[str], *, timeout: float,
                                  free: int, lease_ms: int, look_ahead: int) -> list[Lease]:
    """One round: wait up to ``timeout`` s on each of ``queues``' wake lists (the first is the
    one whose turn it is), and lease each one's share of ``free`` once one of them wakes; returns
    at most ``free`` leases.

    A wait that fails (on a cluster, its primary down until its replica is promoted) does not
    end the others: its partition is left out of the next rounds for a while (``leases.reach``)
    and the round goes on with the rest, so that one primary's failover holds up only its own
    partitions' calls. So does a wait whose node is hung: it fails on its own deadline
    (``leases.WAIT_GRACE_S``), or is given up ``ENDED_WITHIN_S`` after another returned. Only
    when every wait of the round failed is the first error raised."""
    reach = leases.reach
    tried = [q for q in queues if reach.reachable(keys.partition_of_key(q))] or list(queues)
    loop = asyncio.get_running_loop()
    clients: list[asyncio.Future[int]] = [loop.create_future() for _ in tried]
    waits = [asyncio.create_task(leases.wait_and_take(
        redis, queue, timeout=timeout, most=claims, lease_ms=lease_ms, look_ahead=look_ahead,
        blocked=client.set_result)) for queue, claims, client in zip(tried, claim_shares(free, len(tried)),
                                                                     clients, strict=True)]
    ends: list[asyncio.Task[None]] = []
    try:
        await _one_answered(waits)
        ending = [(asyncio.create_task(_end_early(redis, queue, client)), client)
                  for wait, queue, client in zip(waits, tried, clients, strict=True) if not wait.done()]
        ends = [end for end, _ in ending]
        # Every wait ends: woken, ended early (its LEASE ran), failed, or given up (a hung node).
        _, stragglers = await asyncio.wait(waits, timeout=ENDED_WITHIN_S)
        for wait in stragglers:
            wait.cancel()
        if stragglers:
            await asyncio.wait(stragglers)
        for end, client in ending:
            if not client.done():  # its wait failed before it blocked: nothing to end
                end.cancel()
        await asyncio.gather(*ends, return_exceptions=True)
    finally:  # cancelled: no wait or end is left behind
        for task in (*waits, *ends):
            task.cancel()
        await asyncio.gather(*waits, *ends, return_exceptions=True)
    taken: list[Lease] = []
    failures: list[BaseException] = []
    for wait, queue in zip(waits, tried, strict=True):
        partition = keys.partition_of_key(queue)
        failure: BaseException | None
        if wait.cancelled():  # given up: its node did not answer in time
            failure = RedisConnectionError(f"no answer within {ENDED_WITHIN_S:g} s of the round's end")
        else:
            failure = wait.exception()
        if failure is None:
            reach.answered(partition)
            taken += wait.result()
        elif isinstance(failure, RedisError | OSError):
            reach.failed(partition, failure)
            failures.append(failure)
        else:
            raise failure
    if len(failures) == len(waits):  # nothing answered: the caller handles it as one wait's error
        raise failures[0]
    kept, surplus = kept_and_surplus(taken, free)
    if surplus:
        await asyncio.gather(*(leases.finish(lease, finished=False, delay_ms=None) for lease in surplus))
    return kept


async def _one_answered(waits: Sequence[asyncio.Task[list[Lease]]]) -> None:
    """Until one of ``waits`` has returned, or every one has failed."""
    pending: set[asyncio.Task[list[Lease]]] = set(waits)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if any(task.exception() is None for task in done):
            return


async def _end_early(redis: Redis, queue: str, client: asyncio.Future[int]) -> None:
    """End the wait of ``client`` (once its id is known) on ``queue``'s wake list: its LEASE runs
    now. A wait that has returned meanwhile is not blocked: nothing happens to it."""
    await unblock(redis, queue, await client)
