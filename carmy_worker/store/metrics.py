"""Execution metrics kept in Redis, so that every worker's figures reach the API's /metrics
without a second scrape target.

The Lua scripts that write records count them (``carmy:{c:N}:m:executions``, one field per
tool, status and code) and observe latencies into fixed histogram buckets (``…:m:run``,
``…:m:queue_wait``), inside the same script call: no extra round trip per execution. An
execution's counts are kept in its partition (``executions``, ``histogram``), declared in the
script's KEYS, so that every script stays in one slot; ``snapshot`` adds the partitions up.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from carmy_worker.store.keys import jobs_dead, partition_prefix, partitions, pending, queued
from carmy_worker.wire import Record


def executions(partition: int) -> str:
    """The records of ``partition``'s executions, counted by tool, status and code."""
    return partition_prefix(partition) + "m:executions"


def histogram(name: str, partition: int) -> str:
    """Histogram ``name`` (``run``, ``queue_wait``) of ``partition``'s executions."""
    return f"{partition_prefix(partition)}m:{name}"


def jobs(partition: int) -> str:
    """The jobs of ``partition`` (store.jobstore) counted by tool and status, one field each:
    the jobs that reached the status (queued counts creations and retries; ``skipped`` counts
    schedule occurrences missed past grace). Declared in the KEYS of the scripts that count."""
    return partition_prefix(partition) + "m:jobs"


def job_lateness(partition: int) -> str:
    """Histogram of how late ``partition``'s jobs' attempts started, after they were due."""
    return histogram("job_lateness", partition)

BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
SEP = "\x1f"  # between label values in a field name: it cannot occur in a tool name


def label(record: Record) -> str:
    """The field of ``executions`` that counts this record."""
    return SEP.join((record.tool, record.status, record.error_code or ""))


# observe(hash, tool, ms): one observation into the histogram `hash` (a declared key:
# non-cumulative buckets, 0-based; index len(BUCKETS_MS) is +Inf), plus its sum. No count: it is
# the sum of the buckets, which /metrics adds up anyway (one call less in every script that
# observes, on every execution). `ms` as a string where the script has one (an ARGV): it goes to
# HINCRBY as it is. The bucket's field suffix is a constant of the source, chosen by a chain of
# comparisons: no table of edges built on every run, and no number made a string (Redis 7.0
# formats each Lua number it is given with snprintf, and Lua each one it concatenates).
_BUCKET_OF = "\n".join(f"  if n <= {edge} then return '\\031{i}' end" for i, edge in enumerate(BUCKETS_MS))
LUA_OBSERVE = f"""
local function bucket_of(n)
{_BUCKET_OF}
  return '\\031{len(BUCKETS_MS)}'
end
local function observe(hash, tool, ms)
  redis.call('HINCRBY', hash, tool .. bucket_of(tonumber(ms)), '1')
  redis.call('HINCRBY', hash, tool .. '\\31sum', ms)
end
"""

# count(hash, field): one more record counted in `hash` (a declared key: ``executions``).
LUA_COUNT = """
local function count(hash, field) redis.call('HINCRBY', hash, field, '1') end
"""

# count_job(hash, tool, status, n): n more jobs of `tool` reached `status`, in `hash` (a declared
# key: ``jobs``, the job's partition's).
LUA_COUNT_JOB = """
local function count_job(hash, tool, status, n) redis.call('HINCRBY', hash, tool .. '\\31' .. status, n or 1) end
"""


async def snapshot(redis: Redis) -> dict[str, Any]:
    """What /metrics shows of every process at once, in one round trip: the counts of records
    (``executions``), the histograms (``run``, ``queue_wait``, ``job_lateness``: field -> count,
    as written), the executions ``queued`` and ``pending`` (admitted, not yet settled), the jobs
    counted by tool and status (``jobs``) and the ``dead_letters`` kept."""
    async with redis.pipeline(transaction=False) as pipe:
        read_counts(pipe)
        read_sizes(pipe)
        for partition in partitions():
            pipe.hgetall(job_lateness(partition))
            pipe.hgetall(jobs(partition))
            pipe.zcard(jobs_dead(partition))
        replies = await pipe.execute()
    executions, run, queue_wait = added_counts(replies)
    n = len(COUNTED) * len(partitions())
    waiting, admitted = added_sizes(replies[n:])
    of_jobs = replies[n + 2 * len(partitions()):]
    return {"executions": executions, "run": run, "queue_wait": queue_wait, "queued": waiting, "pending": admitted,
            "job_lateness": _added(of_jobs[0::3]), "jobs": _added(of_jobs[1::3]), "dead_letters": sum(of_jobs[2::3])}


def read_sizes(pipe: Any) -> None:
    """Asks ``pipe`` for every partition's queued and pending executions (``added_sizes``)."""
    for partition in partitions():
        pipe.zcard(queued(partition))
        pipe.zcard(pending(partition))


def added_sizes(replies: list[Any]) -> tuple[int, int]:
    """``read_sizes``' replies (the first of ``replies``) added up: (queued, pending)."""
    n = 2 * len(partitions())
    return sum(replies[0:n:2]), sum(replies[1:n:2])


COUNTED = ("executions", "run", "queue_wait")  # what read_counts asks each partition for, in order


def read_counts(pipe: Any) -> None:
    """Asks ``pipe`` for every partition's execution counts and histograms (``added_counts``)."""
    for partition in partitions():
        pipe.hgetall(executions(partition))
        pipe.hgetall(histogram("run", partition))
        pipe.hgetall(histogram("queue_wait", partition))


def added_counts(replies: list[Any]) -> list[dict[bytes, bytes]]:
    """``read_counts``' replies (the first of ``replies``), each kind added up over the
    partitions, field by field: the executions' counts, then the run and queue-wait histograms."""
    n = len(COUNTED) * len(partitions())
    return [_added(replies[kind:n:len(COUNTED)]) for kind in range(len(COUNTED))]


def _added(hashes: list[dict[bytes, bytes]]) -> dict[bytes, bytes]:
    if len(hashes) == 1:
        return hashes[0]
    total: dict[bytes, int] = {}
    for counts in hashes:
        for field, value in counts.items():
            total[field] = total.get(field, 0) + int(value)
    return {field: str(value).encode() for field, value in total.items()}
