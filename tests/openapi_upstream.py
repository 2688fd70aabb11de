"""An HTTP API for the OpenAPI import's tests: a small Starlette app, served on 127.0.0.1 by
uvicorn in a thread, that serves its own OpenAPI 3.1 document at ``/openapi.json`` and records
every request it gets (method, path, query, headers, body): rate limits with ``Retry-After``,
fails with 500, answers slowly (noting when its caller went away), checks credentials and echoes
them where an API might."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.support import serving

TOKEN = "upstream-token-0123456789"  # what /whoami accepts as a bearer token

ITEM = {"type": "object", "required": ["id", "name"], "properties": {
    "id": {"type": "string", "readOnly": True}, "name": {"type": "string"},
    "price": {"type": ["number", "null"], "minimum": 0}, "tags": {"type": "array", "items": {"type": "string"}}}}
ERROR = {"type": "object", "properties": {"detail": {"type": "string"}}}


def _json(schema: dict[str, Any], description: str = "done") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ITEM_ID = {"name": "itemId", "in": "path", "required": True, "schema": {"type": "string"}}
DOCUMENT: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Items", "version": "1.0.0"},
    "paths": {
        "/items": {
            "get": {"operationId": "listItems", "summary": "List the items.",
                    "parameters": [{"name": "limit", "in": "query", "schema": {"type": "integer", "maximum": 50}},
                                   {"name": "tag", "in": "query", "schema": {"type": "array",
                                                                              "items": {"type": "string"}}}],
                    "responses": {"200": _json({"type": "array", "items": {"$ref": "#/components/schemas/Item"}})}},
            "post": {"operationId": "createItem", "summary": "Create an item.",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/Item"}}}},
                     "responses": {"201": _json({"$ref": "#/components/schemas/Item"}), "422": _json(ERROR)}},
        },
        "/items/{itemId}": {
            "parameters": [ITEM_ID],
            "get": {"operationId": "getItem", "summary": "One item.",
                    "responses": {"200": _json({"$ref": "#/components/schemas/Item"}), "404": _json(ERROR)}},
            "put": {"operationId": "replaceItem", "summary": "Replace an item.",
                    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Item"}}}},
                    "responses": {"200": _json({"$ref": "#/components/schemas/Item"})}},
            "delete": {"operationId": "deleteItem", "summary": "Delete an item.",
                       "responses": {"204": {"description": "deleted"}}},
        },
        "/items/{itemId}/photo": {
            "post": {"operationId": "uploadPhoto", "summary": "Upload a photo.",
                     "parameters": [ITEM_ID],
                     "requestBody": {"content": {"multipart/form-data": {"schema": {"type": "object"}}}},
                     "responses": {"204": {"description": "stored"}}},
        },
        "/limited": {"get": {"operationId": "rateLimited", "summary": "Always over its rate limit.",
                             "parameters": [{"name": "as", "in": "query", "schema": {"enum": ["seconds", "date"]}}],
                             "responses": {"200": _json({"type": "object"})}}},
        "/broken": {"post": {"operationId": "broken", "summary": "Always fails on its side.",
                             "responses": {"200": _json({"type": "object"})}}},
        "/slow": {"get": {"operationId": "slow", "summary": "Answers after a while.",
                          "parameters": [{"name": "seconds", "in": "query", "required": True,
                                          "schema": {"type": "number"}}],
                          "responses": {"200": _json({"type": "object"})}}},
        "/whoami": {"get": {"operationId": "whoami", "summary": "Who the caller is.",
                            "responses": {"200": _json({"type": "object"})}}},
        "/moved": {"get": {"operationId": "moved", "summary": "Moved elsewhere.",
                           "responses": {"200": _json({"type": "object"})}}},
        "/text": {"get": {"operationId": "text", "summary": "Plain text.",
                          "responses": {"200": {"description": "text", "content": {"text/plain": {}}}}}},
    },
    "components": {"schemas": {"Item": ITEM}},
}


@dataclass
class Seen:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: bytes


@dataclass
class Upstream:
    """The running app: its URL, and what it saw."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)  # /slow requests whose caller went away first
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: int = 0  # items ever created: an id is never given twice, even after a delete
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests(self, method: str, path: str) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if (s.method, s.path) == (method, path)]


