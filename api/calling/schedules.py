"""The recurring jobs the workers declare (``CatalogView.schedules``), each with its state in
Redis (``Promotions.schedule_state``): the occurrence it waits for, its last job, and how many
occurrences it fired and skipped. A schedule no worker has taken up yet has no state: its
times are null and its counts 0. Only the schedules live workers declare are listed: the state
of one no worker declares any more is nobody's, and expires (store.promotion's SCHEDULE_KEEP).

Workers may define a schedule differently (a rolling deploy, two modules declaring one name):
each is listed with the definition it is fired by, the one its state names, which need not be
the newest worker's (that worker's deploy rolled back, and the others took it over)."""

from __future__ import annotations

from redis.asyncio import Redis

from api.calling.catalog import Catalog
from carmy_worker.store.jobstore import rfc3339
from carmy_worker.store.promotion import Promotions, schedule_digest
from carmy_worker.wire import ScheduleSpec, ScheduleView


class Schedules:
    def __init__(self, redis: Redis, catalog: Catalog) -> None:
        self.catalog = catalog
        self.promotions = Promotions(redis)

    async def list(self) -> list[ScheduleView]:
        """Every schedule by name."""
        newest = list(self.catalog.view.schedules.values())
        states = await self.promotions.schedule_state([s.name for s in newest]) if newest else []
        specs = [self._in_force(spec, state.get("spec")) for spec, state in zip(newest, states, strict=True)]
        return [
            ScheduleView(
                name=spec.name, cron=spec.cron, timezone=spec.timezone, tool=spec.tool, grace_s=spec.grace,
                next_run_at=_time(state.get("next")), last_job_id=state.get("last_job") or None,
                last_run_at=_time(state.get("last_at")), skipped=int(state.get("skipped") or 0),
                fired=int(state.get("fired") or 0),
            )
            for spec, state in zip(specs, states, strict=True)
        ]

    def _in_force(self, newest: ScheduleSpec, digest: str | None) -> ScheduleSpec:
        """The definition of ``newest``'s schedule that its state names (``digest``), among the
        workers the catalog lists; the newest worker's if none is that one (no state yet)."""
        if digest is None or schedule_digest(newest) == digest:
            return newest
        for info, _ in self.catalog.view.workers:
            for spec in info.schedules:
                if spec.name == newest.name and schedule_digest(spec) == digest:
                    return spec
        return newest


def _time(ms: str | None) -> str | None:
    return rfc3339(int(ms)) if ms else None
