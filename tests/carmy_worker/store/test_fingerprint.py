"""The fingerprint's canonical form: key order and white space never matter; content does."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from carmy_worker.store import keys
from carmy_worker.store.keys import fingerprint, idempotency
from carmy_worker.wire import canonical_json_encoder

scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8) | st.floats(
    allow_nan=False, allow_infinity=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)
arguments = st.dictionaries(st.text(max_size=6), values, max_size=6)


def shuffled(value: Any, rng: random.Random) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def print_of(tool: str, raw_json: str) -> str:
    """What the API does: decode the request's arguments, encode canonically, hash."""
    return fingerprint(tool, canonical_json_encoder.encode(msgspec.json.decode(raw_json)))


@pytest.mark.slow
@given(arguments, st.randoms(use_true_random=False), st.sampled_from([None, 2, "\t"]))
def test_same_arguments_in_any_order_and_spacing(args: dict[str, Any], rng: random.Random,
                                                 indent: int | str | None) -> None:
    a = json.dumps(args)
    b = json.dumps(shuffled(args, rng), indent=indent)
    assert print_of("t", a) == print_of("t", b)


@pytest.mark.slow
@given(arguments, arguments)
def test_different_arguments_differ(a: dict[str, Any], b: dict[str, Any]) -> None:
    same = canonical_json_encoder.encode(a) == canonical_json_encoder.encode(b)
    assert (print_of("t", json.dumps(a)) == print_of("t", json.dumps(b))) == same


@pytest.mark.slow
@given(arguments)
def test_tool_name_is_part_of_it(args: dict[str, Any]) -> None:
    raw = json.dumps(args)
    assert print_of("a", raw) != print_of("b", raw)


def test_list_order_matters() -> None:
    assert print_of("t", '{"x": [1, 2]}') != print_of("t", '{"x": [2, 1]}')


@given(st.text(min_size=1, max_size=20), st.text(max_size=5), st.text(max_size=5))
def test_identity_key_hides_its_parts_and_does_not_collide_on_separators(request_id: str, p: str, s: str) -> None:
    key = idempotency(p, s, request_id)
    prefix = keys.partition_prefix(keys.partition_of_key(key)) + "idem:"  # its digest's partition
    assert key.startswith(prefix) and len(key) == len(prefix) + 64
    assert idempotency(p + "x", s, request_id) != key
    assert idempotency(None, s, request_id) != idempotency("", s, request_id)
