"""The one path every call takes to a worker, whichever door it came in by
(``POST /agent/execute``, with or without ``Prefer: respond-async``, or MCP's ``tools/call``):
``admit`` it (request id, tool, policy, arguments), then ``start`` it (expect its events,
submit, and send a retry to the execution it repeats).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from api.calling.catalog import Catalog, CatalogTool
from api.calling.checks import Rejected, check_arguments, check_policy, check_request_id, refusal
from api.calling.executions import Executions
from api.events.hub import EventHub
from api.events.mailbox import Mailbox
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import clip, error, store_full, store_unavailable
from carmy_worker.store import keys
from carmy_worker.wire import Record, canonical_json_encoder

# Told a new execution's id and mailbox as soon as its SUBMIT has left (``Calls.start``).
Announce = Callable[[str, Mailbox | None], Awaitable[None]]


@dataclass(frozen=True)
class Admitted:
    """A call that passed every check before Redis: its tool, and its arguments and request id
    as checked."""

    tool: CatalogTool
    arguments: dict[str, Any]
    request_id: str | None


@dataclass(frozen=True)
class Started:
    """An accepted call: the execution it is about, and how to follow it."""

    execution_id: str
    # That execution's events, subscribed before anything ran; None when not following.
    messages: Mailbox | None
    record: Record | None  # set when it had already finished (a replay)
    owner: bool  # this call started it; a retry that joined it did not (and never cancels it)
    state: str = "queued"  # queued, running or done, as of the start


class Calls:
    def __init__(self, *, catalog: Catalog, executions: Executions, hub: EventHub) -> None:
        self.catalog = catalog
        self.executions = executions
        self.hub = hub

    def admit(self, name: str, arguments: object, request_id: object, agent: AgentContext, *,
              id_field: str = "request_id") -> Admitted:
        """The call to run, or ``Rejected`` with the reason (nothing is recorded for it). The
        checks run in the order of ``api.calling.checks``: tool, policy, request id, arguments."""
        tool = self.catalog.view.get(name)
        if tool is None and not self.catalog.known:  # no Redis since the start: no tool is known to be missing
            raise Rejected(store_unavailable("The execution store cannot be reached: the catalog is not read yet."))
        if tool is None:
            raise Rejected(error("TOOL_NOT_FOUND", f"No tool named {clip(name)!r}.",
                                 suggested_action="list the tools (GET /agent/tools or tools/list)"))
        check_policy(tool, agent)
        valid_id = check_request_id(request_id, field=id_field)
        return Admitted(tool, check_arguments(tool, arguments), valid_id)

    @contextlib.asynccontextmanager
    async def start(self, tool: CatalogTool, arguments: dict[str, Any], request_id: str | None,
                    agent: AgentContext, *, follow: bool = True, stream: bool = True,
                    traceparent: str | None = None, via: str = "http",
                    announce: Announce | None = None) -> AsyncIterator[Started]:
        """Submit the call; with ``follow``, its events expected first so none is missed (every
        event if ``stream``, else only the final one: a caller that only wants the answer).

        A retry of the same request yields the execution it repeats: finished (with its record)
        or still going (followed instead of a new one). Refusals raise ``Rejected``.
        ``traceparent`` (tracing on): the caller's span, which the new execution's spans join.
        ``via``: the door it came in by (``http``, ``sse``, ``mcp``, ``webhook``), for the audit
        trail, where a retry answered with a finished execution's record has an entry too.
        ``announce`` (a followed call without a request id): called with the execution's id and
        mailbox once its SUBMIT has been written, before the reply is waited for, so that a
        stream can name its execution while Redis creates it (``docs/protocol.md``, section 5).
        A refusal after it concerns that id. (A call with a request id may turn out to be a
        retry of another execution: only SUBMIT's reply says which.)
        """
        # Where its request id's idempotency key lives, so that SUBMIT finds a replay in one slot: for
        # a principal with a quota, its home partition, where SUBMIT checks the quota (store/quota.py).
        homed = self.executions.settings.quotas.of(agent.principal).bounded
        exec_id = keys.new_execution_id(keys.request_partition(agent.principal, agent.session, request_id, homed=homed))
        if not follow or request_id is not None:
            announce = None
        with self._expect(exec_id, follow) as messages:
            pending = self.executions.submit(
                exec_id=exec_id, tool=tool, arguments=canonical_json_encoder.encode(arguments),
                request_id=request_id, agent=agent, reply=self.hub.channel_for(exec_id), stream=follow and stream,
                traceparent=traceparent, via=via, track=announce is not None)
            if announce is not None and await pending.written():
                await announce(exec_id, messages)
            sub = await pending
            if sub.kind == "store_full":
                raise Rejected(store_full())
            if sub.kind in ("conflict", "full", "limited", "no_workers"):
                raise Rejected(refusal(sub, tool.spec.name))
            if sub.kind == "new":
                yield Started(exec_id, messages, None, owner=True)
            elif sub.record is not None:
                await self.executions.replayed(sub.execution_id, sub.record, via=via)
                yield Started(sub.execution_id, None, sub.record, owner=False, state="done")
            else:
                with self._expect(sub.execution_id, follow) as joined:
                    # It may have finished between the submit and the join.
                    state, record = (await self.follow(sub.execution_id, tool.spec.name, stream=stream) if follow
                                     else await self.executions.progress(sub.execution_id, tool.spec.name))
                    yield Started(sub.execution_id, joined, record, owner=False, state=state)

    async def follow(self, exec_id: str, tool: str, *, stream: bool) -> tuple[str, Record | None]:
        """Have ``exec_id``'s events sent to this process too (expect them first): its state
        (queued, running or done) and its record once done."""
        joined = await self.executions.join(exec_id, tool, channel=self.hub.channel_for(exec_id), stream=stream)
        return joined.state, joined.record

    def _expect(self, exec_id: str, follow: bool) -> contextlib.AbstractContextManager[Mailbox | None]:
        return self.hub.expect(exec_id) if follow else contextlib.nullcontext(None)