def app(state: Upstream) -> Starlette:
    async def record(request: Request) -> bytes:
        body = await request.body()
        with state.lock:
            state.seen.append(Seen(request.method, request.url.path, list(request.query_params.multi_items()),
                                   {k.lower(): v for k, v in request.headers.items()}, body))
        return body

    async def document(request: Request) -> Response:
        return JSONResponse(DOCUMENT)

    async def items(request: Request) -> Response:
        body = await record(request)
        if request.method == "GET":
            tags = request.query_params.getlist("tag")
            found = [i for i in state.items.values() if not tags or set(tags) & set(i.get("tags", []))]
            return JSONResponse(found[: int(request.query_params.get("limit", 50))])
        item = json.loads(body)
        if (item.get("price") or 0) < 0:
            return JSONResponse({"detail": "price must not be negative"}, status_code=422)
        state.created += 1
        item["id"] = f"item-{state.created}"
        state.items[item["id"]] = item
        return JSONResponse(item, status_code=201)

    async def item(request: Request) -> Response:
        body = await record(request)
        item_id = request.path_params["itemId"]
        if request.method == "PUT":
            state.items[item_id] = {**json.loads(body), "id": item_id}
        if item_id not in state.items:
            return JSONResponse({"detail": f"no item {item_id}"}, status_code=404)
        if request.method == "DELETE":
            del state.items[item_id]
            return Response(status_code=204)
        return JSONResponse(state.items[item_id])

    async def limited(request: Request) -> Response:
        await record(request)
        wait = formatdate(time.time() + 120, usegmt=True) if request.query_params.get("as") == "date" else "7"
        return JSONResponse({"message": "slow down"}, status_code=429, headers={"retry-after": wait})

    async def broken(request: Request) -> Response:
        await record(request)
        return JSONResponse({"error": {"message": "the database is down"}}, status_code=500)

    async def slow(request: Request) -> Response:
        await record(request)
        deadline = time.monotonic() + float(request.query_params["seconds"])
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                with state.lock:
                    state.aborted.append(request.query_params["seconds"])
                return Response(status_code=499)
            await asyncio.sleep(0.02)
        return JSONResponse({"slept": request.query_params["seconds"]})

    async def whoami(request: Request) -> Response:
        await record(request)
        said = request.headers.get("authorization", "")
        if said != f"Bearer {TOKEN}":
            # As careless APIs do: the refused credential is quoted back.
            return JSONResponse({"message": f"bad credentials: {said!r}"}, status_code=401)
        return JSONResponse({"principal": "worker"})

    async def moved(request: Request) -> Response:
        await record(request)
        return RedirectResponse("http://169.254.169.254/latest/meta-data/", status_code=302)

    async def text(request: Request) -> Response:
        await record(request)
        return PlainTextResponse("just words")

    async def answer(request: Request) -> Response:
        """Any body, as JSON: ``?hex=`` its bytes, ``&status=`` the status (200), ``&retry_after=``
        a ``Retry-After`` header, ``&type=`` another ``Content-Type``."""
        await record(request)
        said = request.query_params.get("retry_after")
        return Response(bytes.fromhex(request.query_params["hex"]),
                        media_type=request.query_params.get("type", "application/json"),
                        status_code=int(request.query_params.get("status", "200")),
                        headers=None if said is None else {"retry-after": said})

    return Starlette(routes=[
        Route("/openapi.json", document), Route("/items", items, methods=["GET", "POST"]),
        Route("/items/{itemId}", item, methods=["GET", "PUT", "DELETE"]), Route("/limited", limited),
        Route("/broken", broken, methods=["POST"]), Route("/slow", slow), Route("/whoami", whoami),
        Route("/moved", moved), Route("/text", text), Route("/answer", answer),
    ])


@contextmanager
def upstream() -> Iterator[Upstream]:
    state = Upstream()
    with serving(app(state)) as url:
        state.url = url
        yield state
