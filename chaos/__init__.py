"""The chaos check (``bin/chaos``): real API, worker and Redis processes under concurrent load
with retries and a seeded fault injector, then a reconciliation of what the callers were told
against a ledger of side effects the tools kept outside Redis.

* ``model``: the records every part exchanges (attempts, requests, faults, ledger lines);
* ``ledger``: the append-only side-effect files the tools write and the checker reads;
* ``tools``: the tool module the workers serve;
* ``cluster``: the processes, with the signals the faults send them;
* ``faults``: the seeded schedule and the injector that plays it;
* ``calls`` and ``load``: one attempt of a call, and the clients that retry until answered;
* ``facts`` and ``reconcile``: the ledger and fault log indexed, and pure functions from what
  was recorded to the verdicts of the table;
* ``report``: the table, as text and JSON; ``run``: the command line.
"""
