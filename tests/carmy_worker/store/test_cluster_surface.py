"""redis-py's private cluster surface, pinned: ``store.cluster`` overrides redis-py's retry
tuples, replaces its slot table's class, its table of commands and its nodes' methods, and
``store.shardpubsub`` opens connections the way a node does. A release that changed one of these would turn a rule off
quietly (a write sent twice, a node refusing every command); this fails instead, naming it."""

from __future__ import annotations

import inspect

import redis.cluster as sync_cluster
from redis._parsers.commands import AsyncCommandsParser
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, NodesManager, RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from carmy_worker.store.cluster import (
    REFUSALS,
    StoreCluster,
    StoreCommands,
    StoreNode,
    StoreNodes,
    StorePipeline,
    cluster_target,
)

# Statements of redis-py's source whose meaning our overrides rely on.
STATEMENTS = {
    # StoreCluster.ERRORS_ALLOW_RETRY decides what a command is sent again after.
    RedisCluster.execute_command: ("if retry_attempts > 0 and type(e) in self.__class__.ERRORS_ALLOW_RETRY:",),
    # StoreCluster.aclose, called here mid-command, only marks the table for rebuilding; a node's
    # TimeoutError (replies_within's) is a lost connection's: the node asked last for the next table.
    RedisCluster._execute_command: ("await self.aclose()", "return await target_node.execute_command(*args, **kwargs)",
                                    "except (ConnectionError, TimeoutError):",
                                    "self.nodes_manager.startup_nodes.pop(target_node.name, None)"),
    # StoreCommands is the client's table of commands, which every reload of the slot table asks
    # for (of the table's first primary) while it holds the reload's lock; it asks COMMAND as
    # redis-py does, of one node; an unknown command asks again, COMMAND GETKEYS of that node.
    RedisCluster.__init__: ("self.commands_parser = AsyncCommandsParser()",),
    RedisCluster.initialize: ("async with self._lock:", "await self.commands_parser.initialize(",
                              "self.nodes_manager.default_node"),
    AsyncCommandsParser.initialize: ('commands = await self.node.execute_command("COMMAND")',
                                     "self.commands = {cmd.lower(): command for cmd, command in commands.items()}"),
    AsyncCommandsParser.get_keys: ("await self.initialize()",),
    AsyncCommandsParser._get_moveable_keys: ('await self.node.execute_command("COMMAND GETKEYS", *args)',),
    # StorePipeline.ERRORS_ALLOW_RETRY (none): a pipeline is not sent again.
    ClusterPipeline.execute: ("if type(e) in self.__class__.ERRORS_ALLOW_RETRY:",
                              "for _ in range(self._client.cluster_error_retry_attempts):"),
    # StoreNode's methods are redis-py's, with the connection given back when sending fails.
    ClusterNode.execute_command: ("connection = self.acquire_connection()",
                                  "await connection.send_packed_command(connection.pack_command(*args), False)",
                                  "self._free.append(connection)"),
    ClusterNode.execute_pipeline: ("connection = self.acquire_connection()", "self._free.append(connection)"),
    # StoreNodes.set_nodes keeps the nodes it knows when the table is rebuilt; shardpubsub.refresh
    # orders the seeds, asked in turn, so that the nodes whose connections just ended go last.
    NodesManager.initialize: ("self.set_nodes(self.nodes_cache, tmp_nodes_cache, remove_old=True)",
                              "self.slots_cache = tmp_slots",
                              "for startup_node in self.startup_nodes.values():"),
}

# fanout.reload_on_connections_of_its_own gives the synchronous client's reload seeds with no
# client of their own: it asks each on one it makes (and disconnects only that), and keeps the
# nodes it already knows, with their connections. It asks the seeds in their order, and stops at
# the first whose table covers every slot: the nodes that just failed go last.
SYNC_STATEMENTS = {
    sync_cluster.NodesManager.initialize: ("if startup_node.redis_connection:", "r = self.create_redis_node(",
                                           "r.connection_pool.disconnect()",
                                           "for startup_node in self.startup_nodes.values():",
                                           "fully_covered = self.check_slots_coverage(tmp_slots)"),
    sync_cluster.NodesManager._get_or_create_cluster_node: ("target_node = self.nodes_cache.get(node_name)",),
}

NODES_MANAGER_ATTRIBUTES = ("startup_nodes", "require_full_coverage", "connection_kwargs", "address_remap",
                            "slots_cache", "nodes_cache", "remap_host_port")
CLUSTER_NODE_ATTRIBUTES = ("_free", "_connections", "connection_class", "connection_kwargs", "name", "server_type")


def test_the_statements_the_overrides_rely_on_are_in_redis_py_s_source() -> None:
    missing = {f.__qualname__: [s for s in lines if s not in inspect.getsource(f)] for f, lines in STATEMENTS.items()}
    assert {name: lines for name, lines in missing.items() if lines} == {}


def test_the_statements_the_synchronous_reload_relies_on_are_in_redis_py_s_source() -> None:
    missing = {f.__qualname__: [s for s in lines if s not in inspect.getsource(f)]
               for f, lines in SYNC_STATEMENTS.items()}
    assert {name: lines for name, lines in missing.items() if lines} == {}
    assert list(inspect.signature(sync_cluster.ClusterNode).parameters)[:3] == ["host", "port", "server_type"]


def test_the_overrides_change_only_what_they_mean_to() -> None:
    # redis-py sends a command again after a connection error or a timeout: we do not.
    assert RedisConnectionError in RedisCluster.ERRORS_ALLOW_RETRY and StoreCluster.ERRORS_ALLOW_RETRY == REFUSALS
    assert RedisConnectionError in ClusterPipeline.ERRORS_ALLOW_RETRY and StorePipeline.ERRORS_ALLOW_RETRY == ()
    assert list(inspect.signature(NodesManager.set_nodes).parameters) == ["self", "old", "new", "remove_old"]
    # A node becomes a StoreNode by changing its class: possible only without a __dict__ of its own.
    assert "__slots__" in vars(ClusterNode) and StoreNode.__slots__ == () and StoreNodes.__slots__ == ()


def test_every_attribute_we_use_exists() -> None:
    client = StoreCluster(startup_nodes=[ClusterNode("127.0.0.1", 1)], max_connections=2, wait=1.0)  # type: ignore[abstract]
    manager = client.nodes_manager
    assert isinstance(manager, StoreNodes)
    assert [a for a in NODES_MANAGER_ATTRIBUTES if not hasattr(manager, a)] == []
    node = next(iter(manager.startup_nodes.values()))
    assert type(node) is StoreNode
    assert [a for a in CLUSTER_NODE_ATTRIBUTES if not hasattr(node, a)] == []
    assert client._initialize is True  # connects on first use
    assert isinstance(client.commands_parser, StoreCommands) and client.commands_parser.commands == {}
    assert list(inspect.signature(AsyncCommandsParser.initialize).parameters) == ["self", "node"]


def test_a_cluster_target_takes_no_option_the_client_would_refuse() -> None:
    target = cluster_target("redis://:pw@h:1/0?socket_timeout=2&health_check_interval=5", ("h:7000",))
    assert target.options == {"password": "pw", "socket_timeout": 2.0, "health_check_interval": 5}
