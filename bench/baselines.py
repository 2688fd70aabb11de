"""The two baselines, each behind the same kind of endpoint as ours (``POST /agent/execute``
with ``{"tool": ..., "arguments": {...}}``, answering ``{"status": "completed", "data": ...}``):

* ``bare_app``: a bare Starlette endpoint that calls the tool in-process. No queue, no Redis:
  the upper bound for HTTP handling of a tool call in Python.
* ``arq_app`` + ``ArqWorkerSettings``: arq's textbook pattern with arq's defaults:
  ``enqueue_job`` then ``await job.result()`` (which polls every 0.5 s), a worker started with
  ``arq bench.baselines.ArqWorkerSettings`` (poll_delay 0.5 s, pickle, max_jobs 10, job logging).

Serve the apps with ``uvicorn bench.baselines:bare_app`` / ``uvicorn bench.baselines:arq_app``;
both read the Redis URL from ``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import msgspec
from arq import create_pool
from arq.connections import RedisSettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from bench.tools import tools
from carmy_worker import AgentContext, Context

REDIS_SETTINGS = RedisSettings.from_dsn(os.environ.get("BENCH_REDIS_URL", "redis://localhost:6379/0"))


class Envelope(msgspec.Struct):
    tool: str
    arguments: dict[str, Any] = {}


_decode_envelope = msgspec.json.Decoder(Envelope).decode
_NO_AGENT = AgentContext()


async def call_tool(name: str, arguments: dict[str, Any]) -> Any:
    """Run a tool of ``bench.tools`` in this process, as plain data (what a worker would return)."""
    tool = tools.get(name)
    if tool is None:
        raise LookupError(name)
    ctx = Context(execution_id="bench", tool=name, request_id=None, agent=_NO_AGENT, emit=lambda *_: None)
    if tool.input_decoder is None:
        output = await tool.fn(ctx)
    else:
        output = await tool.fn(ctx, msgspec.convert(arguments, tool.input_type))
    return msgspec.to_builtins(output)


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


# The bare endpoint ----------------------------------------------------------------------------

async def bare_execute(request: Request) -> Response:
    envelope = _decode_envelope(await request.body())
    return JSONResponse({"status": "completed", "data": await call_tool(envelope.tool, envelope.arguments)})


bare_app = Starlette(routes=[Route("/agent/execute", bare_execute, methods=["POST"]),
                             Route("/health", health)])


# arq's textbook pattern -----------------------------------------------------------------------

async def arq_run_tool(ctx: dict[str, Any], name: str, arguments: dict[str, Any]) -> Any:
    """The arq job: the same tool, run by an arq worker."""
    return await call_tool(name, arguments)


class ArqWorkerSettings:
    """``arq bench.baselines.ArqWorkerSettings``: everything but the function list is arq's default."""

    functions: ClassVar = [arq_run_tool]
    redis_settings = REDIS_SETTINGS


async def arq_execute(request: Request) -> Response:
    envelope = _decode_envelope(await request.body())
    job = await request.app.state.arq.enqueue_job("arq_run_tool", envelope.tool, envelope.arguments)
    return JSONResponse({"status": "completed", "data": await job.result(timeout=60)})


@contextlib.asynccontextmanager
async def arq_lifespan(app: Starlette) -> AsyncIterator[None]:
    app.state.arq = await create_pool(REDIS_SETTINGS)
    try:
        yield
    finally:
        await app.state.arq.aclose()


arq_app = Starlette(routes=[Route("/agent/execute", arq_execute, methods=["POST"]), Route("/health", health)],
                    lifespan=arq_lifespan)
