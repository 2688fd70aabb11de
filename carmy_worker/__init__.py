"""Carmy's tool SDK, execution store and worker runtime.

Write tools with ``Toolbox``, serve them with ``python -m carmy_worker MODULE``. The package has
three layers (docs/architecture.md):

* ``carmy_worker.sdk``: what tool authors import (re-exported here);
* ``carmy_worker.store``: an execution's state machine in Redis, shared with the API;
* ``carmy_worker.runtime``: the worker process (the only code that imports arq).
"""

from carmy_worker.sdk.context import AgentContext, Context
from carmy_worker.sdk.errors import ToolError
from carmy_worker.sdk.toolbox import Tool, Toolbox, ToolDefinitionError
from carmy_worker.wire import RetryPolicy

__all__ = ["AgentContext", "Context", "RetryPolicy", "Tool", "ToolDefinitionError", "ToolError", "Toolbox"]
