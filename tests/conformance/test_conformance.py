"""The official MCP conformance suite (``@modelcontextprotocol/conformance``, pinned in
package.json with the Node 22 it needs) against /mcp: the app under uvicorn, a real Redis and a
real worker serving tests/toolsets/conformance.py, the tools the suite calls by name.

The suite's ``server`` command runs one scenario as an MCP client (the TypeScript SDK 1.x, so
the handshake protocol, 2025-11-25; 0.1.16 has no 2026-07-28 scenario) and writes its checks
(SUCCESS, FAILURE, WARNING, INFO) to ``checks.json``. Each test asserts that its scenario has no
FAILURE and no WARNING but those listed in WAIVED, and shows the suite's details when it does.
The scenarios run in the first test's setup, as many at once as there are CPUs (a Node process
of 1-2 s each); the first run on a machine also installs the packages (``npm ci``, half a
minute).

Every server scenario of 0.1.16, and whether it applies to a tools-only server:

=============================  =======  =========================================================
scenario                       applies  why
=============================  =======  =========================================================
server-initialize              yes      the handshake
ping                           yes
tools-list                     yes      name, description, inputSchema on every tool
tools-call-simple-text         yes      ``test_simple_text``
tools-call-error               yes      ``test_error_handling``: ``isError`` and a message
tools-call-with-progress       yes      ``test_tool_with_progress``: 3 increasing notifications
json-schema-2020-12            yes      ``json_schema_2020_12_tool``: ``$defs`` and
                                        ``additionalProperties`` kept; ``$schema`` waived (below).
                                        Pending in the suite (not in its default run)
server-sse-polling             yes      ``test_reconnection``; resumable SSE (SEP-1699) is not
                                        something /mcp does: two SHOULD warnings (below). Pending
                                        in the suite
server-sse-multiple-streams    yes      concurrent POSTs, each its own SSE stream
dns-rebinding-protection       yes      Host/Origin checks (api/browser.py)
logging-set-level              no       no logging capability: tools log to the worker's log
completion-complete            no       completions are for prompt and resource-template
                                        arguments; there are neither
tools-call-image               no       a tool's result is JSON data, sent as one text item (and
tools-call-audio               no       ``structuredContent``): no image, audio or resource
tools-call-embedded-resource   no       content can be expressed
tools-call-mixed-content       no
tools-call-with-logging        no       no logging capability (``notifications/message``)
tools-call-sampling            no       a tool cannot send the client a request and wait for its
tools-call-elicitation         no       answer (``sampling/createMessage``, ``elicitation/create``)
elicitation-sep1034-defaults   no
elicitation-sep1330-enums      no
resources-list                 no       no resources
resources-read-text            no
resources-read-binary          no
resources-templates-read       no
resources-subscribe            no
resources-unsubscribe          no
prompts-list                   no       no prompts
prompts-get-simple             no
prompts-get-with-args          no
prompts-get-embedded-resource  no
prompts-get-with-image         no
=============================  =======  =========================================================

0.2.0 (alphas on npm, not pinned here) adds 2026-07-28 scenarios (server-stateless, caching,
http-header-validation, tasks-*, input-required-result-*) and runs the tools scenarios at
2026-07-28 with ``--spec-version``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from api.settings import ApiSettings
from tests.npm import INSTALL_TIMEOUT_S, npm_install
from tests.support import Stack, serving

HERE = Path(__file__).parent
CLI = Path("@modelcontextprotocol", "conformance", "dist", "index.js")
RUN_TIMEOUT_S = 30.0  # one scenario; each takes 1-2 s

APPLICABLE = [
    "server-initialize", "ping", "tools-list", "tools-call-simple-text", "tools-call-error",
    "tools-call-with-progress", "json-schema-2020-12", "server-sse-polling", "server-sse-multiple-streams",
    "dns-rebinding-protection",
]
NOT_APPLICABLE = [
    "logging-set-level", "completion-complete", "tools-call-image", "tools-call-audio",
    "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging", "tools-call-sampling",
    "tools-call-elicitation", "elicitation-sep1034-defaults", "elicitation-sep1330-enums", "resources-list",
    "resources-read-text", "resources-read-binary", "resources-templates-read", "resources-subscribe",
    "resources-unsubscribe", "prompts-list", "prompts-get-simple", "prompts-get-with-args",
    "prompts-get-embedded-resource", "prompts-get-with-image",
]

# Checks that fail, or warn, because of what Carmy deliberately does; the test fails if they
# stop doing so, so that the entry goes.
WAIVED = {
    "json-schema-2020-12": {
        # The check wants the $schema a tool's author wrote kept in inputSchema. Carmy's schemas
        # are generated from the tool's types and name no dialect: one without $schema is
        # 2020-12 (SEP-1613), which is what the API validates against.
        "json-schema-2020-12-$schema": "FAILURE",
    },
    "server-sse-polling": {
        # /mcp is stateless and keeps no events to resume a stream from (GET /mcp is 405), so
        # it sends no priming event (an id to resume from) and no retry field (SHOULDs).
        "server-sse-priming-event": "WARNING",
        "server-sse-retry-field": "WARNING",
    },
}

pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT_S + 60)  # the first test may install the suite


@dataclass
class Run:
    """One run of the suite's CLI: its output, and the checks of a scenario."""

    command: str
    returncode: int | None
    output: str
    checks: list[dict[str, Any]] = field(default_factory=list)

    def describe(self, limit: int = 4000) -> str:
        shown = [c for c in self.checks if c.get("status") not in ("SUCCESS", "INFO")] or self.checks
        text = json.dumps(shown, indent=1)
        if not self.checks:
            text = f"no checks.json; exit code {self.returncode}; output:\n{_plain(self.output)}"
        return f"{self.command}\n{text[:limit]}"


