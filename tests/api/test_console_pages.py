"""The console's Executions and Jobs pages (``api/console/pages/executions.py``, ``execution.py``,
``jobs.py``, ``jobactions.py``), against the app in process, a real Redis, a worker of
``tests.toolsets.basic`` and one of ``tests.toolsets.scheduled`` (for a schedule to show).

Calls and jobs are made over ``/agent/*`` with an agent's key, as an agent would; the pages are
read by a client signed in with the operator's.
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from api.app import create_app
from api.console.pages import executions, jobs
from api.settings import ApiKey, ApiSettings
from carmy_worker.store import keys
from carmy_worker.store.audit import MIN_CHUNK, SCAN_AT_MOST, AuditTrail, trail_id
from tests.api.test_console import InlineFinder, csrf_of
from tests.conftest import asgi_client
from tests.support import Proc, Stack, app_settings

OPERATOR_KEY = "operator-key-0123456789"
AGENT_KEY = "agent-key-0123456789abc"
AGENT = {"authorization": f"Bearer {AGENT_KEY}"}
ORIGIN = {"origin": "http://localhost"}  # the ASGI client's own (its Host is localhost)
PAGE = {"accept": "text/html,application/xhtml+xml"}  # what a browser's navigation asks for
MARKER = "marker-3f9c1a-never-shown"  # in arguments (and so in outputs): must be on no page
UNKNOWN_EXEC = "exec_00000000-0000-4000-8000-000000000000"
UNKNOWN_JOB = "job_00000000-0000-4000-8000-000000000000"


def console_settings(redis_url: str) -> ApiSettings:
    """The console on, an operator's key and an agent's (the console's other tests' too)."""
    return app_settings(redis_url, console=True, console_secret="s" * 40, api_keys={
        OPERATOR_KEY: ApiKey(principal="olga", permissions=frozenset({"carmy:operator"})),
        AGENT_KEY: ApiKey(principal="agent"),
    })


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    return console_settings(stack.redis_url)


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Proc:
    """The basic tools' worker, and one that declares a schedule."""
    stack.worker("tests.toolsets.scheduled")
    return stack.worker()


@pytest.fixture
async def operator(client: httpx.AsyncClient, asgi_app: object) -> AsyncIterator[httpx.AsyncClient]:
    """A client of its own, signed in as the operator."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="http://localhost") as c:
        form = await c.get("/console/sign-in", headers=PAGE)
        signed = await c.post("/console/sign-in", data={"csrf": csrf_of(form.text), "token": OPERATOR_KEY},
                              headers=ORIGIN)
        assert signed.status_code == 303, signed.text
        yield c


async def call(client: httpx.AsyncClient, tool: str, arguments: dict[str, Any] | None = None,
               request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"tool": tool, "arguments": arguments or {}}
    if request_id is not None:
        body["request_id"] = request_id
    answer = await client.post("/agent/execute", json=body, headers=AGENT)
    assert answer.status_code in (200, 409, 422, 500, 503, 400), answer.text
    result: dict[str, Any] = answer.json()
    return result


async def new_job(client: httpx.AsyncClient, tool: str, arguments: dict[str, Any] | None = None,
                  **fields: Any) -> str:
    answer = await client.post("/agent/jobs", json={"tool": tool, "arguments": arguments or {}, **fields},
                               headers=AGENT)
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["job_id"]
    return job_id


async def job_of(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    answer = await client.get(f"/agent/jobs/{job_id}", headers=AGENT)
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()
    return job


async def until_status(client: httpx.AsyncClient, job_id: str, status: str) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def check() -> bool:
        found.update(await job_of(client, job_id))
        return found["status"] == status

    deadline = time.monotonic() + 20
    while not await check():
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.05)
    return found


def rows(page: str) -> list[str]:
    """The executions table's rows (each as its HTML)."""
    body = page[page.index('<tbody id="executions-rows">'):]
    return re.findall(r"<tr>.*?</tr>", body[:body.index("</tbody>")], re.S)


# -- the list ------------------------------------------------------------------------------------

