"""``python -m tests.chaos.broken_migration ARGS``: ``bin/chaos`` (``chaos.run``, with ARGS) whose
slot migrations are broken on purpose: each drops the slot's keys on the source before moving
it, as a migration that lost its MIGRATEs would. The store's records and idempotency keys of
that partition are gone, so the check must find answers it cannot replay (lost, flipped): the
proof, in ``test_cluster_mode``, that the cluster mode's table can fail.
"""

from __future__ import annotations

from bench.localcluster import ClusterServer, LocalCluster
from chaos.run import main

move_slot = LocalCluster.move_slot


def move_slot_dropping_keys(self: LocalCluster, slot: int, target: ClusterServer, timeout: float = 60.0) -> None:
    with self.owner(slot).check_client() as source:
        while names := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.delete(*names)
    move_slot(self, slot, target, timeout)


if __name__ == "__main__":
    LocalCluster.move_slot = move_slot_dropping_keys  # type: ignore[method-assign]
    raise SystemExit(main())
