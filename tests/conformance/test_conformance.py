"""The official MCP conformance suite (``@modelcontextprotocol/conformance``) against /mcp: the app
under uvicorn, a real Redis and a real worker serving tests/toolsets/conformance.py, the tools
the suite calls by name. Two releases of the suite are pinned in package.json, with the Node 22
they need: 0.1.16, the stable one, whose client speaks the handshake protocol (2025-11-25), and
0.2.0-alpha.12 (the newest alpha, as ``conformance-next``), which adds the 2026-07-28 revision
(stateless: no handshake, ``_meta`` on every request, ``Mcp-Method``/``Mcp-Name`` headers) and
its scenarios, run here with ``--spec-version 2026-07-28``.

The suite's ``server`` command runs scenarios as an MCP client and writes each one's checks
(SUCCESS, FAILURE, WARNING, SKIPPED, INFO) to a ``checks.json``. Each test, one per (suite
version, spec version, scenario), asserts that its scenario has no FAILURE and no WARNING but
those listed in WAIVED, and shows the suite's details when it does; a waived check that stops
failing fails the test too, so that its entry goes. The scenarios run in the first test's
setup: each suite at each spec version it is used at in one Node process, which runs every
scenario there, those that do not apply too (a Node process takes a second to start, a
scenario a tenth), those processes at once; the first run on a machine also installs the
packages (``npm ci``, half a minute).

Every server scenario of 0.1.16, run at 2025-11-25, and whether it applies to a tools-only
server:

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
dns-rebinding-protection       yes      Host/Origin checks (api/guards/browser.py)
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

Every server scenario of 0.2.0-alpha.12. "2026-07-28" is run at that revision here; "0.1.16"
applies, but to the handshake versions only, where 0.1.16 runs it:

=============================================  ==========  ========================================
scenario                                       applies     why
=============================================  ==========  ========================================
tools-list                                     2026-07-28  as in 0.1.16, on the stateless wire
tools-call-simple-text                         2026-07-28
tools-call-error                               2026-07-28
tools-call-with-progress                       2026-07-28
server-sse-multiple-streams                    2026-07-28
dns-rebinding-protection                       2026-07-28
json-schema-2020-12                            2026-07-28  ``$defs``, ``additionalProperties``;
                                                           ``$schema`` and the SEP-2106 keywords
                                                           waived (below). Pending in the suite
server-stateless                               2026-07-28  SEP-2575: ``server/discover``, ``_meta``
                                                           validation, 400/404 statuses, removed
                                                           methods, unsupported versions, header
                                                           mismatch, ``test_logging_tool``; its
                                                           sampling/elicitation probes waived
caching                                        2026-07-28  SEP-2549 ``ttlMs``/``cacheScope`` on
                                                           tools/list; the prompts and resources
                                                           lists waived (there are none: -32601)
http-header-validation                         2026-07-28  SEP-2243 ``Mcp-Method``/``Mcp-Name``
                                                           checks. Pending in the suite
http-custom-header-server-validation           2026-07-28  SEP-2243 ``x-mcp-header``:
                                                           ``test_custom_header``. Pending
input-required-result-unsupported-methods      2026-07-28  no ``InputRequiredResult`` from
                                                           tools/list or prompts/list
server-session-lifecycle                       2025-11-25  a handshake-era scenario new in the
                                                           alpha: DELETE of a session, skipped by
                                                           the suite for a stateless server
server-initialize                              0.1.16      the handshake (gone in 2026-07-28)
ping                                           0.1.16      gone in 2026-07-28
server-sse-polling                             0.1.16      2025-11-25 only
tasks-lifecycle                                2026-07-28  the tasks extension (SEP-2663), with
tasks-capability-negotiation                   2026-07-28  ``greet``, ``slow_compute``,
tasks-wire-fields                              2026-07-28  ``failing_job`` and
tasks-request-state-removal                    2026-07-28  ``protocol_error_job`` (served with
tasks-request-headers                          2026-07-28  CARMY_MCP_TASK_AFTER 0.8 s). Waived: a
tasks-dispatch-and-envelope                    2026-07-28  crash ends ``completed`` (TOOL_PANIC),
tasks-required-task-error                      2026-07-28  not ``failed``; text is JSON; no tool
                                                           requires a task; one call to a tool
                                                           that asks for input (below)
tasks-status-notifications                     no          SKIPPED by the suite (its harness waits
                                                           for subscriptions/listen)
tasks-mrtr-input                               no          tools that ask the client for input
tasks-mrtr-composition                         no          (``confirm_delete``, ``multi_input``,
                                                           ``test_tool_with_task``): a Carmy tool
                                                           cannot
logging-set-level                              no          as in 0.1.16
completion-complete                            no
tools-call-image                               no
tools-call-audio                               no
tools-call-embedded-resource                   no
tools-call-mixed-content                       no
tools-call-with-logging                        no
tools-call-sampling                            no
tools-call-elicitation                         no
elicitation-sep1034-defaults                   no
elicitation-sep1330-enums                      no
resources-list                                 no
resources-read-text                            no
resources-read-binary                          no
resources-templates-read                       no
resources-subscribe                            no
resources-unsubscribe                          no
prompts-list                                   no
prompts-get-simple                             no
prompts-get-with-args                          no
prompts-get-embedded-resource                  no
prompts-get-with-image                         no
sep-2164-resource-not-found                    no          no resources: resources/read is -32601
                                                           (Method not found), where the SHOULDs
                                                           want a server with resources to say
                                                           -32602 with the uri
sep-2640-skills-directory                      no          the skills extension serves skills as
sep-2640-skills-enumeration                    no          resources: there are none
sep-2640-skills-manifest                       no
input-required-result-basic-elicitation        no          SEP-2322 (MRTR): a tool answers with an
input-required-result-basic-sampling           no          ``InputRequiredResult`` asking the client
input-required-result-basic-list-roots         no          for an elicitation, a sampling or its
input-required-result-request-state            no          roots, and is called again with the
input-required-result-multiple-input-requests  no          answers (and ``requestState``); a Carmy
input-required-result-multi-round              no          tool cannot ask the client anything.
input-required-result-missing-input-response   no          ``non-tool-request`` wants a prompt
input-required-result-non-tool-request         no
input-required-result-result-type              no
input-required-result-tampered-state           no
input-required-result-capability-check         no
input-required-result-ignore-extra-params      no
input-required-result-validate-input           no
=============================================  ==========  ========================================
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
from typing import Any, NamedTuple, cast

import pytest

from api.app import create_app
from tests.npm import INSTALL_TIMEOUT_S, npm_install
from tests.support import Stack, app_settings, serving

HERE = Path(__file__).parent
RUN_TIMEOUT_S = 120.0  # one suite at one spec version: 2-5 s (30-50 scenarios)


@dataclass(frozen=True)
class Suite:
    """One pinned release of the suite: its version (as package.json pins it), its folder in
    node_modules, and whether its ``server`` command takes ``--requirements <revision>``."""

    version: str
    package: str
    requirements: bool

    def selection(self, spec: str) -> list[str]:
        """What one run at ``spec`` runs. The alpha: the scenarios the revision requires, and
        those it runs and reports without scoring them (extensions, pending ones, ones added
        after the revision), at the revision's wire. 0.1.16: all it has, at 2025-11-25."""
        return ["--requirements", spec] if self.requirements else ["--suite", "all"]