async def test_the_list_shows_each_call_and_filters_by_tool_status_and_principal(
        client: httpx.AsyncClient, operator: httpx.AsyncClient) -> None:
    await call(client, "echo", {"text": MARKER})
    failed = await call(client, "refuse")
    assert failed["status"] == "failed"
    page = (await operator.get("/console/executions", headers=PAGE)).text
    newest = rows(page)[0]
    assert f'href="/console/executions/{failed["execution_id"]}?at=' in newest
    assert "<code>refuse</code>" in newest and "status-failed" in newest and "OUT_OF_STOCK" in newest
    assert "<td>agent</td>" in newest and "<td>http</td>" in newest
    assert '<option value="echo">' in page  # the tool filter lists the catalog
    assert MARKER not in page

    by_tool = rows((await operator.get("/console/executions?tool=echo", headers=PAGE)).text)
    assert by_tool and all("<code>echo</code>" in row for row in by_tool)
    by_status = rows((await operator.get("/console/executions?status=failed", headers=PAGE)).text)
    assert by_status and all("status-failed" in row for row in by_status)
    assert not rows((await operator.get("/console/executions?principal=nobody", headers=PAGE)).text)
    assert rows((await operator.get("/console/executions?principal=agent", headers=PAGE)).text)
    # A wrong status or cursor is dropped, not an error.
    assert (await operator.get("/console/executions?status=bogus&cursor=x", headers=PAGE)).status_code == 200


async def test_the_list_pages_older_entries_with_the_cursor(client: httpx.AsyncClient,
                                                            operator: httpx.AsyncClient) -> None:
    ids = [(await call(client, "words", {"text": "a b"}))["execution_id"] for _ in range(55)]
    first = (await operator.get("/console/executions?tool=words", headers=PAGE)).text
    assert len(rows(first)) == 50
    older = re.search(r'<a href="([^"]+)" rel="next">Older</a>', first)
    assert older, "no older link"
    second = (await operator.get(older.group(1).replace("&amp;", "&"), headers=PAGE)).text
    assert "tool=words" in older.group(1)
    assert len(rows(second)) == 5
    shown = re.findall(r"/console/executions/(exec_[0-9a-f-]+)\?at=", first + second)
    assert shown == ids[::-1]
    assert 'rel="next"' not in second
    assert "Newest</a>" in second


async def test_a_rare_match_comes_back_short_and_says_to_look_further(
        client: httpx.AsyncClient, operator: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    rare = await call(client, "echo", {"text": "rare"})
    for _ in range(12):
        await call(client, "noop")
    monkeypatch.setattr(executions, "SCAN_AT_MOST", 10)
    page = (await operator.get("/console/executions?tool=echo", headers=PAGE)).text
    assert rows(page) == []
    assert "Only the 10 entries before this point were searched" in page
    further = re.search(r'href="([^"]+)">Look further</a>', page)
    assert further
    page = (await operator.get(further.group(1).replace("&amp;", "&"), headers=PAGE)).text
    assert rare["execution_id"] in page


async def test_the_rows_alone_for_the_refresh(client: httpx.AsyncClient, operator: httpx.AsyncClient,
                                              asgi_app: object) -> None:
    # Filtered by tool too: the module's schedule completes a tick every second, which could
    # otherwise finish between the call and the read and take the first row.
    page = (await operator.get("/console/executions?status=completed&tool=noop", headers=PAGE)).text
    live = re.search(r'data-live="([^"]*)"', page)
    assert live is not None and live.group(1).startswith("/console/executions/rows?")
    assert "status=completed" in live.group(1) and "tool=noop" in live.group(1)
    assert "executions.js" in page
    fresh = await call(client, "noop")
    body = await operator.get(html.unescape(live.group(1)))
    assert body.status_code == 200
    assert body.text.lstrip().startswith('<tbody id="executions-rows">')
    assert fresh["execution_id"] in rows(body.text)[0]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi_app),  # type: ignore[arg-type]
                                 base_url="http://localhost") as stranger:
        assert (await stranger.get("/console/executions/rows")).status_code == 401
    # An older page does not refresh: it would not change.
    older = (await operator.get("/console/executions?cursor=1-0", headers=PAGE)).text
    assert 'data-live=""' in older


# -- one execution ---------------------------------------------------------------------------------

