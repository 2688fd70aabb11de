"""A request's header fields, read once for the guards, the authentication and the endpoint."""

from __future__ import annotations

from typing import Any

from api.http.fields import fields, header


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "headers": list(headers)}


def test_a_repeated_field_is_its_first_line() -> None:
    s = scope((b"host", b"a.example"), (b"host", b"b.example"), (b"content-type", b"application/json"))
    assert header(s, b"host") == "a.example"
    assert fields(s)[b"content-type"] == b"application/json"
    assert header(s, b"origin") is None


def test_a_repeated_list_field_is_one_list() -> None:
    s = scope((b"accept", b"application/json"), (b"prefer", b"wait=5"), (b"accept", b"text/event-stream"),
              (b"prefer", b"respond-async"))
    assert fields(s)[b"accept"] == b"application/json, text/event-stream"
    assert fields(s)[b"prefer"] == b"wait=5, respond-async"


def test_headers_replaced_after_a_first_read_are_read_again() -> None:
    # A middleware may rewrite scope["headers"] between two readers: the second sees the new ones.
    s = scope((b"authorization", b"Bearer old"))
    assert fields(s)[b"authorization"] == b"Bearer old"
    s["headers"] = [(b"authorization", b"Bearer new")]
    assert fields(s)[b"authorization"] == b"Bearer new"
