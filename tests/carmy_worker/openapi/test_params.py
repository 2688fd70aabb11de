"""Parameters on the wire, and no request forgery through them: a path parameter stays in its
segment and the URL on the base URL's origin, whatever the value."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from carmy_worker.openapi.params import Parameter, ParameterError, header_value, path_segment, query_pairs, url

BASE = httpx.URL("https://api.example.test/v1")


def param(location: Any = "query", style: str = "form", explode: bool = True, as_json: bool = False) -> Parameter:
    return Parameter(name="p", location=location, required=False, style=style, explode=explode, as_json=as_json)


def at(value: Any) -> httpx.URL:
    return url(BASE, "/pets/{petId}/toys", {"petId": path_segment(param("path", "simple", False), value)})


@pytest.mark.parametrize(("value", "path"), [
    ("rex", "/v1/pets/rex/toys"),
    ("a/b", "/v1/pets/a%2Fb/toys"),
    ("../../admin", "/v1/pets/..%2F..%2Fadmin/toys"),
    ("x?admin=1#frag", "/v1/pets/x%3Fadmin%3D1%23frag/toys"),
    ("@evil.example", "/v1/pets/%40evil.example/toys"),
    ("//evil.example/x", "/v1/pets/%2F%2Fevil.example%2Fx/toys"),
    ("%2e%2e", "/v1/pets/%252e%252e/toys"),
    ("a b\r\nc", "/v1/pets/a%20b%0D%0Ac/toys"),
    (42, "/v1/pets/42/toys"),
    (["a", "b"], "/v1/pets/a%2Cb/toys"),
])
def test_a_path_parameter_stays_in_its_segment(value: Any, path: str) -> None:
    target = at(value)
    assert (target.scheme, target.host, target.port) == ("https", "api.example.test", None)
    assert target.raw_path.decode() == path


@pytest.mark.parametrize("value", ["", ".", ".."])
def test_segments_that_would_move_up_or_vanish_are_refused(value: str) -> None:
    with pytest.raises(ParameterError, match="cannot be"):
        at(value)


@pytest.mark.parametrize("template", ["/../../elsewhere", "/%2e%2e/elsewhere", "/%2E./elsewhere", "/items/%2e"])
def test_a_template_that_leaves_the_base_is_refused(template: str) -> None:
    """A server that decodes ``%2e`` before resolving dot segments (RFC 3986, 6.2.2.2) reads
    ``/v1/%2e%2e/elsewhere`` as ``/elsewhere``: out of the base URL's path."""
    with pytest.raises(ParameterError, match="leaves the base URL"):
        url(BASE, template, {})


@pytest.mark.parametrize(("style", "explode", "value", "pairs"), [
    ("form", True, ["a", "b"], [("p", "a"), ("p", "b")]),
    ("form", False, ["a", "b"], [("p", "a,b")]),
    ("spaceDelimited", False, ["a", "b"], [("p", "a b")]),
    ("pipeDelimited", False, ["a", "b"], [("p", "a|b")]),
    ("form", True, {"x": 1, "y": True}, [("x", "1"), ("y", "true")]),
    ("form", False, {"x": 1, "y": "z"}, [("p", "x,1,y,z")]),
    ("deepObject", True, {"x": 1, "y": None}, [("p[x]", "1"), ("p[y]", "")]),
    ("form", True, False, [("p", "false")]),
    ("form", True, 2.5, [("p", "2.5")]),
])
def test_query_styles(style: str, explode: bool, value: Any, pairs: list[tuple[str, str]]) -> None:
    assert query_pairs(param(style=style, explode=explode), value) == pairs


def test_a_json_parameter_is_sent_as_json_text() -> None:
    assert query_pairs(param(as_json=True), {"a": [1, "é"]}) == [("p", '{"a":[1,"é"]}')]


def test_a_header_value_cannot_end_its_header() -> None:
    with pytest.raises(ParameterError, match="cannot contain a line break"):
        header_value(param("header", "simple", False), "ok\r\nX-Admin: yes")
    assert header_value(param("header", "simple", False), ["a", "b"]) == "a,b"