async def test_an_execution_shows_its_error_with_details_and_its_replays(client: httpx.AsyncClient,
                                                                         operator: httpx.AsyncClient) -> None:
    first = await call(client, "refuse", request_id="console-refuse-1")
    again = await call(client, "refuse", request_id="console-refuse-1")
    assert again["execution_id"] == first["execution_id"]
    page = (await operator.get(f"/console/executions/{first['execution_id']}", headers=PAGE)).text
    assert "OUT_OF_STOCK" in page and "Nothing left." in page
    assert "&#34;sku&#34;: &#34;KB-01&#34;" in page  # the details, pretty-printed and escaped
    assert "console-refuse-1" in page  # its request id
    assert "Queued" in page and "Started" in page and "Finished" in page
    assert page.count(">replayed</span>") == 1
    assert "1 replays" in page
    assert re.search(r"<dt>Worker</dt><dd><code>[^<]+</code>", page), "no worker named"


async def test_an_execution_page_never_shows_its_arguments_or_output(client: httpx.AsyncClient,
                                                                     operator: httpx.AsyncClient) -> None:
    done = await call(client, "echo", {"text": MARKER})
    assert done["status"] == "completed"
    page = await operator.get(f"/console/executions/{done['execution_id']}", headers=PAGE)
    assert page.status_code == 200
    assert MARKER not in page.text
    assert "Completed, with" in page.text and "of data" in page.text
    progressed = await call(client, "progress", {"n": 3})
    page = await operator.get(f"/console/executions/{progressed['execution_id']}", headers=PAGE)
    assert "<strong>Progress</strong> <span class=\"note\">step 3</span>" in page.text


@pytest.mark.parametrize("exec_id", [UNKNOWN_EXEC, "exec_nope", "rows-not", "job_00000000-0000-4000-8000-000000000000"])
async def test_an_unknown_or_malformed_execution_is_a_404_page(operator: httpx.AsyncClient, exec_id: str) -> None:
    page = await operator.get(f"/console/executions/{exec_id}", headers=PAGE)
    assert page.status_code == 404
    assert "No such execution" in page.text
    if exec_id == UNKNOWN_EXEC:
        assert "expired" in page.text and "CARMY_RETENTION" in page.text
    else:
        assert "not an execution id" in page.text


async def test_an_expired_execution_is_shown_from_its_audit_entry(client: httpx.AsyncClient,
                                                                  operator: httpx.AsyncClient, stack: Stack) -> None:
    done = await call(client, "noop")
    listed = (await operator.get("/console/executions?tool=noop", headers=PAGE)).text
    link = re.search(rf'href="(/console/executions/{done["execution_id"]}\?at=[0-9-]+)"', listed)
    assert link
    async with Redis.from_url(stack.redis_url) as redis:
        await redis.delete(keys.execution(done["execution_id"]), keys.record(done["execution_id"]))
    page = await operator.get(link.group(1), headers=PAGE)
    assert page.status_code == 200
    assert "have expired" in page.text and "<code>noop</code>" in page.text
    assert (await operator.get(f"/console/executions/{done['execution_id']}?at=9999999999999-0",
                               headers=PAGE)).status_code == 404
    # A link to a replay's entry, the execution's own entry being older than it: still its page.
    first = await call(client, "noop", request_id="console-expired-replay")
    await call(client, "noop", request_id="console-expired-replay")
    listed = (await operator.get("/console/executions?tool=noop", headers=PAGE)).text
    replay = re.search(rf'href="/console/executions/{first["execution_id"]}\?at=([0-9-]+)"', listed)
    assert replay
    async with Redis.from_url(stack.redis_url) as redis:
        await redis.delete(keys.execution(first["execution_id"]), keys.record(first["execution_id"]))
        partition = keys.partition_of(first["execution_id"])
        # The execution's newest entry (its replay's), not the partition's: the schedule's
        # occurrences, every second, add theirs to the same trail meanwhile.
        newest = next(trail_id(entry_id, partition)
                      for entry_id, fields in await redis.xrevrange(keys.audit(partition), count=100)
                      if fields[b"execution_id"] == first["execution_id"].encode())
    assert replay.group(1) == newest
    page = await operator.get(f"/console/executions/{first['execution_id']}?at={int(newest.split('-')[0]) + 1}-0",
                              headers=PAGE)
    assert page.status_code == 404  # nothing of it at or after that point
    page = await operator.get(f"/console/executions/{first['execution_id']}?at={newest}", headers=PAGE)
    assert page.status_code == 200 and ">replayed</span>" in page.text and "<code>noop</code>" in page.text


# -- jobs ------------------------------------------------------------------------------------------

