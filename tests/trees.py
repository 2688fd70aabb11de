"""Large arguments for ``leaf_sum`` (``tests.toolsets.basic``), whose input is a recursive union."""

from __future__ import annotations

from typing import Any


def union_tree(size: int, leaf: Any) -> tuple[dict[str, Any], str]:
    """A balanced tree of ``Branch | Leaf``, grown breadth first until its JSON is about ``size``
    bytes, with ``leaf`` as the value of every leaf; and the path of its first leaf's value, where
    a check that walks it in order first finds a wrong one."""
    root: dict[str, Any] = {"type": "leaf", "value": leaf}
    frontier, nodes = [root], 1
    while nodes * 30 < size:
        node = frontier.pop(0)
        node.clear()
        node.update(type="branch", children=[{"type": "leaf", "value": leaf}, {"type": "leaf", "value": leaf}])
        frontier += node["children"]
        nodes += 2
    path, node = "$.root", root
    while node["type"] == "branch":
        path, node = path + ".children[0]", node["children"][0]
    return root, path + ".value"
