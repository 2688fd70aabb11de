"""Per-principal quotas, as SUBMIT enforces them: how many executions one principal may have
pending at once, and how fast it may start new ones (a token bucket).

The bucket is kept as one timestamp (the generic cell rate algorithm, which is a token bucket
read the other way round): the instant, in µs of Redis's clock, at which the bucket would be
full again. A call is admitted while that instant is at most ``burst - 1`` intervals ahead of
now, and pushes it one interval further. So a bucket costs one string key, which expires the
moment it is full again (a missing key is a full bucket).

**Exact over partitions.** A script sees one slot, so a principal's quota keys live in one
partition, its home (``keys.home_partition``: its ``owner`` hash modulo the count), and every
execution of a principal with a quota is drawn there (``keys.request_partition(homed=True)``),
request id or not: SUBMIT checks and charges the quota in that slot, and SETTLE and ``impose``
release it there. Principals without a quota spread over every partition.
"""

from __future__ import annotations

import math

from msgspec import Struct


class Quota(Struct, frozen=True, forbid_unknown_fields=True):
    """The limits of one principal; 0 means no limit."""

    pending: int = 0  # executions queued or running at once
    rate: float = 0.0  # new executions per second, on average
    burst: int = 0  # new executions at once after a quiet spell; 0: one second's worth (at least 1)

    @property
    def bounded(self) -> bool:
        """Whether SUBMIT checks anything (a pending or a rate limit): then every execution of
        its principal is in the principal's home partition (``keys.home_partition``)."""
        return self.pending > 0 or self.rate > 0

    def interval_us(self) -> int:
        """µs between two executions at ``rate`` (0: no rate limit)."""
        return max(1, round(1_000_000 / self.rate)) if self.rate > 0 else 0

    def tolerance_us(self) -> int:
        """How far ahead of now (µs) the bucket's full-again instant may be and still admit a call."""
        burst = self.burst or max(1, math.ceil(self.rate))
        return (burst - 1) * self.interval_us()


NO_QUOTA = Quota()

# The quota's part of SUBMIT: `quota_refusal` checks both limits and writes nothing; `quota_charge`
# takes the slot and the token once everything else admitted the call. The pending set has the
# global one's scores (admission deadlines) and loses a member exactly when the partition's (keys.pending) does:
# SETTLE and `impose` remove it (the execution's hash names the set in `quota`), and both are
# pruned of the deadlines past. Arguments: the pending set and bucket keys, the pending limit,
# the interval and tolerance (µs, interval 0: no rate), now in ms and µs.
QUOTA = """
local function quota_refusal(set, bucket, limit, interval, tolerance, now_ms, now_us)
  if limit > 0 then
    redis.call('ZREMRANGEBYSCORE', set, '-inf', now_ms)
    local held = redis.call('ZCARD', set)
    if held >= limit then return {'limited', 'pending', 1000, tostring(held)} end
  end
  if interval > 0 then
    local full_at = math.max(tonumber(redis.call('GET', bucket) or 0), now_us)
    local early = full_at - now_us - tolerance
    if early > 0 then return {'limited', 'rate', math.ceil(early / 1000), '0'} end
  end
  return nil
end

local function quota_charge(exe, exec_id, set, bucket, limit, interval, now_us, deadline, hold_ms)
  if limit > 0 then
    redis.call('ZADD', set, deadline, exec_id)
    if redis.call('PTTL', set) < hold_ms then redis.call('PEXPIRE', set, hold_ms) end
    redis.call('HSET', exe, 'quota', set)
  end
  if interval > 0 then
    local full_at = math.max(tonumber(redis.call('GET', bucket) or 0), now_us) + interval
    redis.call('SET', bucket, string.format('%.0f', full_at), 'PX', math.ceil((full_at - now_us) / 1000) + 1)
  end
end
"""
