"""An operation's name and behaviour as a tool."""

from __future__ import annotations

import pytest

from carmy_worker.openapi.naming import Behaviour, base_name, behaviour, unique


@pytest.mark.parametrize(("operation_id", "method", "path", "prefix", "name"), [
    ("listPets", "GET", "/pets", "", "listPets"),
    ("post_oauth2_token#refresh", "POST", "/oauth2/token", "", "post_oauth2_token_refresh"),
    ("List pets (v2)!", "GET", "/pets", "", "List_pets_v2"),
    (None, "GET", "/pets/{petId}/toys", "", "get_pets_petId_toys"),
    ("listPets", "GET", "/pets", "shop.", "shop.listPets"),
    ("carmy_status", "GET", "/status", "", "op_carmy_status"),
    ("status", "GET", "/status", "carmy_", "op_carmy_status"),
    ("x" * 200, "GET", "/x", "", "x" * 128),
])
def test_names_follow_the_protocols_rules(operation_id: str | None, method: str, path: str, prefix: str,
                                          name: str) -> None:
    assert base_name(method, path, operation_id, prefix) == name


def test_names_are_made_unique_within_the_length() -> None:
    taken: set[str] = set()
    assert [unique(n, taken) for n in ("a", "a", "a", "b" * 128, "b" * 128)] == ["a", "a_2", "a_3", "b" * 128,
                                                                              "b" * 126 + "_2"]


@pytest.mark.parametrize(("method", "expected"), [
    ("GET", Behaviour("read", True, "none")), ("HEAD", Behaviour("read", True, "none")),
    ("PUT", Behaviour("external_write", True, "none")), ("POST", Behaviour("external_write", False, "none")),
    ("PATCH", Behaviour("external_write", False, "none")), ("DELETE", Behaviour("destructive", False, "required")),
])
def test_effects_by_method(method: str, expected: Behaviour) -> None:
    assert behaviour(method, None, None) == expected


def test_declared_effects_and_the_options_override() -> None:
    assert behaviour("POST", "read", None) == Behaviour("read", True, "none")  # a search by POST
    assert behaviour("GET", "external_write", None) == Behaviour("external_write", False, "none")
    assert behaviour("PUT", "destructive", None) == Behaviour("destructive", False, "required")
    assert behaviour("DELETE", "read", "external_write") == Behaviour("external_write", False, "none")
    with pytest.raises(ValueError, match="x-carmy-effect 'sometimes' is not one of"):
        behaviour("GET", "sometimes", None)
