"""The queue's layout in Redis: where a job of an execution lives and how it is encoded.

The API writes jobs itself, inside the script that admits them (``store.submit``), and the
workers' arq reads them, so this layout is exactly the one ``ArqRedis.enqueue_job`` writes.
It is spelled out here rather than imported so that the API never imports arq;
``carmy_worker.runtime.queue`` checks at import time that arq still agrees, and
``tests/carmy_worker/runtime/test_arq_surface.py`` pins it.
"""

from __future__ import annotations

import msgspec

from carmy_worker.store import keys

FUNCTION = "carmy_execute"  # the arq function every job calls
# arq's own names (arq.constants' prefixes): arq asks for them in run_job's first pipeline, which
# runtime/queue.py answers from the lease, so they never reach Redis.
ARQ_JOB_KEY_PREFIX = "arq:job:"
ARQ_IN_PROGRESS_KEY_PREFIX = "arq:in-progress:"
ARQ_RETRY_KEY_PREFIX = "arq:retry:"
# Where the store keeps them: under the execution's partition (its hash tag), so that the
# scripts that write a job and its execution touch one slot.


def job_key_prefix(partition: int) -> str:
    """What ``partition``'s arq jobs are named by: the prefix, then the execution id."""
    return keys.partition_prefix(partition) + ARQ_JOB_KEY_PREFIX


def in_progress_key_prefix(partition: int) -> str:
    """What ``partition``'s leases (arq's in-progress keys) are named by, before the job id."""
    return keys.partition_prefix(partition) + ARQ_IN_PROGRESS_KEY_PREFIX


_encoder = msgspec.msgpack.Encoder()


def queue_name(group: str, partition: int) -> str:
    """The queue (a sorted set of job ids) of a group of workers serving the same catalog, for
    the executions of ``partition``: a group has one queue per partition, and its workers serve
    them all (``runtime.queue``)."""
    return f"{keys.partition_prefix(partition)}queue:{group}"


WAKE_SUFFIX = ":wake"
# Tokens a wake list keeps at most: enough for every job of a burst to wake a worker, bounded
# when no worker pops them (none runs, or all are busy and take jobs as their slots free up).
WAKE_LIMIT = 1000


def wake_list(queue: str) -> str:
    """A list that gets one token per job made due (queued, or put back): each idle worker
    blocks on it (BLPOP), so one job wakes one worker. The execution hash names it (``wake``);
    a script that has only that derives the queue by dropping ``WAKE_SUFFIX`` (``DUE_AGAIN``)."""
    return queue + WAKE_SUFFIX


# Lua: one token on a wake list, the list kept to its newest WAKE_LIMIT tokens (trimmed only
# when over: RPUSH says how long the list is).
WAKE_ONE = f"""
local function wake_one(wake)
  if redis.call('RPUSH', wake, '1') > {WAKE_LIMIT} then redis.call('LTRIM', wake, -{WAKE_LIMIT}, -1) end
end
"""

# Lua: ends the lease `token` on `job` (arq's finish_job, for our leases): out of the worker's
# leases hash, and, only while arq's in-progress key still holds that token, the in-progress key
# dropped; `finished`: the job with it (its arq job, its retry count, its queue entry). A lease
# taken away (the janitor gave the job to another worker) ends as a no-op: false.
END_LEASE = """
local function end_lease(leases, in_progress, job_key, retry_key, queue, job, token, finished)
  if redis.call('GET', in_progress) ~= token then
    if redis.call('HGET', leases, job) == token then redis.call('HDEL', leases, job) end
    return false
  end
  -- The in-progress key holds this lease's token: so does the leases hash (LEASE sets both,
  -- and no later lease of the job can be taken while this one holds the key).
  redis.call('HDEL', leases, job)
  if finished then
    redis.call('DEL', in_progress, job_key, retry_key)
    redis.call('ZREM', queue, job)
  else
    redis.call('DEL', in_progress)
  end
  return true
end
"""

# Lua: the wake list holds one token per job `due` (due and unleased), up to WAKE_LIMIT. After a
# LEASE: tokens left for jobs already taken would wake workers for nothing, and a due job that
# never pushed one (put back after a Retry, its lease expired) gets one, so an idle worker comes.
# (None due, the common case of a worker woken for the one job it took: the list goes, unread.)
WAKE_FOR = f"""
local function wake_for(wake, due)
  due = math.min(due, {WAKE_LIMIT})
  if due == 0 then
    redis.call('DEL', wake)
    return
  end
  local have = redis.call('LLEN', wake)
  if have > due then
    redis.call('LTRIM', wake, -due, -1)
  end
  for _ = have + 1, due do redis.call('RPUSH', wake, '1') end
end
"""

# Lua: a job whose lease ended without finishing it is due again now (LEASE moved its score to
# the end of its lease), and one idle worker is woken. Only if the job is still queued.
# `wake` is the execution hash's field: the queue is its name without WAKE_SUFFIX.
DUE_AGAIN = WAKE_ONE + f"""
local function due_again(wake, job)
  local t = redis.call('TIME')
  local queue = string.sub(wake, 1, -{len(WAKE_SUFFIX) + 1})
  redis.call('ZADD', queue, 'XX', 'LT', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), job)
  if redis.call('ZSCORE', queue, job) then wake_one(wake) end
end
"""


def job_key(exec_id: str) -> str:
    return job_key_prefix(keys.partition_of(exec_id)) + exec_id


def staged_job_key(exec_id: str) -> str:
    """Where the API writes a large job before its SUBMIT, which renames it to ``job_key`` (or
    drops it, refused): ``store.submit``, ``store.staging``."""
    return f"{keys.partition_prefix(keys.partition_of(exec_id))}staged-job:{exec_id}"


def in_progress_key(exec_id: str) -> str:
    """A worker's lease on a job (arq's in-progress key)."""
    return in_progress_key_prefix(keys.partition_of(exec_id)) + exec_id


def retry_key(exec_id: str) -> str:
    return f"{keys.partition_prefix(keys.partition_of(exec_id))}{ARQ_RETRY_KEY_PREFIX}{exec_id}"


def encode_job(payload: bytes, enqueue_ms: int) -> bytes:
    """The job as ``ArqRedis.enqueue_job`` would store it (job id = execution id), in msgpack."""
    return _encoder.encode({"t": 1, "f": FUNCTION, "a": [payload], "k": {}, "et": enqueue_ms})