async def test_the_jobs_list_by_status_and_the_schedules(client: httpx.AsyncClient,
                                                         operator: httpx.AsyncClient) -> None:
    later = await new_job(client, "noop", delay_ms=600_000)
    dead = await new_job(client, "refuse", max_attempts=1)
    await until_status(client, dead, "dead_lettered")
    scheduled = (await operator.get("/console/jobs?status=scheduled", headers=PAGE)).text
    assert later[:12] in scheduled and dead[:12] not in scheduled
    assert later[:12] not in (await operator.get("/console/jobs?status=queued", headers=PAGE)).text
    dead_page = (await operator.get("/console/jobs?status=dead_lettered", headers=PAGE)).text
    assert dead[:12] in dead_page and later[:12] not in dead_page
    assert "<code>OUT_OF_STOCK</code>" in dead_page  # its last error
    everything = (await operator.get("/console/jobs?status=all", headers=PAGE)).text
    assert later[:12] in everything and dead[:12] in everything
    schedules = everything[everything.index('id="schedules"'):]
    assert "every-second" in schedules and "<code>* * * * * *</code>" in schedules and "<code>tick</code>" in schedules
    # Once a worker has taken it up and it has fired: its next occurrence, and its last job's link.
    deadline = time.monotonic() + 10
    while "not taken up yet" in schedules or 'href="/console/jobs/job_' not in schedules:
        assert time.monotonic() < deadline, schedules
        await asyncio.sleep(0.2)
        page = (await operator.get("/console/jobs?status=all", headers=PAGE)).text
        schedules = page[page.index('id="schedules"'):]


