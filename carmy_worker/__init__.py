"""Carmy's tool SDK and worker runtime.

Write tools with ``Toolbox``, serve them with ``python -m carmy_worker MODULE``.
"""

from carmy_worker.context import AgentContext, Context
from carmy_worker.errors import ToolError
from carmy_worker.toolbox import Tool, Toolbox, ToolDefinitionError

__all__ = ["AgentContext", "Context", "Tool", "ToolDefinitionError", "ToolError", "Toolbox"]
