"""The catalog as the API serves it: merged from what live workers published.

Workers publish a ``WorkerInfo`` each and heartbeat. This module keeps a ``CatalogView``
(documents serialized once per catalog version, compiled argument validators, and which
workers' queues serve each tool) and swaps it atomically when anything changes: on a
notification from a worker, and on a short timer that notices silent deaths.

A worker may serve ten thousand tools, and every worker of a group publishes the same ones: each
tool's entry is decoded once per process (``ToolEntries``, keyed by its bytes), not once per
worker, and a burst of decoding and building is made with the cyclic collector paused
(``uncollected``), since every object it makes is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from redis.asyncio import Redis

from api.calling.schemas import InputSchema
from carmy_worker.failures import Failures
from carmy_worker.store.pubsub import raise_if_cancelled, stop_if_cancelled
from carmy_worker.store.roster import Liveness, worker_infos
from carmy_worker.wire import (
    CatalogDocument,
    DiscoveryDocument,
    RetryPolicy,
    ScheduleSpec,
    ToolSpec,
    WorkerInfo,
    WorkerTool,
    json_encoder,
)

log = logging.getLogger("carmy.api")

CAPABILITIES = ["tools", "streaming", "idempotency", "async", "mcp", "jobs"]
MAX_ROOTS = 8  # discovery documents kept per catalog version for roots other than the server's


@dataclass(frozen=True)
class Document:
    """A JSON document serialized once, with its strong ETag."""

    body: bytes
    etag: str

    @classmethod
    def of(cls, value: Any) -> Document:
        body = json_encoder.encode(value)
        return cls(body=body, etag=f'"{hashlib.sha256(body).hexdigest()}"')


@dataclass(frozen=True)
class CatalogTool:
    spec: ToolSpec
    timeout: float
    # The arguments' validator, compiled once per schema; None if the published schema does not
    # compile (not one of ours), and then every call of the tool is refused.
    validator: InputSchema | None
    groups: tuple[str, ...]  # worker groups with a live worker serving it, newest first
    title: str | None = None  # MCP's display name (the decorator's title=)
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # how its jobs are tried again (the decorator's retry=)


@dataclass(frozen=True)
class CatalogView:
    tools: dict[str, CatalogTool]
    catalog: Document
    discovery: Document  # made once from ``discovery_fields``: at the server's root, every request's
    discovery_fields: DiscoveryDocument  # for the links under another root (``discovery_under``)
    live_workers: int = 0
    # The recurring jobs the workers declare, by name (the newest worker's definition; the one in
    # force, which its state names, may be another worker's: ``api.calling.schedules``).
    schedules: dict[str, ScheduleSpec] = field(default_factory=dict)
    # What the view was built from: every worker on the roster and whether it serves (alive and
    # not draining), newest first; the console's Tools page shows who serves what from it.
    workers: tuple[tuple[WorkerInfo, bool], ...] = ()
    # Discovery under other roots, once made, by root: a mounted app is reached under one or two.
    _under: dict[str, Document] = field(default_factory=dict, compare=False, repr=False)

    def discovery_under(self, root: str) -> Document:
        """Discovery with its links under ``root`` (``api.http.paths``): ``/carmy/agent/tools``
        for an app mounted at ``/carmy``; the one document made once at the server's root."""
        if not root:
            return self.discovery
        found = self._under.get(root)
        if found is None:
            d = self.discovery_fields
            found = Document.of(msgspec.structs.replace(
                d, tools_url=root + d.tools_url, execute_url=root + d.execute_url, mcp_url=root + d.mcp_url,
                jobs_url=None if d.jobs_url is None else root + d.jobs_url,
                webhooks=None if d.webhooks is None else [root + w for w in d.webhooks]))
            if len(self._under) < MAX_ROOTS:  # roots are the server's to set, but bound the memory anyway
                self._under[root] = found
        return found

    def get(self, name: str) -> CatalogTool | None:
        return self.tools.get(name)

    def unserved(self, webhook_tools: dict[str, str]) -> dict[str, str]:
        """The webhooks (name -> tool) whose tool no live worker serves: their deliveries would
        be refused (``TOOL_NOT_FOUND`` or ``NO_WORKERS``)."""
        return {name: tool for name, tool in webhook_tools.items()
                if (found := self.tools.get(tool)) is None or not found.groups}


