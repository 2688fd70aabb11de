"""An execution's state machine in Redis, shared by the API and the workers.

Keys (``keys``, ``jobs``), the Lua scripts that make every transition atomic, each behind one
typed wrapper (``submit``: SUBMIT; ``attempts``: CLAIM, SETTLE; ``verdicts``: CANCEL, REAP,
EXPIRE_UNSTARTED; ``roster``: HEARTBEAT, WORKERS; ``janitor``: JANITOR_SCAN; ``groups``:
FORGET_GROUP; ``progress``: PROGRESS, which keeps a running execution's newest progress message;
``follow``: JOIN), the
one helper every script publishes an execution's events through (``lua.EMIT``), the final
``records``, the ``metrics`` the scripts keep, and the resubscribing ``pubsub`` loop.

An execution lives in a hash (``keys.execution``) with ``attempt``, ``state`` (queued, running,
done), ``worker``, ``cancel``, ``idem``, ``start_by``, and where its events go (``reply``,
``joined``, ``stream``); its outcome is one record
(``keys.record``). Every writer of the record goes through a script here, and each checks, in
one step, that no record exists yet and that it still owns the current attempt. That is what
makes "one final status, written once" hold when arq runs a job twice, when a paused worker
wakes up late, or when a janitor settles an execution whose worker died. The life of an
execution, transition by transition, is drawn in docs/architecture.md.
"""
