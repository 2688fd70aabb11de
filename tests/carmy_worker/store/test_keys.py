"""Execution ids: random version-4 UUIDs, drawn from a block of the system's randomness that a
forked process never shares with its parent."""

from __future__ import annotations

import os
import uuid

from carmy_worker.store import keys


def test_an_execution_id_is_a_random_uuid_as_uuid4_writes_it() -> None:
    ids = [keys.new_execution_id() for _ in range(5000)]  # more than one block of randomness
    assert len(set(ids)) == len(ids)
    for exec_id in ids:
        assert keys.is_execution_id(exec_id)
        parsed = uuid.UUID(exec_id.removeprefix("exec_"))
        assert (str(parsed), parsed.version, parsed.variant) == (exec_id[5:], 4, uuid.RFC_4122)


def test_a_forked_process_draws_ids_of_its_own() -> None:
    keys.new_execution_id()  # the parent holds a block it has not used up
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's half
        os.write(write, " ".join(keys.new_execution_id() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = set(pipe.read().split())
    os.waitpid(child, 0)
    ours = {keys.new_execution_id() for _ in range(10)}
    assert len(theirs) == 10 and not theirs & ours
