"""MCP over Streamable HTTP at ``/mcp``: the same catalog, executions, keys and guarantees as
carmy/1, in MCP's vocabulary.

* ``server``: the endpoint (``McpServer``), on the official SDK's low-level server;
* ``wire``: catalog entries as MCP tools, records as tool results, progress as notifications;
* ``cancel``: relating a ``notifications/cancelled`` to its call across requests and replicas;
* ``tasks``: the tasks extension (2026-07-28): a long call as a task to poll, on an
  asynchronous execution.
* ``system``: the API's own tools (``carmy_job``, ``carmy_dead_letters``), answered without a
  worker.
"""

from api.mcp.server import MCP_PATH, McpServer

__all__ = ["MCP_PATH", "McpServer"]
