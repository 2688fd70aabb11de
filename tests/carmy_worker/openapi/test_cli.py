"""``python -m carmy_worker --openapi SPEC --base-url URL``: the options, the credentials from
the environment, and what stops the worker at start, naming it."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from carmy_worker import ToolDefinitionError
from carmy_worker.openapi import cli
from tests.openapi_upstream import DOCUMENT
from tests.support import ROOT


def parsed(*argv: str, environ: dict[str, str] | None = None) -> Any:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.options(parser.parse_args(["--openapi", "x.yaml", "--base-url", "https://api.test", *argv]),
                       environ or {})


def test_the_options() -> None:
    options = parsed("--operations", "getItem, DELETE /items/{itemId}", "--prefix", "shop_", "--timeout", "12",
                     "--strict-output", "--effect", "DELETE /items/{itemId}=external_write", "--effect", "slow=none")
    assert (options.operations, options.prefix, options.timeout, options.strict_output) == (
        ["getItem", "DELETE /items/{itemId}"], "shop_", 12.0, True)
    assert options.effects == {"DELETE /items/{itemId}": "external_write", "slow": "none"}
    assert options.auth is None and parsed().effects is None


def test_credentials_from_their_variables() -> None:
    assert parsed(environ={"CARMY_OPENAPI_BEARER_TOKEN": "t0k"}).auth.headers() == {"Authorization": "Bearer t0k"}
    assert parsed("--api-key-header", "X-Api-Key", environ={"CARMY_OPENAPI_API_KEY": "k"}).auth.headers() == {
        "X-Api-Key": "k"}
    assert parsed("--api-key-query", "key", environ={"CARMY_OPENAPI_API_KEY": "k"}).auth.params() == {"key": "k"}
    basic = parsed(environ={"CARMY_OPENAPI_USERNAME": "u", "CARMY_OPENAPI_PASSWORD": "p"}).auth
    assert basic.headers() == {"Authorization": "Basic dTpw"} and "p" not in repr(basic)


@pytest.mark.parametrize(("argv", "environ", "problem"), [
    ((), {"CARMY_OPENAPI_BEARER_TOKEN": "t", "CARMY_OPENAPI_API_KEY": "k"}, "bearer and api key are set"),
    ((), {"CARMY_OPENAPI_API_KEY": "k"}, "needs exactly one of --api-key-header"),
    (("--api-key-header", "X-Key"), {}, "CARMY_OPENAPI_API_KEY is unset or empty"),
    ((), {"CARMY_OPENAPI_USERNAME": "u"}, "CARMY_OPENAPI_PASSWORD is unset or empty"),
    (("--effect", "slow=fast"), {}, "--effect 'slow=fast' is not OPERATION=EFFECT"),
])
def test_what_is_refused(argv: tuple[str, ...], environ: dict[str, str], problem: str) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        parsed(*argv, environ=environ)


def start(*argv: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"CARMY_REDIS_URL": "redis://127.0.0.1:1/0"}
    return subprocess.run([sys.executable, "-m", "carmy_worker", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=30)


def test_a_bad_document_stops_the_worker_naming_the_operation(tmp_path: Path) -> None:
    bad = json.loads(json.dumps(DOCUMENT))
    bad["paths"]["/items"]["get"]["responses"] = {"200": {"content": {"application/json": {}}}}  # no description
    (tmp_path / "api.json").write_text(json.dumps(bad))
    result = start("--openapi", str(tmp_path / "api.json"), "--base-url", "http://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert f"carmy_worker: openapi: {tmp_path / 'api.json'}: operation GET /items (listItems), at responses.200" \
        in result.stderr


@pytest.mark.slow
def test_the_command_line_needs_a_module_or_a_document() -> None:
    assert "give a MODULE, or --openapi SPEC --base-url URL, or both" in start().stderr
    assert "--base-url is required with --openapi" in start("--openapi", "x.yaml").stderr
    assert "--base-url is for --openapi SPEC" in start("tests.toolsets.basic", "--base-url", "http://x.test").stderr
