"""Imported tools calling a real upstream (``tests/openapi_upstream.py``, served on 127.0.0.1),
run as the worker runs them (``invoke``): the request it gets, and each of its failures as the
error an agent acts on; credentials sent and never passed on; cancellations and timeouts that
abort the upstream request."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest

from carmy_worker import AgentContext, Context, Tool, Toolbox
from carmy_worker.loop import Signal
from carmy_worker.openapi import Auth, api_key_query, basic, bearer
from carmy_worker.runtime.invoke import Outcome, invoke
from carmy_worker.wire import ErrorBody
from tests.openapi_upstream import TOKEN, Upstream, upstream
from tests.support import free_port, wait_until_async


@pytest.fixture(scope="module")
def api() -> Iterator[Upstream]:
    with upstream() as u:
        yield u


def tools(api: Upstream, auth: Auth | None = None, base: str | None = None, **options: Any) -> dict[str, Tool]:
    box = Toolbox()
    box.openapi(api.url + "/openapi.json", base_url=base or api.url, auth=auth, **options)
    return {t.name: t for t in box}


@pytest.fixture(scope="module")
def served(api: Upstream) -> dict[str, Tool]:
    return tools(api)


class Run:
    """One call of a tool as the worker makes it."""

    def __init__(self, tool: Tool, arguments: dict[str, Any], *, request_id: str | None = None,
                 principal: str | None = None) -> None:
        self.tool, self.arguments = tool, arguments
        self.ctx = Context(execution_id="exec_7", tool=tool.name, request_id=request_id,
                           agent=AgentContext(principal=principal), emit=lambda *_: None)
        self.cancelled = Signal()

    async def outcome(self, timeout: float = 10) -> Outcome:
        with ThreadPoolExecutor(1) as executor:
            return await invoke(self.tool, self.ctx, msgspec.json.encode(self.arguments), timeout=timeout,
                                executor=executor, cancelled=self.cancelled, max_result_bytes=1 << 20)


async def data(tool: Tool, arguments: dict[str, Any], **kw: Any) -> Any:
    outcome = await Run(tool, arguments, **kw).outcome()
    assert outcome.error is None and outcome.data is not None, outcome
    return json.loads(outcome.data)


async def failure(tool: Tool, arguments: dict[str, Any], **kw: Any) -> ErrorBody:
    outcome = await Run(tool, arguments, **kw).outcome()
    assert outcome.error is not None, outcome
    return outcome.error


async def test_a_post_sends_its_body_and_the_request_id_as_idempotency_key(api: Upstream,
                                                                         served: dict[str, Tool]) -> None:
    created = await data(served["createItem"], {"body": {"name": "lamp", "price": 12.5}}, request_id="order-1")
    assert created == {"name": "lamp", "price": 12.5, "id": created["id"]}
    [seen] = api.requests("POST", "/items")
    assert json.loads(seen.body) == {"name": "lamp", "price": 12.5}
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["idempotency-key"] == "order-1"
    assert seen.headers["user-agent"] == "carmy-openapi" and "authorization" not in seen.headers


async def test_the_idempotency_key_of_a_principal_or_without_a_request_id(api: Upstream,
                                                                        served: dict[str, Tool]) -> None:
    await data(served["createItem"], {"body": {"name": "a"}}, request_id="order-1", principal="alice")
    await data(served["createItem"], {"body": {"name": "b"}})
    alice, anonymous = api.requests("POST", "/items")[-2:]
    digest = hashlib.sha256(json.dumps(["alice", None, "order-1"]).encode()).hexdigest()[:40]
    assert alice.headers["idempotency-key"] == f"carmy-{digest}"  # not bob's "order-1" upstream
    assert anonymous.headers["idempotency-key"] == "exec_7"


async def test_query_and_path_parameters(api: Upstream, served: dict[str, Tool]) -> None:
    created = await data(served["createItem"], {"body": {"name": "mug", "tags": ["kitchen", "blue"]}})
    assert await data(served["listItems"], {"tag": ["blue", "red"], "limit": 5}) == [created]
    assert api.requests("GET", "/items")[-1].query == [("limit", "5"), ("tag", "blue"), ("tag", "red")]
    assert await data(served["getItem"], {"itemId": created["id"]}) == created
    assert await data(served["deleteItem"], {"itemId": created["id"]}) is None
    assert await data(served["text"], {}) == "just words"


async def test_a_path_parameter_cannot_reach_another_route(api: Upstream, served: dict[str, Tool]) -> None:
    before = len(api.seen)
    # Sent as /items/..%2Flimited: one segment, which no route of the upstream takes.
    missing = await failure(served["getItem"], {"itemId": "../limited"})
    assert missing.code == "UPSTREAM_NOT_FOUND"
    refused = await failure(served["getItem"], {"itemId": ".."})
    assert (refused.code, refused.category) == ("INVALID_ARGUMENTS", "validation")
    assert len(api.seen) == before  # /limited never called, and ".." never sent


async def test_429_tells_when_to_retry(served: dict[str, Tool]) -> None:
    limited = await failure(served["rateLimited"], {})
    assert (limited.code, limited.category, limited.retryable, limited.retry_after) == (
        "UPSTREAM_RATE_LIMITED", "capacity", True, 7)
    assert limited.message == "The upstream API answered 429 Too Many Requests: slow down"
    assert limited.details == {"status": 429, "body": {"message": "slow down"}}
    dated = await failure(served["rateLimited"], {"as": "date"})
    assert dated.retry_after is not None and 110 <= dated.retry_after <= 121


async def test_5xx_is_retryable_and_passes_the_upstreams_message(served: dict[str, Tool]) -> None:
    broken = await failure(served["broken"], {})
    assert (broken.code, broken.retryable, broken.recoverable) == ("UPSTREAM_UNAVAILABLE", True, True)
    assert broken.message.startswith("The upstream API answered 500 Internal Server Error: the database is down")
    assert "may have committed" in broken.message  # a POST: it may have acted before failing


async def test_client_errors(served: dict[str, Tool]) -> None:
    rejected = await failure(served["createItem"], {"body": {"name": "x", "price": -1}})
    assert (rejected.code, rejected.category, rejected.recoverable) == ("UPSTREAM_REJECTED", "validation", True)
    assert rejected.message == "The upstream API answered 422 Unprocessable Entity: price must not be negative"
    missing = await failure(served["getItem"], {"itemId": "nope"})
    assert (missing.code, missing.category, missing.details) == (
        "UPSTREAM_NOT_FOUND", "not_found", {"status": 404, "body": {"detail": "no item nope"}})


async def test_a_redirect_is_not_followed(api: Upstream, served: dict[str, Tool]) -> None:
    moved = await failure(served["moved"], {})
    assert (moved.code, moved.category, moved.details["status"]) == ("UPSTREAM_ERROR", "internal", 302)
    assert api.seen[-1].path == "/moved"


async def test_credentials_are_sent_and_never_passed_on(api: Upstream) -> None:
    right = tools(api, auth=bearer("TOKEN", environ={"TOKEN": TOKEN}))
    assert await data(right["whoami"], {}) == {"principal": "worker"}
    wrong = tools(api, auth=bearer("TOKEN", environ={"TOKEN": "wrong-secret-token"}))
    refused = await failure(wrong["whoami"], {})
    assert (refused.code, refused.category, refused.recoverable) == ("UPSTREAM_FORBIDDEN", "permission", False)
    assert "wrong-secret-token" not in json.dumps(msgspec.to_builtins(refused))
    assert refused.message == "The upstream API answered 401 Unauthorized: bad credentials: '[secret]'"
    keyed = tools(api, auth=api_key_query("api_key", environ={"CARMY_OPENAPI_API_KEY": "k-123"}))
    await data(keyed["text"], {})
    assert ("api_key", "k-123") in api.seen[-1].query
    basic_auth = tools(api, auth=basic(environ={"CARMY_OPENAPI_USERNAME": "u", "CARMY_OPENAPI_PASSWORD": "p w"}))
    await data(basic_auth["text"], {})
    assert api.seen[-1].headers["authorization"] == "Basic " + base64.b64encode(b"u:p w").decode()


async def test_strict_output_checks_the_answer_against_the_response_schema(api: Upstream,
                                                                           served: dict[str, Tool]) -> None:
    await data(served["replaceItem"], {"itemId": "odd", "body": {"name": "odd", "price": "free"}})
    assert (await data(served["getItem"], {"itemId": "odd"}))["price"] == "free"  # passed through
    strict = tools(api, strict_output=True)
    invalid = await failure(strict["getItem"], {"itemId": "odd"})
    assert invalid.code == "INVALID_OUTPUT"


async def test_no_connection_is_unavailable(api: Upstream) -> None:
    nowhere = tools(api, base=f"http://127.0.0.1:{free_port()}")
    down = await failure(nowhere["getItem"], {"itemId": "x"})
    assert (down.code, down.retryable) == ("UPSTREAM_UNAVAILABLE", True)
    assert down.message.startswith("The upstream API cannot be reached")


async def test_a_timeout_aborts_the_upstream_request(api: Upstream, served: dict[str, Tool]) -> None:
    outcome = await Run(served["slow"], {"seconds": 5}).outcome(timeout=0.3)
    assert outcome.timed_out
    await wait_until_async(lambda: "5" in api.aborted, timeout=5, what="the upstream saw its caller leave")


async def test_a_cancellation_aborts_the_upstream_request(api: Upstream, served: dict[str, Tool]) -> None:
    run = Run(served["slow"], {"seconds": 6})
    before = len(api.requests("GET", "/slow"))

    async def cancel_once_sent() -> None:
        await wait_until_async(lambda: len(api.requests("GET", "/slow")) > before, timeout=5)
        run.cancelled.set()

    canceller = asyncio.ensure_future(cancel_once_sent())
    outcome = await run.outcome()
    await canceller
    assert outcome.cancelled
    await wait_until_async(lambda: "6" in api.aborted, timeout=5, what="the upstream saw its caller leave")


def one_tool(api: Upstream, tmp_path: Path, route: str, parameters: list[dict[str, Any]]) -> Tool:
    """The tool of a document of one GET operation at ``route``, served by ``api``."""
    (tmp_path / "api.json").write_text(json.dumps({
        "openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {route: {"get": {
            "operationId": "one", "parameters": parameters,
            "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {}}}}}}}}}))
    box = Toolbox()
    box.openapi(str(tmp_path / "api.json"), base_url=api.url)
    return next(iter(box))


@pytest.mark.parametrize("value", ["café", "a\x01b", "tab\tand\x7fdel", "line\u2028sep"])
async def test_a_header_no_request_can_carry_is_the_callers_mistake(api: Upstream, tmp_path: Path,
                                                                     value: str) -> None:
    """Not ASCII, or a control character: httpx cannot encode the one, h11 refuses to send the
    other. Either is the caller's to fix (INVALID_ARGUMENTS), not a broken upstream to retry."""
    tagged = one_tool(api, tmp_path, "/items", [{"name": "X-Tag", "in": "header", "schema": {"type": "string"}}])
    before = len(api.seen)
    refused = await failure(tagged, {"X-Tag": value})
    assert (refused.code, refused.category, refused.retryable) == ("INVALID_ARGUMENTS", "validation", False)
    assert len(api.seen) == before
    assert await data(tagged, {"X-Tag": "plain, with\ttab"}) == await data(tagged, {})  # sent, and answered
    assert api.seen[-2].headers["x-tag"] == "plain, with\ttab"