class _Published(WorkerInfo, kw_only=True):
    """A ``WorkerInfo`` as read from Redis, its tools not decoded yet."""

    tools: list[msgspec.Raw]  # type: ignore[assignment]  # WorkerTool's bytes, for ToolEntries


_published_decoder = msgspec.msgpack.Decoder(_Published)
_tool_decoder = msgspec.msgpack.Decoder(WorkerTool)


class ToolEntries:
    """Workers' infos decoded with each tool's entry decoded once, keyed by its bytes: the
    workers of a group publish the same tools, and a worker that comes back or a new one of the
    group costs a lookup per tool, not its schemas' thousands of dicts again. It holds the
    entries of the infos last given to ``keep_only``, and their bytes (what they take in Redis)."""

    def __init__(self) -> None:
        self._known: dict[bytes, WorkerTool] = {}

    def info(self, raw: bytes) -> WorkerInfo:
        """A worker's info (``WorkerInfo`` as REGISTER wrote it), its tools shared with the
        other infos' that are the same."""
        published = _published_decoder.decode(raw)
        fields = {name: getattr(published, name) for name in WorkerInfo.__struct_fields__}
        fields["tools"] = [self._tool(bytes(tool)) for tool in published.tools]
        return WorkerInfo(**fields)

    def keep_only(self, infos: Iterable[WorkerInfo]) -> None:
        """Forget the entries none of ``infos`` has (their workers are gone)."""
        kept = {id(tool) for info in infos for tool in info.tools}
        if len(kept) < len(self._known):
            self._known = {raw: tool for raw, tool in self._known.items() if id(tool) in kept}

    def _tool(self, raw: bytes) -> WorkerTool:
        tool = self._known.get(raw)
        if tool is None:
            tool = self._known[raw] = _tool_decoder.decode(raw)
        return tool


