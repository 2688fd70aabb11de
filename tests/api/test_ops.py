"""``/ready`` and ``/metrics`` on Redis's memory, through the in-process app against a Redis of
the module's own: full (maxmemory below what it holds), and one whose ACL refuses INFO."""

from __future__ import annotations

import httpx
import redis

from tests.conftest import app_client
from tests.support import RedisServer, app_settings


def metric(text: str, name: str) -> float:
    [value] = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


async def test_a_full_redis_makes_the_api_not_ready_and_says_why(
        own_redis_server: RedisServer, own_redis: redis.Redis) -> None:
    async with app_client(app_settings(own_redis_server.url, redis_memory_headroom=0.5)) as client:
        ready = (await client.get("/ready")).json()
        assert ready["checks"]["redis"] == {"ok": True}
        assert ready["checks"]["memory"]["ok"] is True and ready["checks"]["memory"]["limit_bytes"] == 0
        used = ready["checks"]["memory"]["used_bytes"]
        own_redis.config_set("maxmemory", used + used // 2)  # two thirds of it taken, over the half
        answer = await client.get("/ready")
        assert answer.status_code == 503
        memory = answer.json()["checks"]["memory"]
        assert memory["ok"] is False and memory["error"]["code"] == "STORE_FULL"
        assert memory["admit_below_bytes"] == (used + used // 2) - (used + used // 2) // 2
        text = (await client.get("/metrics")).text
        assert metric(text, "carmy_redis_memory_full") == 1
        assert metric(text, "carmy_redis_memory_limit_bytes") == used + used // 2
        assert metric(text, "carmy_api_store_full_refusals_total") == 0  # no call was refused yet


async def test_a_redis_that_refuses_info_is_still_ready(own_redis_server: RedisServer, own_redis: redis.Redis) -> None:
    own_redis.acl_setuser("no-info", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
                          commands=["+@all", "-info"])
    try:
        url = f"redis://no-info:secret@127.0.0.1:{own_redis_server.port}/0"
        async with app_client(app_settings(url)) as client:
            answer: httpx.Response = await client.get("/ready")
            checks = answer.json()["checks"]
            assert checks["redis"] == {"ok": True}
            assert "memory" not in checks  # unknown, not failing: admission falls back on Redis's own limit
            assert checks["workers"]["ok"] is False  # none here
            assert "carmy_redis_memory_full" not in (await client.get("/metrics")).text
    finally:
        own_redis.acl_deluser("no-info")