@pytest.mark.parametrize(("body", "why"), [
    (b'{"a": NaN}', "malformed"), (b"[Infinity]", "malformed"), (b"1e400", "out of range"),
    (b'"\\ud800"', "truncated"), (b"[" * 10_000 + b"]" * 10_000, "nested too deeply"),
    (b'"caf\xe9"', "UTF-8"),
])
async def test_an_answer_that_says_json_and_is_not_is_the_upstreams_error(api: Upstream, tmp_path: Path,
                                                                         body: bytes, why: str) -> None:
    """Python's json would take NaN, Infinity, 1e400 (as inf) and a lone surrogate: the caller
    would get null for the first three, and the tool would fail as its own fault for the last;
    and a deep nesting raised RecursionError, a TOOL_PANIC."""
    answer = one_tool(api, tmp_path, "/answer", [{"name": "hex", "in": "query", "schema": {"type": "string"}},
                                                 {"name": "status", "in": "query", "schema": {"type": "string"}}])
    error = await failure(answer, {"hex": body.hex()})
    assert (error.code, error.retryable) == ("UPSTREAM_ERROR", False)
    assert error.message.startswith("The upstream API's answer says it is JSON and is not (") and why in error.message
    refused = await failure(answer, {"hex": body.hex(), "status": "422"})  # an error's body: read as well as it can be
    assert refused.code == "UPSTREAM_REJECTED"


