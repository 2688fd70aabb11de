"""A document's references are followed only to where it came from (carmy_worker/openapi/document.py).

A document someone else publishes must not make the worker read its own files, or addresses of
its network, and publish what it read in a tool's schema (a ``default`` is published as it is).
Documents are served here by a small HTTP server on 127.0.0.1 that counts every request, so that
"nothing was fetched" is seen from outside the worker's code."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from carmy_worker import Tool, Toolbox, ToolDefinitionError
from carmy_worker.openapi import document as document_module

SECRET = "TOP-SECRET-VALUE"


class Site:
    """An HTTP server on 127.0.0.1: ``pages`` by path (a dict is sent as JSON, a string redirects
    there, a number drips a byte every that many seconds, for ever), and every path asked for, in ``asked``."""

    def __init__(self) -> None:
        self.pages: dict[str, Any] = {}
        self.asked: list[str] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.asked.append(self.path)
                page = site.pages.get(self.path)
                if isinstance(page, str):
                    self.send_response(302)
                    self.send_header("location", page)
                    self.end_headers()
                    return
                if isinstance(page, float):
                    self.send_response(200)
                    self.end_headers()
                    with contextlib.suppress(OSError):  # until the reader leaves
                        while True:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                            time.sleep(page)
                    return
                body = json.dumps(page).encode()
                self.send_response(200 if page is not None else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    served = Site()
    yield served
    served.close()


@pytest.fixture
def elsewhere() -> Iterator[Site]:
    """Another origin (another port): what must never be asked."""
    served = Site()
    served.pages["/secret.json"] = {"secret": SECRET}
    yield served
    served.close()


def document(default_ref: str | None = None, schema_ref: str | None = None, **schema: Any) -> dict[str, Any]:
    """A 3.1 document of one operation whose query parameter's schema is ``schema``, with a
    ``default`` that is a reference, and a response schema that is one."""
    parameter: dict[str, Any] = dict(schema)
    if default_ref is not None:
        parameter["default"] = {"$ref": default_ref}
    response: dict[str, Any] = {"type": "object"} if schema_ref is None else {"$ref": schema_ref}
    return {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {"/items": {"get": {
        "operationId": "listItems", "parameters": [{"name": "q", "in": "query", "schema": parameter}],
        "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": response}}}}}}}}


def tools_of(source: str | Path) -> dict[str, Tool]:
    return {t.name: t for t in Toolbox().openapi(str(source), base_url="https://api.example.test")}


def published(tool: Tool) -> str:
    return json.dumps([tool.spec.input_schema, tool.spec.output_schema])


def test_a_reference_to_its_own_origin_is_followed(site: Site) -> None:
    site.pages["/schemas.json"] = {"Item": {"type": "object", "properties": {"name": {"type": "string"}}},
                                   "Word": "mouse"}
    site.pages["/api.json"] = document(default_ref="schemas.json#/Word", schema_ref="/schemas.json#/Item")
    tool = tools_of(site.url + "/api.json")["listItems"]
    assert tool.spec.input_schema["properties"]["q"]["default"] == "mouse"
    assert tool.spec.output_schema["properties"] == {"name": {"type": "string"}}
    assert sorted(site.asked) == ["/api.json", "/schemas.json"]  # each read once: not again by the validator


@pytest.mark.parametrize("ref", ["file:///etc/hostname", "{secret_file}", "{elsewhere}/secret.json",
                                 "https:{site_host}/api.json", "ftp://127.0.0.1/secret.json",
                                 "data:application/json,%7B%7D"])
def test_a_url_documents_reference_elsewhere_stops_the_worker_having_read_nothing(
        site: Site, elsewhere: Site, tmp_path: Path, ref: str) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"secret": SECRET}))
    ref = ref.format(secret_file=secret.as_uri(), elsewhere=elsewhere.url, site_host=site.url.removeprefix("http:"))
    site.pages["/api.json"] = document(default_ref=ref)
    refused = (r"operation GET /items \(listItems\), at parameters\[0\]\.schema\.default: the reference .* outside "
               r"the document's origin: references are followed only to its own scheme, host and port")
    with pytest.raises(ToolDefinitionError, match=refused) as raised:
        tools_of(site.url + "/api.json")
    assert SECRET not in str(raised.value)
    assert site.asked == ["/api.json"] and elsewhere.asked == []


def test_a_reference_in_a_referenced_document_is_held_to_the_same_origin(site: Site, elsewhere: Site) -> None:
    site.pages["/schemas.json"] = {"Word": {"$ref": elsewhere.url + "/secret.json"}}
    site.pages["/api.json"] = document(default_ref="schemas.json#/Word")
    with pytest.raises(ToolDefinitionError, match=rf"in {site.url}/schemas.json: the reference .* outside"):
        tools_of(site.url + "/api.json")
    assert elsewhere.asked == []


def test_a_reference_that_redirects_is_not_followed(site: Site, elsewhere: Site) -> None:
    site.pages["/schemas.json"] = elsewhere.url + "/secret.json"
    site.pages["/api.json"] = document(default_ref="schemas.json")
    with pytest.raises(ToolDefinitionError, match=r"the reference 'schemas.json': .*schemas.json: cannot be read "
                                                  r"\(Redirect response '302 Found'"):
        tools_of(site.url + "/api.json")
    assert elsewhere.asked == []


def test_a_files_references_are_to_files(tmp_path: Path, elsewhere: Site) -> None:
    folder = tmp_path / "an api"  # a space: file URIs write it %20, and the file is still found
    folder.mkdir()
    (folder / "words.json").write_text(json.dumps({"Word": "mouse"}))
    (folder / "api.json").write_text(json.dumps(document(default_ref="words.json#/Word")))
    assert tools_of(folder / "api.json")["listItems"].spec.input_schema["properties"]["q"]["default"] == "mouse"
    (folder / "api.json").write_text(json.dumps(document(default_ref=elsewhere.url + "/secret.json")))
    with pytest.raises(ToolDefinitionError, match="outside the document's origin: references are followed only to "
                                                  "other files"):
        tools_of(folder / "api.json")
    assert elsewhere.asked == []


def test_a_files_references_stay_in_its_folder(tmp_path: Path) -> None:
    """A document someone else wrote, saved and loaded as a file, referred to any file the worker
    could read (``/proc/self/environ``: its secrets), published in the tool's schema."""
    folder = tmp_path / "api"
    (folder / "components").mkdir(parents=True)
    (tmp_path / "secret.json").write_text(json.dumps({"Word": "the worker's secret"}))
    (folder / "components" / "words.json").write_text(json.dumps({"Word": {"$ref": "../shared.json#/Word"}}))
    (folder / "shared.json").write_text(json.dumps({"Word": "mouse"}))
    # Below the document's folder, and up again within it: a split document's layout.
    (folder / "api.json").write_text(json.dumps(document(default_ref="components/words.json#/Word")))
    assert tools_of(folder / "api.json")["listItems"].spec.input_schema["properties"]["q"]["default"] == "mouse"
    (folder / "link.json").symlink_to(tmp_path / "secret.json")
    for ref in ("../secret.json#/Word", (tmp_path / "secret.json").as_uri() + "#/Word", "link.json#/Word"):
        (folder / "api.json").write_text(json.dumps(document(default_ref=ref)))
        with pytest.raises(ToolDefinitionError, match="outside the document's folder") as raised:
            tools_of(folder / "api.json")
        assert "the worker's secret" not in str(raised.value)


def test_a_document_read_a_byte_at_a_time_is_given_up_on(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each byte came within httpx's read timeout, so the worker's start waited for ever."""
    monkeypatch.setattr(document_module, "FETCH_TIMEOUT", 1.0)
    site.pages["/api.json"] = 0.1
    start = time.monotonic()
    with pytest.raises(ToolDefinitionError, match=r"api\.json: not read within 1 s"):
        tools_of(site.url + "/api.json")
    assert time.monotonic() - start < 15  # a byte every 0.1 s for ever: without the deadline, never


def test_a_document_over_the_limit_is_read_no_further(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(document_module, "MAX_DOCUMENT_BYTES", 200)
    site.pages["/api.json"] = document(description="x" * 1000)
    with pytest.raises(ToolDefinitionError, match=r"api\.json: over 200 bytes"):
        tools_of(site.url + "/api.json")