async def test_a_list_cut_at_its_size_says_so(client: httpx.AsyncClient, operator: httpx.AsyncClient,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(2):
        await new_job(client, "noop", delay_ms=600_000)
    monkeypatch.setattr(jobs, "LIST_SIZE", 2)
    due_now = (await operator.get("/console/jobs?status=queued", headers=PAGE)).text
    assert "Queued: 0 jobs" in due_now and "(among the newest 2 queued jobs only)" in due_now


async def test_the_list_pages_to_older_jobs_each_once(client: httpx.AsyncClient, operator: httpx.AsyncClient,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    made = [await new_job(client, "noop", delay_ms=600_000) for _ in range(5)]
    monkeypatch.setattr(jobs, "LIST_SIZE", 2)
    shown: list[str] = []
    url: str | None = "/console/jobs?status=scheduled"
    while url is not None and len(shown) < len(made):
        page = (await operator.get(url, headers=PAGE)).text
        shown += [job_id for job_id in re.findall(r'href="/console/jobs/(job_[0-9a-f-]+)"', page) if job_id in made]
        older = re.search(r'href="([^"]+)" rel="next">Older', page)
        url = None if older is None else html.unescape(older.group(1))
    assert shown == made[::-1]  # newest first, each once, over three pages


async def test_a_job_page_shows_its_executions_last_error_and_buttons(client: httpx.AsyncClient,
                                                                      operator: httpx.AsyncClient) -> None:
    dead = await new_job(client, "refuse", max_attempts=1)
    job = await until_status(client, dead, "dead_lettered")
    page = (await operator.get(f"/console/jobs/{dead}", headers=PAGE)).text
    assert f'href="/console/executions/{job["executions"][0]}"' in page
    assert "OUT_OF_STOCK" in page and "&#34;sku&#34;" in page
    assert f'href="/console/jobs/{dead}/retry"' in page
    assert f'href="/console/jobs/{dead}/cancel"' not in page  # finished: nothing to cancel
    for job_id in (UNKNOWN_JOB, "job_nope"):
        missing = await operator.get(f"/console/jobs/{job_id}", headers=PAGE)
        assert missing.status_code == 404 and "No such job" in missing.text


async def test_retry_needs_a_post_with_its_csrf_token_from_this_origin(client: httpx.AsyncClient,
                                                                        operator: httpx.AsyncClient) -> None:
    dead = await new_job(client, "refuse", max_attempts=1)
    await until_status(client, dead, "dead_lettered")
    confirm = await operator.get(f"/console/jobs/{dead}/retry", headers=PAGE)
    assert confirm.status_code == 200
    assert f'<form method="post" action="/console/jobs/{dead}/retry"' in confirm.text
    token = csrf_of(confirm.text)
    for form, headers in (({}, ORIGIN), ({"csrf": "wrong"}, ORIGIN), ({"csrf": token}, {}),
                          ({"csrf": token}, {"origin": "https://evil.example"})):
        refused = await operator.post(f"/console/jobs/{dead}/retry", data=form, headers=headers)
        assert refused.status_code == 403, (form, headers)
        job = await job_of(client, dead)
        assert (job["status"], job["attempts"]) == ("dead_lettered", 1)
    done = await operator.post(f"/console/jobs/{dead}/retry", data={"csrf": token}, headers=ORIGIN)
    assert done.status_code == 303
    assert done.headers["location"] == f"/console/jobs/{dead}?done=retried"
    assert (await job_of(client, dead))["status"] in ("queued", "running")
    page = (await operator.get(done.headers["location"], headers=PAGE)).text
    assert "Retried: the job is queued again" in page
    job = await until_status(client, dead, "dead_lettered")  # refuse fails again: one more attempt
    assert job["attempts"] == 2
    # A job that cannot be retried is told so, and left as it is.
    again = await operator.post(f"/console/jobs/{UNKNOWN_JOB}/retry", data={"csrf": token}, headers=ORIGIN)
    assert again.status_code == 404


async def test_cancel_by_the_button(client: httpx.AsyncClient, operator: httpx.AsyncClient) -> None:
    later = await new_job(client, "noop", delay_ms=600_000)
    page = (await operator.get(f"/console/jobs/{later}", headers=PAGE)).text
    assert f'href="/console/jobs/{later}/cancel"' in page and f"/console/jobs/{later}/retry" not in page
    confirm = await operator.get(f"/console/jobs/{later}/cancel", headers=PAGE)
    assert "It never runs" in confirm.text
    refused = await operator.post(f"/console/jobs/{later}/cancel", data={"csrf": csrf_of(confirm.text)},
                                  headers={"origin": "http://localhost:9999"})
    assert refused.status_code == 403
    assert (await job_of(client, later))["status"] == "queued"
    done = await operator.post(f"/console/jobs/{later}/cancel", data={"csrf": csrf_of(confirm.text)},
                               headers=ORIGIN)
    assert done.status_code == 303
    assert done.headers["location"] == f"/console/jobs/{later}?done=cancelled"
    assert (await job_of(client, later))["status"] == "cancelled"
    # Retrying it is refused, with what came of it on the job's page.
    retry = await operator.post(f"/console/jobs/{later}/retry", data={"csrf": csrf_of(confirm.text)}, headers=ORIGIN)
    assert retry.headers["location"] == f"/console/jobs/{later}?done=not_retryable"
    # A crafted link cannot put its own words on the page.
    crafted = await operator.get(f"/console/jobs/{later}?done=<b>call+us</b>&refused=<i>x</i>", headers=PAGE)
    assert "call us" not in crafted.text and "<i>x</i>" not in crafted.text
    # Nor a word of its own dressed as a refusal: only the codes an action can be refused with.
    worded = await operator.get(f"/console/jobs/{later}?refused=ACCOUNT_SUSPENDED_CALL_SUPPORT", headers=PAGE)
    assert "ACCOUNT_SUSPENDED" not in worded.text and "Refused:" not in worded.text
    coded = await operator.get(f"/console/jobs/{later}?refused=RATE_LIMITED", headers=PAGE)
    assert "Refused: <code>RATE_LIMITED</code>" in coded.text


async def test_an_open_console_acts_as_an_operator(client: httpx.AsyncClient, stack: Stack) -> None:
    """Without authentication the console is open, as /agent/* is: its buttons work for anyone."""
    dead = await new_job(client, "refuse", max_attempts=1)
    await until_status(client, dead, "dead_lettered")
    async with asgi_client(create_app(app_settings(stack.redis_url, console=True))) as c:
        assert dead[:12] in (await c.get("/console/jobs?status=dead_lettered", headers=PAGE)).text
        confirm = await c.get(f"/console/jobs/{dead}/retry", headers=PAGE)
        done = await c.post(f"/console/jobs/{dead}/retry", data={"csrf": csrf_of(confirm.text)}, headers=ORIGIN)
        assert done.headers["location"] == f"/console/jobs/{dead}?done=retried"


@pytest.mark.slow
async def test_redis_out_of_reach_is_told_on_the_page() -> None:
    async with asgi_client(create_app(app_settings("redis://127.0.0.1:1/0", console=True,
                                                   console_secret="s" * 40))) as c:
        for path in ("/console/executions", f"/console/executions/{UNKNOWN_EXEC}", "/console/jobs",
                     f"/console/jobs/{UNKNOWN_JOB}"):
            page = await c.get(path, headers=PAGE)
            assert page.status_code == 503, path
            assert "cannot reach Redis" in page.text


async def test_a_running_job_is_listed_and_cancelled_by_the_button(client: httpx.AsyncClient,
                                                                    operator: httpx.AsyncClient) -> None:
    running = await new_job(client, "tally", {"name": "console-cancel", "seconds": 5})
    await until_status(client, running, "running")
    assert running[:12] in (await operator.get("/console/jobs?status=running", headers=PAGE)).text
    confirm = await operator.get(f"/console/jobs/{running}/cancel", headers=PAGE)
    assert "Its running attempt's execution is cancelled" in confirm.text
    done = await operator.post(f"/console/jobs/{running}/cancel", data={"csrf": csrf_of(confirm.text)},
                               headers=ORIGIN)
    assert done.headers["location"] in (f"/console/jobs/{running}?done=cancelling",
                                        f"/console/jobs/{running}?done=cancelled")
    await until_status(client, running, "cancelled")


# -- every page ------------------------------------------------------------------------------------

async def test_no_page_has_inline_script_or_style(client: httpx.AsyncClient, operator: httpx.AsyncClient) -> None:
    done = await call(client, "refuse")
    dead = await new_job(client, "refuse", max_attempts=1)
    await until_status(client, dead, "dead_lettered")
    paths = ["/console/executions", "/console/executions?tool=refuse&status=failed&principal=agent",
             f"/console/executions/{done['execution_id']}", f"/console/executions/{UNKNOWN_EXEC}",
             "/console/jobs", "/console/jobs?status=dead_lettered", f"/console/jobs/{dead}",
             f"/console/jobs/{dead}/retry", f"/console/jobs/{dead}/cancel", f"/console/jobs/{UNKNOWN_JOB}"]
    for path in paths:
        page = await operator.get(path, headers=PAGE)
        assert page.status_code in (200, 404), path
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
        finder = InlineFinder()
        finder.feed(page.text)
        assert finder.found == [], path


# -- fast with a long trail (last: it fills the trail) ---------------------------------------------

async def test_the_list_loads_fast_with_10000_entries(client: httpx.AsyncClient, operator: httpx.AsyncClient,
                                                      stack: Stack) -> None:
    now_ms = int(time.time() * 1000)
    async with Redis.from_url(stack.redis_url) as redis:
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(10_000):
                pipe.xadd(keys.audit(i % keys.partition_count()), {
                    "execution_id": f"exec_{i:08d}-0000-4000-8000-000000000000", "request_id": "",
                    "job_id": "", "principal": f"p{i % 50}", "tool": "echo", "effect": "read",
                    "status": "completed", "error_code": "", "duration_ms": 3, "queued_at": now_ms,
                    "started_at": now_ms, "finished_at": now_ms, "replayed": "", "via": "http", "worker": "w"})
            await pipe.execute()
        assert await AuditTrail(redis).length() > 10_000
    # The work a page costs, not its time (a busy machine's, which a timed test would read): the
    # newest page is a read of each partition, and a filter that matches nothing stops at its
    # scan's bound in reads of many entries each, never one command an entry (about 5 ms and
    # 0.1 s on an idle machine; bench/ measures speed).
    partitions = keys.partition_count()
    bounds = {"/console/executions": 2 * partitions,
              "/console/executions?tool=refuse": SCAN_AT_MOST // MIN_CHUNK + 2 * partitions,
              "/console/executions?principal=rare": SCAN_AT_MOST // MIN_CHUNK + 2 * partitions}
    async with Redis.from_url(stack.redis_url) as redis:
        for path, most in bounds.items():
            before = await xrevranges(redis)
            page = await operator.get(path, headers=PAGE)
            assert page.status_code == 200
            reads = await xrevranges(redis) - before
            assert reads <= most, (path, reads)
    assert "Look further" in page.text


async def xrevranges(redis: Redis) -> int:
    """The XREVRANGE commands Redis has run (the audit trail's reads; nothing else sends one)."""
    return int((await redis.info("commandstats")).get("cmdstat_xrevrange", {}).get("calls", 0))