async def test_an_answer_with_a_byte_order_mark_is_read(api: Upstream, tmp_path: Path) -> None:
    answer = one_tool(api, tmp_path, "/answer", [{"name": "hex", "in": "query", "schema": {"type": "string"}}])
    assert await data(answer, {"hex": (b"\xef\xbb\xbf" + b'{"a": [1, 2.5, "x"]}').hex()}) == {"a": [1, 2.5, "x"]}


async def test_a_query_no_url_can_carry_is_the_callers_mistake(api: Upstream, tmp_path: Path) -> None:
    """httpx refuses a URL part over 65,536 characters: the caller's to fix, not a TOOL_PANIC."""
    answer = one_tool(api, tmp_path, "/answer", [{"name": "hex", "in": "query", "schema": {"type": "string"}}])
    before = len(api.seen)
    refused = await failure(answer, {"hex": "00" * 40_000})
    assert (refused.code, refused.category, refused.retryable) == ("INVALID_ARGUMENTS", "validation", False)
    assert len(api.seen) == before


async def test_headers_http_or_the_worker_sets_are_not_the_callers(api: Upstream, tmp_path: Path) -> None:
    """A document may declare them (by mistake, or to steer the request): a caller that could set
    Host would pick another site of the upstream's server, and one that could set Content-Length or
    Transfer-Encoding would frame the request for whatever stands in front of it."""
    taken = ["Host", "Content-Length", "Transfer-Encoding", "Connection", "TE", "Upgrade", "Expect", "Accept",
             "Content-Type", "Authorization", "Idempotency-Key", "Proxy-Authorization"]
    tool = one_tool(api, tmp_path, "/answer", [{"name": "hex", "in": "query", "schema": {"type": "string"}}] + [
        {"name": name, "in": "header", "schema": {"type": "string"}} for name in [*taken, "X-Tag"]])
    assert set(tool.spec.input_schema["properties"]) == {"hex", "X-Tag"}
    assert await data(tool, {"hex": b"[1]".hex(), "X-Tag": "t"}) == [1]
    seen = api.requests("GET", "/answer")[-1]
    assert seen.headers["host"] == api.url.removeprefix("http://") and seen.headers["x-tag"] == "t"