@contextlib.contextmanager
def uncollected() -> Iterator[None]:
    """The cyclic garbage collector paused for a burst of allocation that is all kept (a
    catalog's entries, its view): collections in the middle of it can free none of it, and each
    older generation's walked the whole heap again, two thirds of a refresh at 10,000 tools. It
    runs again after, once over what was made. Only around code that does not await."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def build_view(server_name: str, workers: list[tuple[WorkerInfo, bool]],
               validators: dict[bytes, InputSchema | None], webhook_paths: tuple[str, ...] = ()) -> CatalogView:
    """Merge workers' catalogs: for a tool defined twice, the newest worker's definition wins.
    ``webhook_paths``: where the configured webhooks are received, listed by discovery."""
    specs: dict[str, WorkerTool] = {}
    groups: dict[str, list[str]] = {}
    schedules: dict[str, ScheduleSpec] = {}
    workers = sorted(workers, key=lambda w: w[0].started_ms, reverse=True)
    for info, live in workers:
        # Unlike its tools (NO_WORKERS for an hour, not TOOL_NOT_FOUND), a dead worker's schedules
        # are nobody's: no one fires them, and GET /agent/schedules lists the live workers' only.
        for schedule in info.schedules if live else ():
            schedules.setdefault(schedule.name, schedule)
        for tool in info.tools:
            specs.setdefault(tool.spec.name, tool)
            if live and info.group not in groups.setdefault(tool.spec.name, []):
                groups[tool.spec.name].append(info.group)
    names = sorted(specs)
    catalog = Document.of(CatalogDocument(tools=[specs[n].spec for n in names]))
    fields = DiscoveryDocument(
        protocol="carmy/1", server=server_name, tools_url="/agent/tools",
        capabilities=[*CAPABILITIES, "webhooks"] if webhook_paths else CAPABILITIES,
        tools_version=catalog.etag.strip('"'), execute_url="/agent/execute", mcp_url="/mcp", jobs_url="/agent/jobs",
        webhooks=list(webhook_paths) or None,
    )
    discovery = Document.of(fields)
    tools = {}
    for name in names:
        spec = specs[name].spec
        schema_key = json_encoder.encode(spec.input_schema)
        if schema_key not in validators:
            validators[schema_key] = compile_validator(name, spec.input_schema)
        tools[name] = CatalogTool(spec=spec, timeout=specs[name].timeout, validator=validators[schema_key],
                                  groups=tuple(groups.get(name, ())), title=specs[name].title,
                                  retry=specs[name].retry)
    return CatalogView(tools=tools, catalog=catalog, discovery=discovery, discovery_fields=fields,
                       live_workers=sum(1 for _, live in workers if live),
                       schedules=dict(sorted(schedules.items())), workers=tuple(workers))


def compile_validator(name: str, schema: dict[str, Any]) -> InputSchema | None:
    """A compiled (Rust) validator for a tool's input schema: its cost grows with the size of the
    arguments only, for valid and invalid ones alike (``api.calling.schemas``), so no argument can hold
    the event loop for long. Draft 2020-12 unless the schema names another; ``format`` is an
    annotation, as the draft says (the worker's msgspec types check formats)."""
    try:
        return InputSchema.compile(schema)
    except ValueError as exc:  # not a schema we generate: a foreign or broken worker
        log.error("input schema of %s does not compile; its calls are refused: %s", name, str(exc)[:500])
        return None


@dataclass
class Catalog:
    """Keeps ``view`` current. ``view`` is replaced, never mutated, so readers need no lock."""

    redis: Redis
    server_name: str
    dead_after: float
    refresh_interval: float
    # Webhooks (name -> tool), listed by discovery; one whose tool no worker serves is logged.
    webhook_tools: dict[str, str] = field(default_factory=dict)
    view: CatalogView = field(init=False)
    _infos: dict[str, WorkerInfo] = field(default_factory=dict)
    _entries: ToolEntries = field(default_factory=ToolEntries)
    _serving: dict[str, bool] | None = None  # what the current view was built from
    _validators: dict[bytes, InputSchema | None] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ok: bool = False
    _failures: Failures = field(default_factory=lambda: Failures("catalog refresh", log))
    _unserved: dict[str, str] | None = None  # as last logged; None: not known yet

    def __post_init__(self) -> None:
        self._webhook_paths = tuple(f"/agent/webhooks/{name}" for name in sorted(self.webhook_tools))
        self.view = build_view(self.server_name, [], self._validators, self._webhook_paths)
        self._liveness = Liveness(self.redis, dead_after=self.dead_after)

    @property
    def reachable(self) -> bool:
        """Whether the last refresh reached Redis."""
        return self._ok

    @property
    def known(self) -> bool:
        """Whether the view was ever built from Redis: until then, its emptiness says that Redis
        has not been read, not that no worker serves a tool."""
        return self._serving is not None

    def notify(self, _: bytes = b"") -> None:
        """A worker came or went: refresh now."""
        self._changed.set()

    async def run(self) -> None:
        while True:
            self._changed.clear()
            try:
                await self.refresh()
                stop_if_cancelled()
                self._ok = True
                self._failures.worked()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                raise_if_cancelled(exc)
                self._failures.failed(exc)
                self._ok = False
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for swallows a cancellation that
            # comes as the event is set, and the loop would go on past the app's shutdown.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.refresh_interval):
                    await self._changed.wait()

    async def refresh(self) -> None:
        roster = await self._liveness.roster(0)  # every worker beats in every partition: 0's will do
        scores = roster.last_seen
        missing = [w for w in scores if w not in self._infos]
        if missing:
            raws = await worker_infos(self.redis, missing)
            with uncollected():
                for worker_id, raw in raws.items():
                    self._infos[worker_id] = self._entries.info(raw)
        gone = [w for w in self._infos if w not in scores]
        for worker_id in gone:
            del self._infos[worker_id]
        if gone:
            self._entries.keep_only(self._infos.values())
        serving = {w: roster.serving(w) for w in self._infos}
        if serving == self._serving:
            return  # same workers, same liveness: the view is still right (the common case)
        with uncollected():
            view = build_view(self.server_name, [(self._infos[w], live) for w, live in serving.items()],
                              self._validators, self._webhook_paths)
        if view.catalog.etag != self.view.catalog.etag:
            log.info("catalog changed: %d tools, version %s", len(view.tools), view.catalog.etag)
        self.view = view
        self._serving = serving
        self._report_unserved()

    def _report_unserved(self) -> None:
        """Log the webhooks whose tool no live worker serves, whenever that list changes."""
        unserved = self.view.unserved(self.webhook_tools)
        if unserved == self._unserved:
            return
        if unserved:
            log.warning("webhooks whose tool no worker serves (their deliveries are refused): %s",
                        ", ".join(f"{name} -> {tool}" for name, tool in sorted(unserved.items())))
        elif self._unserved:
            log.info("every webhook's tool is served again")
        self._unserved = unserved
