"""The imported tool's check (``chaos.imported``) on made-up histories, and its upstream for real:
each row finds what it names, and nothing in a run where every order went out once."""

from __future__ import annotations

import json

import httpx

from chaos.imported import DOCUMENT, Order, Upstream, reconcile_imported
from chaos.model import Answer, Attempt, Request


def request(rid: str, *answers: Answer) -> Request:
    return Request(rid=rid, tool="place_order", args={"ms": 0}, first=1.0, attempts=[
        Attempt(t0=1.0, t1=2.0, mode="json", api="http://api", answer=answer) for answer in answers])


def placed(xid: str, order: int, key: str) -> Answer:
    return Answer(execution_id=xid, status="completed", code=None,
                  data=json.dumps({"key": key, "order": order}, sort_keys=True, separators=(",", ":")))


def failed(xid: str, code: str) -> Answer:
    return Answer(execution_id=xid, status="failed", code=code, data=None)


def test_orders_sent_once_each_pass() -> None:
    requests = [
        request("r1", placed("exec_1", 1, "r1"), placed("exec_1", 1, "r1")),  # answered, then replayed
        request("r2", failed("exec_2", "EXECUTION_UNCERTAIN")),  # its worker killed after sending: it did
        request("r3", failed("exec_3", "EXECUTION_UNCERTAIN")),  # killed before sending: it did not
        request("r4"),  # never answered (its patience ran out): no row but the count
    ]
    table = reconcile_imported(requests, [Order(key="r1", t=1.0, order=1), Order(key="r2", t=1.0, order=2)])
    assert table.violations() == {}
    assert (table.requests, table.sent, table.maybe_sent) == (4, 2, 1)
    assert table.answered == {"completed": 1, "failed EXECUTION_UNCERTAIN": 2}


def test_each_row_names_its_request() -> None:
    requests = [
        request("twice", placed("exec_1", 1, "twice")),
        request("unsent", placed("exec_2", 9, "unsent")),  # no order of that key
        request("other", placed("exec_3", 7, "other")),  # the key's order has another number
        request("flip", placed("exec_4", 4, "flip"), failed("exec_4", "TOOL_PANIC")),
    ]
    orders = [Order(key="twice", t=1.0, order=1), Order(key="twice", t=1.5, order=2),
              Order(key="other", t=1.0, order=3), Order(key="flip", t=1.0, order=4),
              Order(key="stranger", t=1.0, order=5)]
    table = reconcile_imported(requests, orders)
    assert table.sent_twice == ["twice"]
    assert table.unasked == ["stranger"]
    assert table.unfounded == ["other", "unsent"]
    assert table.flipped == ["flip"]
    assert set(table.violations()) == {"imported calls sent twice", "imported calls sent unasked",
                                       "imported calls completed, not sent", "imported calls' answers flipped"}


def test_the_upstream_serves_its_document_and_counts_each_order_by_its_key() -> None:
    upstream = Upstream()
    upstream.start()
    try:
        with httpx.Client(base_url=upstream.url) as client:
            assert client.get("/openapi.json").json() == DOCUMENT
            for key in ("k1", "k1", "k2"):  # it does not honour the key: the check sees every send
                answered = client.post("/orders", params={"ms": 0, "mark": "m"}, headers={"Idempotency-Key": key})
                assert answered.status_code == 201
            assert answered.json() == {"order": 3, "key": "k2"}
        assert [(o.key, o.order) for o in upstream.orders] == [("k1", 1), ("k1", 2), ("k2", 3)]
        assert upstream.worker_args() == ["--openapi", upstream.url + "/openapi.json", "--base-url", upstream.url]
    finally:
        upstream.close()