@pytest.mark.parametrize(("said", "heard"), [("²", None), ("99999999999999999999999", 30 * 86_400), ("12", 12)])
async def test_a_retry_after_that_is_no_number_or_past_reason(api: Upstream, tmp_path: Path, said: str,
                                                              heard: int | None) -> None:
    """"²" is a digit to str.isdigit and no number to int (a TOOL_PANIC); 10^22 s is cut to 30 days."""
    answer = one_tool(api, tmp_path, "/answer", [
        {"name": name, "in": "query", "schema": {"type": "string"}} for name in ("hex", "status", "retry_after")])
    limited = await failure(answer, {"hex": b"{}".hex(), "status": "429", "retry_after": said})
    assert (limited.code, limited.retry_after) == ("UPSTREAM_RATE_LIMITED", heard)


@pytest.mark.parametrize("charset", ["rot13", "base64", "hex"])
@pytest.mark.parametrize("status", ["200", "500"])
async def test_a_charset_that_is_no_text_encoding_is_read_as_utf8(api: Upstream, tmp_path: Path, charset: str,
                                                                  status: str) -> None:
    """Python knows these codecs, so httpx takes them for the answer's encoding, and decoding
    bytes with them raises LookupError: the call was a TOOL_PANIC, the worker's fault, whatever
    the upstream said."""
    answer = one_tool(api, tmp_path, "/answer", [
        {"name": name, "in": "query", "schema": {"type": "string"}} for name in ("hex", "status", "type")])
    said = {"hex": b"caf\xc3\xa9".hex(), "status": status, "type": f"text/plain; charset={charset}"}
    if status == "200":
        assert await data(answer, said) == "caf\u00e9"
    else:
        failed = await failure(answer, said)
        assert (failed.code, failed.message) == ("UPSTREAM_UNAVAILABLE", "The upstream API answered 500 Internal "
                                                 "Server Error: caf\u00e9")


