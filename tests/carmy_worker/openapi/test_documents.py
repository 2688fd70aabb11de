"""Real documents become tools: the OpenAPI Initiative's Petstore (3.0), Box's Platform API (3.0,
large, ``allOf`` and ``$ref`` chains), and the test upstream's own (3.1). Every schema published
is a valid, self-contained Draft 2020-12 schema, as the API and MCP clients need it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonref
import jsonschema
import jsonschema_rs
import pytest
import yaml

from carmy_worker import Tool, Toolbox, ToolDefinitionError
from carmy_worker.openapi import document
from carmy_worker.openapi.operations import Selection, operations
from tests.openapi_upstream import DOCUMENT

SPECS = Path(__file__).parent / "specs"
BASE = "https://api.example.test/v1"


def tools_of(spec: str | Path, **options: Any) -> dict[str, Tool]:
    return {t.name: t for t in Toolbox().openapi(spec, base_url=BASE, **options)}


def check_published(tool: Tool, *, reference: bool = True) -> None:
    """A valid Draft 2020-12 schema (by the reference implementation, or for a large document by
    the API's own, which is faster), with no reference out of itself and no root $ref."""
    for schema in (tool.spec.input_schema, tool.spec.output_schema):
        if reference:
            jsonschema.Draft202012Validator.check_schema(schema)
        else:
            jsonschema_rs.meta.validate(schema)
        assert "$ref" not in schema
        assert not [key for key in _keys(schema) if key.startswith("x-") or key in ("nullable", "discriminator")]
        for ref in _refs(schema):
            assert ref.startswith("#/$defs/") and ref.removeprefix("#/$defs/") in schema["$defs"], ref
    assert tool.spec.input_schema["type"] == "object" and tool.spec.input_schema["additionalProperties"] is False


def _keys(node: Any) -> Iterator[str]:
    """The keywords of a schema and its subschemas (not property or definition names, nor values)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            if key in ("properties", "$defs", "patternProperties") and isinstance(value, dict):
                for sub in value.values():
                    yield from _keys(sub)
            elif key not in ("enum", "const", "default", "examples", "required"):
                yield from _keys(value)
    elif isinstance(node, list):
        for value in node:
            yield from _keys(value)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_petstore() -> None:
    tools = tools_of(SPECS / "petstore.yaml")
    assert sorted(tools) == ["createPets", "listPets", "showPetById"]
    for tool in tools.values():
        check_published(tool)
    listing, create, show = tools["listPets"].spec, tools["createPets"].spec, tools["showPetById"].spec
    assert (listing.effect, listing.idempotent, listing.confirmation) == ("read", True, "none")
    assert (create.effect, create.idempotent) == ("external_write", False)
    assert listing.description == "List all pets"
    assert listing.input_schema["properties"]["limit"] == {
        "type": "integer", "maximum": 100, "format": "int32",
        "description": "How many items to return at one time (max 100)"}
    assert "required" not in listing.input_schema
    assert listing.output_schema == {"type": "array", "maxItems": 100, "items": {"$ref": "#/$defs/Pet"},
                                     "$defs": {"Pet": {"type": "object", "required": ["id", "name"], "properties": {
                                         "id": {"type": "integer", "format": "int64"}, "name": {"type": "string"},
                                         "tag": {"type": "string"}}}}}
    assert create.input_schema["required"] == ["body"]
    assert create.input_schema["properties"]["body"] == {"$ref": "#/$defs/Pet"}
    assert create.output_schema == {"type": "null"}  # 201 without a body
    assert show.input_schema["required"] == ["petId"]
    assert show.output_schema["required"] == ["id", "name"]  # the root $ref inlined


@pytest.mark.slow
def test_box_platform_a_large_document_with_allof_and_deep_references(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "carmy.worker"):
        tools = tools_of(SPECS / "box-platform.json")
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(tools) == 285 and len(skipped) == 11
    assert ("openapi: POST /files/content (post_files_content) skipped: its request body is multipart/form-data: "
            "only JSON bodies can be a tool's input") in skipped
    assert any("GET /users/{user_id}/avatar (get_users_id_avatar) skipped: its response is image/jpg" in s
               for s in skipped)
    for tool in tools.values():
        check_published(tool, reference=False)
    effects = {name: (t.spec.effect, t.spec.idempotent, t.spec.confirmation) for name, t in tools.items()}
    assert effects["get_files_id"] == ("read", True, "none")
    assert effects["put_files_id"] == ("external_write", True, "none")
    assert effects["post_folders"] == ("external_write", False, "none")
    assert effects["delete_files_id"] == ("destructive", False, "required")
    # GET /files/{file_id} answers a File--Full: an allOf of File, itself an allOf of File--Mini…
    file_full = tools["get_files_id"].spec.output_schema
    assert "allOf" in file_full and {"File", "File--Mini", "File--Base"} <= set(file_full["$defs"])
    assert tools["get_files_id"].spec.input_schema["required"] == ["file_id"]
    # Header parameters are inputs (if-none-match); "#refresh" is no tool-name character.
    assert "if-none-match" in tools["get_files_id"].spec.input_schema["properties"]
    assert "post_oauth2_token_refresh" not in tools  # form-encoded: skipped, so its name is not taken


def test_the_upstreams_own_31_document(tmp_path: Path) -> None:
    spec = tmp_path / "items.yaml"
    spec.write_text(yaml.safe_dump(DOCUMENT))
    tools = tools_of(spec, prefix="shop.")
    assert sorted(tools) == ["shop.broken", "shop.createItem", "shop.deleteItem", "shop.getItem", "shop.listItems",
                             "shop.moved", "shop.rateLimited", "shop.replaceItem", "shop.slow", "shop.text",
                             "shop.whoami"]  # uploadPhoto's body is multipart
    for tool in tools.values():
        check_published(tool)
    create = tools["shop.createItem"].spec.input_schema
    # readOnly id is the server's to set: not part of the input, nor required of it.
    assert create["$defs"]["Item"]["properties"].keys() == {"name", "price", "tags"}
    assert create["$defs"]["Item"]["required"] == ["name"]
    output = tools["shop.createItem"].spec.output_schema
    assert output["required"] == ["id", "name"] and output["properties"]["price"]["type"] == ["number", "null"]
    assert tools["shop.getItem"].spec.input_schema["required"] == ["itemId"]  # a path item's parameter
    assert tools["shop.text"].spec.output_schema == {"type": "string"}
    deleting = tools["shop.deleteItem"].spec
    assert (deleting.effect, deleting.confirmation, deleting.output_schema) == ("destructive", "required",
                                                                               {"type": "null"})


def test_only_some_operations_and_effects_by_option(tmp_path: Path) -> None:
    spec = tmp_path / "items.json"
    spec.write_text(json.dumps(DOCUMENT))
    tools = tools_of(spec, operations=["getItem", "DELETE /items/{itemId}", "slow"],
                     effects={"DELETE /items/{itemId}": "external_write", "slow": "none"})
    assert sorted(tools) == ["deleteItem", "getItem", "slow"]
    assert (tools["deleteItem"].spec.effect, tools["deleteItem"].spec.confirmation) == ("external_write", "none")
    assert tools["deleteItem"].spec.idempotent is False
    with pytest.raises(ToolDefinitionError, match="no operation is named 'getitem'"):
        tools_of(spec, operations=["getitem"])
    with pytest.raises(ToolDefinitionError, match="no operation is named 'GET /nowhere'"):
        tools_of(spec, effects={"GET /nowhere": "read"})


def write(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "api.json"
    path.write_text(json.dumps(document))
    return path


def operation(op: dict[str, Any], route: str = "/things", method: str = "get") -> dict[str, Any]:
    return {"openapi": "3.0.3", "info": {"title": "t", "version": "1"},
            "paths": {route: {method: {"responses": {"200": {"description": "ok"}}, **op}}}}


def test_x_carmy_effect_and_its_mistakes(tmp_path: Path) -> None:
    declared = operation({"operationId": "search", "x-carmy-effect": "read"}, method="post")
    assert (tools_of(write(tmp_path, declared))["search"].spec.idempotent) is True
    wrong = operation({"operationId": "search", "x-carmy-effect": "maybe"}, method="post")
    with pytest.raises(ToolDefinitionError, match=r"POST /things \(search\): x-carmy-effect 'maybe' is not one of"):
        tools_of(write(tmp_path, wrong))


def test_an_invalid_document_is_refused_naming_the_operation(tmp_path: Path) -> None:
    bad = operation({"operationId": "listThings", "parameters": [{"name": "n", "in": "nowhere"}]})
    with pytest.raises(ToolDefinitionError) as refused:
        tools_of(write(tmp_path, bad))
    assert str(refused.value) == (
        f"openapi: {tmp_path / 'api.json'}: operation GET /things (listThings), at parameters[0]: "
        """{"in":"nowhere","name":"n"} is not valid under any of the schemas listed in the 'oneOf' keyword""")
    twice = operation({"operationId": "listThings"})
    twice["paths"]["/others"] = {"get": {"operationId": "listThings", "responses": {"200": {"description": "ok"}}}}
    with pytest.raises(ToolDefinitionError, match="Operation ID 'listThings' for 'get' in '/others' is not unique"):
        tools_of(write(tmp_path, twice))


@pytest.mark.parametrize(("version", "said"), [("3.0.3", "'description' is a required property"),
                                               ("3.1.0", '"description" is a required property')])
def test_a_mistake_inside_an_object_that_could_be_a_reference_is_named(tmp_path: Path, version: str, said: str) -> None:
    # The README's example: 3.0's schema makes a response "a Response or a Reference" (a oneOf); the
    # validator alone said only that it was neither.
    bad = operation({"operationId": "listPets", "responses": {"200": {"content": {}}}}, route="/pets")
    bad["openapi"] = version
    with pytest.raises(ToolDefinitionError) as refused:
        tools_of(write(tmp_path, bad))
    where = f"openapi: {tmp_path / 'api.json'}: operation GET /pets (listPets)"
    assert str(refused.value) == f"{where}, at responses.200: {said}"
    deeper = operation({"operationId": "listThings",
                        "parameters": [{"name": "n", "in": "query", "schema": {"type": "integer", "minimum": "x"}}]})
    with pytest.raises(ToolDefinitionError, match=r"at parameters\[0\]\.schema\.minimum: 'x' is not of type 'number'$"):
        tools_of(write(tmp_path, deeper))
    # A $ref that is wrong is told as before: the object meant to be a Reference.
    wrong_ref = operation({"operationId": "listThings", "responses": {"200": {"$ref": 42}}})
    with pytest.raises(ToolDefinitionError, match=r"at responses\.200: \{\"\$ref\":42\} is not valid under any of"):
        tools_of(write(tmp_path, wrong_ref))


@pytest.mark.parametrize(("document", "problem"), [
    ({"swagger": "2.0", "info": {"title": "t", "version": "1"}, "paths": {}}, "Swagger 2.0 is not supported"),
    ({"openapi": "4.0.0"}, "OpenAPI 4.0.0 is not supported: 3.0 or 3.1"),
    (["not", "a", "document"], "not an OpenAPI document"),
])
def test_what_is_not_openapi_3(tmp_path: Path, document: Any, problem: str) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        tools_of(write(tmp_path, document))  # type: ignore[arg-type]


def test_unreadable_documents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolDefinitionError, match="cannot be read"):
        tools_of(tmp_path / "missing.yaml")
    (tmp_path / "latin.yaml").write_bytes(b"openapi: 3.1.0\ninfo: {title: caf\xe9, version: '1'}\npaths: {}\n")
    with pytest.raises(ToolDefinitionError, match=r"latin\.yaml: cannot be read \('utf-8' codec"):
        tools_of(tmp_path / "latin.yaml")
    monkeypatch.setattr(document, "MAX_DOCUMENT_BYTES", 40)
    with pytest.raises(ToolDefinitionError, match=r"latin\.yaml: over 40 bytes"):
        tools_of(tmp_path / "latin.yaml")
    (tmp_path / "broken.yaml").write_text("openapi: [3.0\n")
    with pytest.raises(ToolDefinitionError, match="neither JSON nor YAML"):
        tools_of(tmp_path / "broken.yaml")


def test_documents_that_never_end_are_refused(tmp_path: Path) -> None:
    head = 'openapi: 3.1.0\ninfo: {title: t, version: "1"}\npaths: {}\n'
    (tmp_path / "loop.yaml").write_text(head + "x-loop: &s {type: object, properties: {again: *s}}\n")
    with pytest.raises(ToolDefinitionError, match=r"loop\.yaml: a YAML alias names a node that contains it"):
        tools_of(tmp_path / "loop.yaml")
    # A billion laughs: 10^8 values from ten lines, refused as soon as a million are counted.
    laughs = "x-0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x-{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]\n" for n in range(1, 8))
    (tmp_path / "laughs.yaml").write_text(head + laughs)
    with pytest.raises(ToolDefinitionError, match=r"laughs\.yaml: over 1,000,000 values once its YAML aliases"):
        tools_of(tmp_path / "laughs.yaml")
    for levels in (250, 100_000):  # the validator and jsonref recurse: a RecursionError, or worse, without the bound
        deep = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}, "x-deep": 0}
        (tmp_path / "deep.json").write_text(json.dumps(deep).replace("0}", "[" * levels + "]" * levels + "}"))
        with pytest.raises(ToolDefinitionError, match=r"deep\.json: nested deeper than 200 levels"):
            tools_of(tmp_path / "deep.json")
    shared = "x-ok: &ok {type: string}\nx-again: [*ok, *ok]\n"  # an alias that does end is fine
    (tmp_path / "shared.yaml").write_text(head + shared)
    assert tools_of(tmp_path / "shared.yaml") == {}


def test_a_long_chain_of_schemas_is_served(tmp_path: Path) -> None:
    """400 schemas, each a property of the one before: the document is valid and shallow, and
    building it followed each reference by recursion, a RecursionError out of the worker's start."""
    schemas: dict[str, Any] = {f"S{i}": {"type": "object", "properties": {"next": {
        "$ref": f"#/components/schemas/S{i + 1}"}}} for i in range(400)}
    schemas["S400"] = {"type": "string"}
    chain = operation({"operationId": "getChain", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/S0"}}}}}}) | {"components": {"schemas": schemas}}
    tool = tools_of(write(tmp_path, chain))["getChain"]
    check_published(tool, reference=False)
    assert len(tool.spec.output_schema["$defs"]) == 400  # S1…S400: S0 is the root
    # References to references, 400 of them: jsonref follows those by recursion; named, not a crash.
    schemas = {f"S{i}": {"$ref": f"#/components/schemas/S{i + 1}"} for i in range(400)} | {"S400": {"type": "string"}}
    with pytest.raises(ToolDefinitionError,
                       match=r"openapi: GET /things \(getChain\): cannot be read \(RecursionError"):
        tools_of(write(tmp_path, chain | {"components": {"schemas": schemas}}))


@pytest.mark.parametrize("levels", [6, 12])
def test_references_inside_values_that_never_end_are_refused(tmp_path: Path, levels: int) -> None:
    """A billion laughs made of references: a default referring to a list of ten references to
    the next list, and so on. Copied into the tool's schema, 12 levels are 10^12 values: the
    worker's start never ended. Refused as soon as a million are copied."""
    laughs: dict[str, Any] = {f"L{n}": [{"$ref": f"#/components/x-laughs/L{n + 1}"}] * 10 for n in range(levels)}
    laughs[f"L{levels}"] = "lol"
    document = operation({"operationId": "laugh", "parameters": [{"name": "q", "in": "query", "schema": {
        "type": "array", "default": {"$ref": "#/components/x-laughs/L0"}}}]}) | {"components": {"x-laughs": laughs}}
    with pytest.raises(ToolDefinitionError, match=r"openapi: GET /things \(laugh\): the references in its values "
                                                  r"expand to over 1,000,000 values"):
        tools_of(write(tmp_path, document))
    laughs = {"L0": [{"$ref": "#/components/x-laughs/L1"}] * 3, "L1": [1, 2]}  # one that ends is copied
    document["components"]["x-laughs"] = laughs
    query = tools_of(write(tmp_path, document))["laugh"].spec.input_schema["properties"]["q"]
    assert query["default"] == [[1, 2]] * 3


def test_a_value_that_contains_itself_is_refused(tmp_path: Path) -> None:
    """Past the validator (a default is not checked), a list whose element refers to the list."""
    document = operation({"operationId": "loop", "parameters": [{"name": "q", "in": "query", "schema": {
        "default": {"$ref": "#/components/x-loop"}}}]}) | {"components": {"x-loop": [{"$ref": "#/components/x-loop"}]}}
    with pytest.raises(ToolDefinitionError, match=r"openapi: GET /things \(loop\): a value is nested deeper than "
                                                  r"200 levels"):
        tools_of(write(tmp_path, document))


def test_an_operation_whose_path_leaves_the_base_url_is_not_served(tmp_path: Path) -> None:
    """Every call of it would leave the base URL's path (``%2e%2e`` is ``..`` to many servers) and be refused."""
    for route in ("/things/%2e%2e/admin", "/things/../admin"):
        assert tools_of(write(tmp_path, operation({"operationId": "up"}, route=route))) == {}
    assert list(tools_of(write(tmp_path, operation({"operationId": "up"}, route="/things/..x")))) == ["up"]


def test_the_count_of_values_bounds_yaml_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JSON has no aliases: its values are bounded by its bytes (MAX_DOCUMENT_BYTES), and a large
    real document (GitHub's has hundreds of thousands) is not refused for their count."""
    monkeypatch.setattr(document, "MAX_VALUES", 50)
    many = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}, "x-many": list(range(100))}
    (tmp_path / "many.json").write_text(json.dumps(many))
    assert tools_of(tmp_path / "many.json") == {}
    (tmp_path / "many.yaml").write_text(yaml.safe_dump(many))
    with pytest.raises(ToolDefinitionError, match=r"many\.yaml: over 50 values"):
        tools_of(tmp_path / "many.yaml")


def test_references_to_another_file_next_to_it(tmp_path: Path) -> None:
    (tmp_path / "schemas.yaml").write_text(yaml.safe_dump({"Thing": {"type": "object", "properties": {
        "name": {"type": "string"}, "parent": {"$ref": "#/Thing"}}}}))
    document = operation({"operationId": "getThing", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "schemas.yaml#/Thing"}}}}}})
    output = tools_of(write(tmp_path, document))["getThing"].spec.output_schema
    # Recursive: the definition stays, and the root is its copy.
    assert output["properties"]["parent"] == {"$ref": "#/$defs/Thing"} and "Thing" in output["$defs"]


