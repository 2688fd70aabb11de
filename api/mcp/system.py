"""System tools: answered by the API itself, in MCP's catalog beside the workers' tools, as the
reference implementation does.

* ``carmy_job`` (every catalog): a job's view, as ``GET /agent/jobs/{job_id}`` shows it, for its
  creator (or an operator); anyone else's job is ``JOB_NOT_FOUND``, as an id that never existed.
* ``carmy_dead_letters`` (operators, when ``CARMY_MCP_OPERATOR_TOOLS`` is on): the newest
  dead-lettered jobs. To any other caller it does not exist: not listed, and a call of it is the
  unknown tool's protocol error.
* ``carmy_audit`` (operators, the same way): a page of the audit trail, as ``GET /agent/audit``
  answers it, with the same filters and cursor.

They are not executions: no worker, no queue, no execution id, never a task; they only read,
so a request id in ``_meta`` changes nothing. The ``carmy_`` prefix is theirs: a worker's tool
of such a name (the SDK refuses them; an older or foreign worker could still publish one) is
neither listed nor called over MCP (``McpServer``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import mcp_types as types
import msgspec
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from msgspec import Meta
from redis.exceptions import RedisError

from api.calling.audit import Audit, AuditQuery
from api.calling.catalog import CatalogTool, compile_validator
from api.calling.checks import Rejected, check_arguments
from api.calling.jobs import Jobs
from api.mcp.wire import answer_result, error_result, mcp_tool
from api.settings import ApiSettings
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import clip, store_unavailable
from carmy_worker.sdk.schema import schema_for
from carmy_worker.wire import AuditEntries, JobView, ToolSpec

log = logging.getLogger("carmy.api")

PREFIX = "carmy_"
MAX_DEAD_LETTERS = 100
DEFAULT_DEAD_LETTERS = 20


class JobArguments(msgspec.Struct, forbid_unknown_fields=True):
    """The job to read."""

    job_id: Annotated[str, Meta(description="The job's id (job_…), as POST /agent/jobs answered it.")]


class DeadLetterArguments(msgspec.Struct, forbid_unknown_fields=True):
    """How many dead letters to list, newest first."""

    limit: Annotated[int, Meta(ge=1, le=MAX_DEAD_LETTERS)] = DEFAULT_DEAD_LETTERS


class DeadLetters(msgspec.Struct):
    """Dead-lettered jobs, newest first: an operator retries one with POST /agent/jobs/{job_id}/retry."""

    jobs: list[JobView]


def reserved(name: str) -> bool:
    """Whether ``name`` is a system tool's (whether or not this caller may see it)."""
    return name.startswith(PREFIX)


@dataclass(frozen=True)
class SystemTool:
    entry: CatalogTool  # its spec and compiled input schema, as a worker's tool has them
    arguments: type[msgspec.Struct]
    answer: Callable[[Any, AgentContext], Awaitable[msgspec.Struct]]
    operator: bool = False  # listed and callable only for operators, when the setting allows

    @property
    def name(self) -> str:
        return self.entry.spec.name


class SystemTools:
    """The system tools of one ``McpServer``, on the API's ``Jobs`` and ``Audit`` services."""

    def __init__(self, *, settings: ApiSettings, jobs: Jobs, audit: Audit) -> None:
        self.jobs = jobs
        self.audit = audit
        self.operator_tools = settings.mcp_operator_tools
        tools = [
            SystemTool(_entry("carmy_job", "Read a job: its status, attempts, last error, and its result once it "
                              "has finished.", JobArguments, JobView), JobArguments, self._job),
            SystemTool(_entry("carmy_dead_letters", "List the dead-lettered jobs (operators only): jobs that ran "
                              "out of attempts, or whose outcome was uncertain, waiting for an operator.",
                              DeadLetterArguments, DeadLetters), DeadLetterArguments, self._dead_letters,
                       operator=True),
            SystemTool(_entry("carmy_audit", "Read the audit trail (operators only): one entry per finished "
                              "execution, newest first, filtered by tool, principal, status and time; never "
                              "arguments or results. Pass next_cursor back as cursor for older entries.",
                              AuditQuery, AuditEntries), AuditQuery, self._audit, operator=True),
        ]
        self._tools = {t.name: t for t in tools}
        self._listed = {t.name: mcp_tool(t.entry.spec) for t in tools}

    def operator_sees(self, agent: AgentContext) -> bool:
        """Whether ``agent`` is shown the operator's tools."""
        return self.operator_tools and self.jobs.is_operator(agent)

    def listed(self, *, operator: bool) -> list[types.Tool]:
        """The MCP definitions of the tools a caller sees (``operator``: ``operator_sees``)."""
        return [self._listed[t.name] for t in self._tools.values() if operator or not t.operator]

    async def call(self, name: str, arguments: dict[str, Any] | None, agent: AgentContext) -> types.CallToolResult:
        """Answer a ``tools/call`` of a reserved name: the unknown tool's -32602 if this caller
        does not see one of that name; refusals and an unreachable store as ``isError`` results."""
        tool = self._tools.get(name)
        if tool is None or (tool.operator and not self.operator_sees(agent)):
            raise MCPError(INVALID_PARAMS, f"Unknown tool: {clip(name)}")
        try:
            checked = check_arguments(tool.entry, {} if arguments is None else arguments)
            # Lax: the schema's integer admits 5.0, which msgspec's strict int would not.
            arguments_in = msgspec.convert(checked, tool.arguments, strict=False)
            return answer_result(await tool.answer(arguments_in, agent))
        except Rejected as rejected:
            return error_result(rejected.error)
        except (RedisError, OSError) as exc:
            log.warning("store unavailable: %s", exc)
            return error_result(store_unavailable())

    async def _job(self, arguments: JobArguments, agent: AgentContext) -> JobView:
        return (await self.jobs.get(arguments.job_id, agent)).view()

    async def _dead_letters(self, arguments: DeadLetterArguments, agent: AgentContext) -> DeadLetters:
        jobs = await self.jobs.list(agent, status="dead_lettered", limit=arguments.limit)
        return DeadLetters([job.view() for job in jobs])

    async def _audit(self, arguments: AuditQuery, agent: AgentContext) -> AuditEntries:
        return await self.audit.page(arguments, agent)


def _entry(name: str, description: str, arguments: type[msgspec.Struct], output: type[msgspec.Struct]) -> CatalogTool:
    """A system tool as a catalog entry: read-only and idempotent, which MCP's annotations say."""
    input_schema = schema_for(arguments)
    spec = ToolSpec(name=name, description=description, input_schema=input_schema, output_schema=schema_for(output),
                    effect="read", idempotent=True, parallel_safe=True, confirmation="none")
    return CatalogTool(spec=spec, timeout=0.0, validator=compile_validator(name, input_schema), groups=())