@pytest.mark.parametrize("name", ["X-Caf\u00e9", "X Tag", "X-Tag:", "X-(Tag)", ""])
async def test_a_header_parameter_no_header_can_be_named_is_not_served(api: Upstream, tmp_path: Path,
                                                                       name: str) -> None:
    """A document's header parameter whose name is no HTTP field name (RFC 9110's token): httpx
    cannot encode one outside ASCII (every call a TOOL_PANIC), and h11 refuses to send the others
    (every call UPSTREAM_UNAVAILABLE, retryable, for a request that was never sent). The
    operation is skipped at start, as any other it cannot serve."""
    (tmp_path / "api.json").write_text(json.dumps({
        "openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {"/answer": {"get": {
            "operationId": "one", "parameters": [{"name": name, "in": "header", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {}}}}}}}}}))
    assert list(Toolbox().openapi(str(tmp_path / "api.json"), base_url=api.url)) == []


@pytest.mark.parametrize("key", ["k-123", 'k"1\\2'])
async def test_credentials_an_answer_echoes_are_not_passed_on(api: Upstream, tmp_path: Path, key: str) -> None:
    """A paginated API often repeats the request's URL in its answer, API key and all (a ``next``
    link): the worker's key reached every caller of the tool, though an error body, or a text
    answer, that echoed it was blanked out."""
    (tmp_path / "api.json").write_text(json.dumps({
        "openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {"/answer": {"get": {
            "operationId": "one", "parameters": [{"name": "hex", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": {}}}}}}}}}))
    box = Toolbox()
    box.openapi(str(tmp_path / "api.json"), base_url=api.url,
                auth=api_key_query("api_key", environ={"CARMY_OPENAPI_API_KEY": key}))
    echo = {"items": [1], "next": f"{api.url}/answer?page=2&api_key={key}", "key": {key: key}}
    got = await data(next(iter(box)), {"hex": json.dumps(echo).encode().hex()})
    assert key not in json.dumps(got) and json.dumps(key)[1:-1] not in json.dumps(got)
    assert got == {"items": [1], "next": f"{api.url}/answer?page=2&api_key=[secret]", "key": {"[secret]": "[secret]"}}


BROKEN = {
    "cut short": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"a\":",
    "not chunked": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\n",
    "not gzip": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                b"content-length: 7\r\n\r\n{\"a\":1}",
}


@pytest.fixture
def broken_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A server that answers every request with ``BROKEN[request.param]``, then hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                with connection:
                    connection.recv(65536)
                    connection.sendall(BROKEN[request.param])

    threading.Thread(target=answer, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


@pytest.mark.parametrize(("broken_server", "code"), [("cut short", "UPSTREAM_UNAVAILABLE"),
                                                     ("not chunked", "UPSTREAM_UNAVAILABLE"),
                                                     ("not gzip", "UPSTREAM_ERROR")], indirect=["broken_server"])
async def test_an_answer_that_breaks_off_or_cannot_be_decoded_is_the_upstreams_error(
        broken_server: str, tmp_path: Path, code: str) -> None:
    """Only sending the request was guarded: httpx's errors while reading the body (its framing,
    its Content-Encoding) were a TOOL_PANIC, the worker's fault."""
    (tmp_path / "api.json").write_text(json.dumps({
        "openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {"/x": {"post": {
            "operationId": "x", "responses": {"200": {"description": "ok", "content": {"application/json": {}}}}}}}}))
    tool = next(iter(Toolbox().openapi(str(tmp_path / "api.json"), base_url=broken_server)))
    failed = await failure(tool, {})
    assert failed.code == code
    if code == "UPSTREAM_UNAVAILABLE":  # a POST that reached the upstream may have acted
        assert failed.retryable and failed.message.endswith("The request reached it. External effects of the "
                                                            "tool may have committed.")


async def test_a_caller_cannot_send_the_credentials_query_parameter(api: Upstream, tmp_path: Path) -> None:
    """An object exploded into the query (OpenAPI's default for one) makes a parameter of each of
    its keys: a key named as the worker's API key sent the caller's key first, which many servers
    read, and the worker's second."""
    (tmp_path / "api.json").write_text(json.dumps({
        "openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {"/text": {"get": {
            "operationId": "search", "parameters": [{"name": "filter", "in": "query", "schema": {"type": "object"}}],
            "responses": {"200": {"description": "ok", "content": {"text/plain": {}}}}}}}}))
    box = Toolbox()
    box.openapi(str(tmp_path / "api.json"), base_url=api.url,
                auth=api_key_query("api_key", environ={"CARMY_OPENAPI_API_KEY": "k-123"}))
    await data(next(iter(box)), {"filter": {"api_key": "the-callers", "color": "red"}})
    assert api.seen[-1].query == [("color", "red"), ("api_key", "k-123")]