STABLE = Suite("0.1.16", "@modelcontextprotocol/conformance", requirements=False)
NEXT = Suite("0.2.0-alpha.12", "conformance-next", requirements=True)
SUITES = {suite.version: suite for suite in (STABLE, NEXT)}


class Case(NamedTuple):
    """One run of the suite: a scenario at a spec version (what its client speaks)."""

    suite: str
    spec: str
    scenario: str

    @property
    def id(self) -> str:
        return f"{self.suite}:{self.spec}:{self.scenario}"


def _cases(suite: Suite, spec: str, scenarios: list[str]) -> list[Case]:
    return [Case(suite.version, spec, scenario) for scenario in scenarios]


# The scenarios run, as the module's tables say.
CASES = [
    *_cases(STABLE, "2025-11-25", [
        "server-initialize", "ping", "tools-list", "tools-call-simple-text", "tools-call-error",
        "tools-call-with-progress", "json-schema-2020-12", "server-sse-polling", "server-sse-multiple-streams",
        "dns-rebinding-protection",
    ]),
    *_cases(NEXT, "2026-07-28", [
        "tools-list", "tools-call-simple-text", "tools-call-error", "tools-call-with-progress",
        "server-sse-multiple-streams", "dns-rebinding-protection", "json-schema-2020-12", "server-stateless",
        "caching", "http-header-validation", "http-custom-header-server-validation",
        "input-required-result-unsupported-methods",
        "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields", "tasks-request-state-removal",
        "tasks-request-headers", "tasks-dispatch-and-envelope", "tasks-required-task-error",
    ]),
    *_cases(NEXT, "2025-11-25", ["server-session-lifecycle"]),
]
# The scenarios not run, each suite's: they do not apply, or not yet (the tables say why).
NOT_RUN = {
    STABLE.version: [
        "logging-set-level", "completion-complete", "tools-call-image", "tools-call-audio",
        "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging", "tools-call-sampling",
        "tools-call-elicitation", "elicitation-sep1034-defaults", "elicitation-sep1330-enums", "resources-list",
        "resources-read-text", "resources-read-binary", "resources-templates-read", "resources-subscribe",
        "resources-unsubscribe", "prompts-list", "prompts-get-simple", "prompts-get-with-args",
        "prompts-get-embedded-resource", "prompts-get-with-image",
    ],
    NEXT.version: [
        # Applies to the handshake versions only, where 0.1.16 runs it.
        "server-initialize", "ping", "server-sse-polling",
        # The tasks extension: notifications/tasks is SKIPPED by this alpha (its harness awaits
        # subscriptions/listen, which /mcp does not serve); the MRTR ones need tools that ask
        # the client for input.
        "tasks-status-notifications", "tasks-mrtr-input", "tasks-mrtr-composition",
        # Does not apply.
        "logging-set-level", "completion-complete", "tools-call-image", "tools-call-audio",
        "tools-call-embedded-resource", "tools-call-mixed-content", "tools-call-with-logging", "tools-call-sampling",
        "tools-call-elicitation", "elicitation-sep1034-defaults", "elicitation-sep1330-enums", "resources-list",
        "resources-read-text", "resources-read-binary", "resources-templates-read", "resources-subscribe",
        "resources-unsubscribe", "prompts-list", "prompts-get-simple", "prompts-get-with-args",
        "prompts-get-embedded-resource", "prompts-get-with-image", "sep-2164-resource-not-found",
        "sep-2640-skills-directory", "sep-2640-skills-enumeration", "sep-2640-skills-manifest",
        "input-required-result-basic-elicitation", "input-required-result-basic-sampling",
        "input-required-result-basic-list-roots", "input-required-result-request-state",
        "input-required-result-multiple-input-requests", "input-required-result-multi-round",
        "input-required-result-missing-input-response", "input-required-result-non-tool-request",
        "input-required-result-result-type", "input-required-result-tampered-state",
        "input-required-result-capability-check", "input-required-result-ignore-extra-params",
        "input-required-result-validate-input",
    ],
}

