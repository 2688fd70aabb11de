"""Execution metrics kept in Redis, so that every worker's figures reach the API's /metrics
without a second scrape target.

The Lua scripts that write records count them (``carmy:m:executions``, one field per tool,
status and code) and observe latencies into fixed histogram buckets (``carmy:m:run``,
``carmy:m:queue_wait``), inside the same script call: no extra round trip per execution.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from carmy_worker.store.keys import JOBS_DEAD, PENDING, QUEUED, partition_prefix
from carmy_worker.wire import Record

# In partition 0's slot, with the executions whose scripts count them (keys.py: one partition).
_P0 = partition_prefix(0)
EXECUTIONS = _P0 + "m:executions"
HISTOGRAMS = {"run": _P0 + "m:run", "queue_wait": _P0 + "m:queue_wait", "job_lateness": _P0 + "m:job_lateness"}
# Jobs (store.jobstore): one field per tool and status, counting the jobs that reached the status
# (queued counts creations and retries; `skipped` counts schedule occurrences missed past grace).
JOBS = _P0 + "m:jobs"
BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
SEP = "\x1f"  # between label values in a field name: it cannot occur in a tool name


def label(record: Record) -> str:
    """The field of ``EXECUTIONS`` that counts this record."""
    return SEP.join((record.tool, record.status, record.error_code or ""))


# observe(name, tool, ms): one observation into histogram `name` (non-cumulative buckets,
# 0-based; index len(BUCKETS_MS) is +Inf), plus its sum. No count: it is the sum of the buckets,
# which /metrics adds up anyway (one call less in every script that observes, on every execution).
LUA_OBSERVE = f"""
local BUCKETS = {{{", ".join(map(str, BUCKETS_MS))}}}
local HISTOGRAMS = {{run = '{HISTOGRAMS["run"]}', queue_wait = '{HISTOGRAMS["queue_wait"]}',
                    job_lateness = '{HISTOGRAMS["job_lateness"]}'}}
local function observe(name, tool, ms)
  local hash, b = HISTOGRAMS[name], #BUCKETS
  for i, edge in ipairs(BUCKETS) do
    if ms <= edge then b = i - 1 break end
  end
  redis.call('HINCRBY', hash, tool .. '\\31' .. b, 1)
  redis.call('HINCRBY', hash, tool .. '\\31sum', ms)
end
"""

LUA_COUNT = f"""
local function count(field) redis.call('HINCRBY', '{EXECUTIONS}', field, 1) end
"""

# count_job(tool, status, n): n more jobs of `tool` reached `status` (store.jobstore).
LUA_COUNT_JOB = f"""
local function count_job(tool, status, n) redis.call('HINCRBY', '{JOBS}', tool .. '\\31' .. status, n or 1) end
"""


async def snapshot(redis: Redis) -> dict[str, Any]:
    """What /metrics shows of every process at once, in one round trip: the counts of records
    (``executions``), the histograms (``run``, ``queue_wait``, ``job_lateness``: field -> count,
    as written), the executions ``queued`` and ``pending`` (admitted, not yet settled), the jobs
    counted by tool and status (``jobs``) and the ``dead_letters`` kept."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(EXECUTIONS)
        pipe.hgetall(HISTOGRAMS["run"])
        pipe.hgetall(HISTOGRAMS["queue_wait"])
        pipe.zcard(QUEUED)
        pipe.zcard(PENDING)
        pipe.hgetall(HISTOGRAMS["job_lateness"])
        pipe.hgetall(JOBS)
        pipe.zcard(JOBS_DEAD)
        executions, run, queue_wait, queued, pending, lateness, jobs, dead = await pipe.execute()
    return {"executions": executions, "run": run, "queue_wait": queue_wait, "queued": queued, "pending": pending,
            "job_lateness": lateness, "jobs": jobs, "dead_letters": dead}
