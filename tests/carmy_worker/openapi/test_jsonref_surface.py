"""jsonref's names that ``carmy_worker.openapi.schemas`` reads on its proxies, pinned: a release
that renames one fails here rather than producing schemas without their definitions."""

from __future__ import annotations

import jsonref

from tests.pins import assert_tested_release


def test_the_supported_jsonref_release() -> None:
    assert_tested_release("jsonref")


def test_a_proxy_tells_where_it_points_and_what_it_points_to() -> None:
    document = jsonref.replace_refs({"a": {"$ref": "#/b", "description": "sibling"}, "b": {"x": 1}},
                                    base_uri="file:///api.json", lazy_load=True)
    proxy = document["a"]
    assert isinstance(proxy, jsonref.JsonRef)
    assert object.__getattribute__(proxy, "base_uri") == "file:///api.json"
    assert proxy.__reference__ == {"$ref": "#/b", "description": "sibling"}
    assert proxy.__subject__ == {"x": 1}