# The json-schema-2020-12 check wants the $schema a tool's author wrote kept in inputSchema.
# Carmy's schemas are generated from the tool's types and name no dialect: one without $schema
# is 2020-12 (SEP-1613), which is what the API validates against.
_NO_SCHEMA_DIALECT = {"json-schema-2020-12-$schema": "FAILURE"}
# The tool the server-stateless scenario calls to see a -32021 (MissingRequiredClientCapability)
# needs the client's sampling, and the one whose response stream it inspects needs its
# elicitation: a Carmy tool can use neither, so these are "not testable" (FAILURE).
_NEEDS_CLIENT_REQUESTS = {
    "sep-2575-server-rejects-undeclared-capability": "FAILURE",
    "sep-2575-missing-capability-http-400": "FAILURE",
    "sep-2575-http-server-no-independent-requests-on-stream": "FAILURE",
}

# Checks that fail, or warn, because of what Carmy deliberately does; the test fails if they
# stop doing so, so that the entry goes.
WAIVED: dict[Case, dict[str, str]] = {
    Case(STABLE.version, "2025-11-25", "json-schema-2020-12"): _NO_SCHEMA_DIALECT,
    Case(STABLE.version, "2025-11-25", "server-sse-polling"): {
        # /mcp is stateless and keeps no events to resume a stream from (GET /mcp is 405), so
        # it sends no priming event (an id to resume from) and no retry field (SHOULDs).
        "server-sse-priming-event": "WARNING",
        "server-sse-retry-field": "WARNING",
    },
    Case(NEXT.version, "2026-07-28", "json-schema-2020-12"): {
        **_NO_SCHEMA_DIALECT,
        # SEP-2106 lets a schema use allOf/anyOf, if/then/else and $anchor, and the check wants
        # a tool whose schema has them (at its root and in $defs.address). A Carmy tool's
        # schema is what msgspec generates from its input type, which has no such keywords.
        "sep-2106-composition-keywords-preserved": "FAILURE",
        "sep-2106-conditional-keywords-preserved": "FAILURE",
        "sep-2106-anchor-keyword-preserved": "FAILURE",
    },
    Case(NEXT.version, "2026-07-28", "server-stateless"): _NEEDS_CLIENT_REQUESTS,
    Case(NEXT.version, "2026-07-28", "tasks-lifecycle"): {
        # The check wants a tool crash to end its task ``failed`` with a JSON-RPC error. Once an
        # execution exists, Carmy reports every outcome as a tool result the model can read (a
        # crash is TOOL_PANIC): the task ends ``completed`` with isError. ``failed`` is for
        # JSON-RPC errors only, and a call that would be one is refused before it is a task.
        "sep-2663-tasks-get-status-failed": "FAILURE",
    },
    Case(NEXT.version, "2026-07-28", "tasks-request-headers"): {
        # The check wants greet's text to be the bare string; Carmy's text is the result as
        # JSON, quotes included (what structuredContent holds, for a client that parses it).
        "tasks-headers-tolerate-mcp-method-on-tools-call": "FAILURE",
    },
    Case(NEXT.version, "2026-07-28", "tasks-dispatch-and-envelope"): {
        # One of its calls is to confirm_delete, a tool that asks the client for input
        # (tasks-mrtr-input), which a Carmy tool cannot do; the check fails on that call alone.
        "tasks-result-type-complete-on-non-task-responses": "FAILURE",
    },
    Case(NEXT.version, "2026-07-28", "tasks-required-task-error"): {
        # The check wants a tool that can only run as a task (taskSupport "required"), refused
        # with -32021 to a client without the extension. No Carmy tool needs one: any call can
        # be followed inline to its end, so such a client gets its result, later.
        "sep-2663-server-returns-missing-capability-when-required": "FAILURE",
    },
    Case(NEXT.version, "2026-07-28", "caching"): {
        # Carmy has no prompts and no resources: these lists are -32601 (Method not found), so
        # they carry no caching hints. (resources/read is SKIPPED by the suite then.)
        "sep-2549-prompts-list-caching-hints": "FAILURE",
        "sep-2549-resources-list-caching-hints": "FAILURE",
        "sep-2549-resources-templates-list-caching-hints": "FAILURE",
    },
}

pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT_S + 90)  # the first test may install the suite


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
    # tasks-*: a call of a second or more (slow_compute, failing_job) becomes a task; an instant
    # one (greet) answers inline, with room to spare on a busy machine.
    with serving(create_app(app_settings(stack.redis_url, mcp_task_after=0.8))) as base:
        yield base + "/mcp"


@pytest.fixture(scope="module")
def runs(node_modules: Path, url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Each case's run (by ``Case.id``), and each suite's list of scenarios (``list <version>``).
    The cases of a suite at a spec version share one run of the suite."""
    node = str(node_modules / ".bin" / "node")
    out = tmp_path_factory.mktemp("conformance")

    def cli(version: str) -> list[str]:
        return [node, str(node_modules / SUITES[version].package / "dist" / "index.js")]

    commands: dict[str, list[str]] = {}
    for version, spec in sorted({(case.suite, case.spec) for case in CASES}):
        commands[f"{version}:{spec}"] = [*cli(version), "server", "--url", url, *SUITES[version].selection(spec),
                                         "-o", str(out / f"{version}_{spec}")]
    for version in SUITES:
        commands[f"list {version}"] = [*cli(version), "list", "--server"]

    with ThreadPoolExecutor(max_workers=min(len(commands), os.cpu_count() or 1)) as pool:
        done = dict(zip(commands, pool.map(lambda name: _run(commands[name], out), commands), strict=True))
    found = {name: run for name, run in done.items() if name.startswith("list ")}
    for case in CASES:
        suite_run = done[f"{case.suite}:{case.spec}"]
        found[case.id] = Run(suite_run.command, suite_run.returncode, suite_run.output,
                             _checks(out / f"{case.suite}_{case.spec}", case.scenario))
    return found


def _run(args: list[str], cwd: Path) -> Run:
    """The suite's CLI, with ``args``; its exit code says whether any check of any scenario
    failed, those that do not apply too, so only the output is kept from it."""
    shown = " ".join(args[2:])
    try:
        done = subprocess.run(args, cwd=cwd, env={**os.environ, "NO_COLOR": "1"}, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S, check=False)
        return Run(shown, done.returncode, done.stdout + done.stderr)
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return Run(shown, None, f"{output}\n[killed: still running after {RUN_TIMEOUT_S:g} s]")


def _checks(out: Path, scenario: str) -> list[dict[str, Any]]:
    """A scenario's checks in a run's output: ``server-<scenario>-<time>/checks.json``."""
    named = re.compile(rf"server-{re.escape(scenario)}-\d{{4}}-\d\d-\d\dT.*")
    for path in out.glob("*/checks.json"):
        if named.fullmatch(path.parent.name):
            return cast("list[dict[str, Any]]", json.loads(path.read_text()))
    return []


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_scenario(runs: dict[str, Run], case: Case) -> None:
    run = runs[case.id]
    assert run.checks, run.describe()
    waived = WAIVED.get(case, {})
    unexpected = [c for c in run.checks
                  if c["status"] in ("FAILURE", "WARNING") and waived.get(c["id"]) != c["status"]]
    assert not unexpected, f"{case.id}: {len(unexpected)} check(s) not passed\n{run.describe()}"
    seen = {(c["id"], c["status"]) for c in run.checks}
    stale = {check: status for check, status in waived.items() if (check, status) not in seen}
    assert not stale, f"{case.id}: waived checks no longer {stale}: drop them from WAIVED\n{run.describe()}"


@pytest.mark.parametrize("version", SUITES)
def test_every_scenario_is_classified(runs: dict[str, Run], node_modules: Path, version: str) -> None:
    """A new version of the suite brings new scenarios: each needs a place in the tables (and
    the pin in package.json, the version here)."""
    installed = json.loads((node_modules / SUITES[version].package / "package.json").read_text())["version"]
    assert installed == version, f"package.json pins {installed}; the tables here are for {version}"
    listed = runs[f"list {version}"]
    assert listed.returncode == 0, listed.describe()
    server = listed.output.split("Server scenarios", 1)[-1]
    names = set(re.findall(r"^\s*- (\S+)", server, re.MULTILINE))
    run = {case.scenario for case in CASES if case.suite == version}
    assert not run & set(NOT_RUN[version]), f"{version}: both run and not: {sorted(run & set(NOT_RUN[version]))}"
    classified = run | set(NOT_RUN[version])
    assert names == classified, (f"{version}: not classified: {sorted(names - classified)}; "
                                 f"no longer in the suite: {sorted(classified - names)}")


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[-3000:]