def test_a_yaml_date_is_json_text_and_a_dangling_reference_names_its_operation(tmp_path: Path) -> None:
    (tmp_path / "api.yaml").write_text("""
openapi: 3.0.3
info: {title: t, version: "1"}
paths:
  /things:
    get:
      operationId: since
      parameters:
        - {name: from, in: query, schema: {type: string, format: date, default: 2024-01-31}}
      responses: {"200": {description: ok}}
""")
    assert tools_of(tmp_path / "api.yaml")["since"].spec.input_schema["properties"]["from"]["default"] == "2024-01-31"
    dangling = operation({"operationId": "getThing", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "missing.yaml#/Thing"}}}}}})
    with pytest.raises(ToolDefinitionError, match=r"api.json: operation GET /things \(getThing\), at responses.200"
                                                  r".content.application/json.schema: the reference "
                                                  r"'missing.yaml#/Thing': .*missing.yaml: cannot be read"):
        tools_of(write(tmp_path, dangling))


def test_what_the_validator_lets_through_and_cannot_be_read_names_its_operation(tmp_path: Path) -> None:
    """A reference that resolves only when followed (lazily), past validation: the error names the operation."""
    dangling = operation({"operationId": "getThing", "responses": {"200": {"description": "ok", "content": {
        "application/json": {"schema": {"$ref": "gone.yaml#/Thing"}}}}}})
    resolved = jsonref.replace_refs(dangling, base_uri=(tmp_path / "api.json").as_uri(), lazy_load=True)
    with pytest.raises(ValueError, match=r"GET /things \(getThing\): cannot be read \(JsonRefError"):
        operations(resolved, Selection())


@pytest.mark.parametrize("base", ["ftp://api.example.test", "https://user:pw@api.example.test", "/v1",
                                  "https://api.example.test/v1?key=1", "https://api.example.test/#top"])
def test_the_base_url_is_an_origin_and_a_path(base: str) -> None:
    with pytest.raises(ToolDefinitionError, match="must be http"):
        Toolbox().openapi(SPECS / "petstore.yaml", base_url=base)