@pytest.fixture(scope="module")
def node_modules() -> Path:
    return npm_install(HERE)


@pytest.fixture(scope="module")
def url(stack: Stack) -> Iterator[str]:
    stack.worker("tests.toolsets.conformance")
    with serving(create_app(ApiSettings(redis_url=stack.redis_url))) as base:
        yield base + "/mcp"


@pytest.fixture(scope="module")
def runs(node_modules: Path, url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every applicable scenario, and the suite's list of scenarios, as many at once as there
    are CPUs: a Node process spends most of its second starting."""
    node = str(node_modules / ".bin" / "node")
    cli = str(node_modules / CLI)
    out = tmp_path_factory.mktemp("conformance")
    commands = {name: [node, cli, "server", "--url", url, "--scenario", name, "-o", str(out / name)]
                for name in APPLICABLE}
    commands["list"] = [node, cli, "list", "--server"]

    def run(name: str) -> Run:
        args = commands[name]
        try:
            done = subprocess.run(args, cwd=out, env={**os.environ, "NO_COLOR": "1"}, capture_output=True,
                                  text=True, timeout=RUN_TIMEOUT_S, check=False)
            result = Run(" ".join(args[2:]), done.returncode, done.stdout + done.stderr)
        except subprocess.TimeoutExpired as exc:
            output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            result = Run(" ".join(args[2:]), None, f"{output}\n[killed: still running after {RUN_TIMEOUT_S:g} s]")
        for path in (out / name).glob("*/checks.json"):
            result.checks = json.loads(path.read_text())
        return result

    with ThreadPoolExecutor(max_workers=min(len(commands), os.cpu_count() or 1)) as pool:
        return dict(zip(commands, pool.map(run, commands), strict=True))


@pytest.mark.parametrize("scenario", APPLICABLE)
def test_scenario(runs: dict[str, Run], scenario: str) -> None:
    run = runs[scenario]
    assert run.checks, run.describe()
    waived = WAIVED.get(scenario, {})
    unexpected = [c for c in run.checks
                  if c["status"] in ("FAILURE", "WARNING") and waived.get(c["id"]) != c["status"]]
    assert not unexpected, f"{scenario}: {len(unexpected)} check(s) not passed\n{run.describe()}"
    statuses = {c["id"]: c["status"] for c in run.checks}
    stale = {check: (status, statuses.get(check)) for check, status in waived.items() if statuses.get(check) != status}
    assert not stale, f"{scenario}: waived checks no longer {stale} (waived, got): drop them from WAIVED"


def test_every_scenario_is_classified(runs: dict[str, Run]) -> None:
    """A new version of the suite brings new scenarios: each needs a place in the table."""
    listed = runs["list"]
    assert listed.returncode == 0, listed.describe()
    server = listed.output.split("Server scenarios", 1)[-1]
    names = set(re.findall(r"^\s*- (\S+)", server, re.MULTILINE))
    assert names == set(APPLICABLE) | set(NOT_APPLICABLE), (
        f"not classified: {sorted(names - set(APPLICABLE) - set(NOT_APPLICABLE))}; "
        f"no longer in the suite: {sorted((set(APPLICABLE) | set(NOT_APPLICABLE)) - names)}")


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[-3000:]
