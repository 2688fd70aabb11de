"""``/console/tools``: the catalog as the API serves it, with who serves each tool.

Everything comes from the catalog's current view (``api.calling.catalog``), which already holds
every worker's info and liveness: the page reads nothing from Redis. Its listing is built and
rendered once per view (the view is replaced, never changed, at most once a second), so a
catalog of 1,000 tools on 100 workers costs its JSON formatting and templating once, not on every
load; workers are shown by group (those that serve the same tools), so the page grows with tools
plus workers, not with their product.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response

from api.calling.catalog import Catalog, CatalogView
from api.console.render import fragment, render
from carmy_worker.wire import WorkerInfo

INLINE_WORKERS = 3  # named next to each tool; the rest are in the group's table
# Each effect in words (the protocol's values are terse; "none" alone reads as "unknown").
EFFECTS = {"none": "no side effect", "read": "reads only", "write": "writes", "external_write": "writes outside",
           "destructive": "destructive"}


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    host: str
    pid: int
    live: bool
    started: str


@dataclass(frozen=True)
class Group:
    """Workers that serve the same tools (they share a queue, named by the digest of their tools)."""

    name: str
    workers: tuple[WorkerRow, ...]
    tools: int

    @property
    def live(self) -> int:
        return sum(w.live for w in self.workers)

    @property
    def anchor(self) -> str:
        return "group-" + self.name[:12]


@dataclass(frozen=True)
class ToolRow:
    name: str
    title: str | None
    description: str
    effect: str
    idempotent: bool
    parallel_safe: bool
    confirmation: bool
    timeout: float
    input_schema: str
    output_schema: str
    groups: tuple[Group, ...]

    @property
    def live(self) -> int:
        return sum(g.live for g in self.groups)


@dataclass(frozen=True)
class ToolsModel:
    tools: tuple[ToolRow, ...]
    groups: tuple[Group, ...]

    @property
    def workers(self) -> int:
        return sum(len(g.workers) for g in self.groups)

    @property
    def live(self) -> int:
        return sum(g.live for g in self.groups)


def pretty(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False)


def started(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000)) if ms else "unknown"


def group_workers(workers: tuple[tuple[WorkerInfo, bool], ...]) -> dict[str, Group]:
    """Each group's workers, live ones first, a group's tools counted from its newest worker."""
    members: dict[str, list[tuple[WorkerInfo, bool]]] = {}
    for info, live in workers:
        members.setdefault(info.group, []).append((info, live))
    return {
        name: Group(name=name, tools=len(found[0][0].tools), workers=tuple(
            WorkerRow(info.worker_id, info.host, info.pid, live, started(info.started_ms))
            for info, live in sorted(found, key=lambda w: not w[1])))
        for name, found in sorted(members.items())
    }


def build_model(view: CatalogView) -> ToolsModel:
    groups = group_workers(view.workers)
    serving: dict[str, list[Group]] = {}
    newest: dict[str, WorkerInfo] = {}
    for info, _ in view.workers:  # one worker per group is enough: a group's workers serve the same tools
        newest.setdefault(info.group, info)
    for name, info in newest.items():
        for tool in info.tools:
            serving.setdefault(tool.spec.name, []).append(groups[name])
    tools = tuple(
        ToolRow(name=name, title=tool.title, description=tool.spec.description, effect=tool.spec.effect,
                idempotent=tool.spec.idempotent, parallel_safe=tool.spec.parallel_safe,
                confirmation=tool.spec.confirmation == "required", timeout=tool.timeout,
                input_schema=pretty(tool.spec.input_schema), output_schema=pretty(tool.spec.output_schema),
                groups=tuple(serving.get(name, ())))
        for name, tool in view.tools.items()
    )
    return ToolsModel(tools=tools, groups=tuple(groups.values()))


class ToolsPage:
    """The page, over the API's ``Catalog``."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._built: tuple[CatalogView, ToolsModel, Markup] | None = None

    def current(self) -> tuple[ToolsModel, Markup]:
        """The current view's model and its rendered listing."""
        view = self.catalog.view
        if self._built is None or self._built[0] is not view:
            model = build_model(view)
            self._built = (view, model, fragment("tools_listing.html", model=model, inline=INLINE_WORKERS,
                                                     effects=EFFECTS))
        return self._built[1], self._built[2]

    async def get(self, request: Request) -> Response:
        model, listing = self.current()
        return render(request, "tools.html", model=model, listing=listing)
