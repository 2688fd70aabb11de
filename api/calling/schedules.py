"""The recurring jobs the workers declare (``CatalogView.schedules``), each with its state in
Redis (``Promotions.schedule_state``): the occurrence it waits for, its last job, and how many
occurrences it fired and skipped. A schedule no worker has taken up yet has no state: its
times are null and its counts 0."""

from __future__ import annotations

from redis.asyncio import Redis

from api.calling.catalog import Catalog
from carmy_worker.store.jobstore import rfc3339
from carmy_worker.store.promotion import Promotions
from carmy_worker.wire import ScheduleView


class Schedules:
    def __init__(self, redis: Redis, catalog: Catalog) -> None:
        self.catalog = catalog
        self.promotions = Promotions(redis)

    async def list(self) -> list[ScheduleView]:
        """Every schedule by name."""
        specs = list(self.catalog.view.schedules.values())
        states = await self.promotions.schedule_state([s.name for s in specs]) if specs else []
        return [
            ScheduleView(
                name=spec.name, cron=spec.cron, timezone=spec.timezone, tool=spec.tool, grace_s=spec.grace,
                next_run_at=_time(state.get("next")), last_job_id=state.get("last_job") or None,
                last_run_at=_time(state.get("last_at")), skipped=int(state.get("skipped") or 0),
                fired=int(state.get("fired") or 0),
            )
            for spec, state in zip(specs, states, strict=True)
        ]


def _time(ms: str | None) -> str | None:
    return rfc3339(int(ms)) if ms else None
