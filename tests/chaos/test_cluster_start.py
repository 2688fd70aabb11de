"""How a chaos run starts its processes: an API whose port is taken before it binds starts on another."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from bench import processes
from chaos.cluster import Cluster


@pytest.mark.slow
def test_an_api_whose_port_was_taken_while_the_workers_started_starts_on_another(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(tmp_path, apis=1, workers=1, fsync="everysec", env=dict(os.environ))
    real_free_port, real_start_worker = processes.free_port, cluster.start_worker
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port: int = taken.getsockname()[1]
        handed = iter([port])

        def start_worker() -> processes.Proc:
            # Once the Redis server and a worker run, the next port handed out is one that
            # something else holds (as a connection's local port would): the first API's.
            proc = real_start_worker()
            monkeypatch.setattr(processes, "free_port", lambda: next(handed, None) or real_free_port())
            return proc

        monkeypatch.setattr(cluster, "start_worker", start_worker)
        try:
            cluster.start()
            assert next(handed, None) is None  # the API was offered the taken port
            assert cluster.ports and port not in cluster.ports
            assert httpx.get(cluster.bases[0] + "/health").status_code == 200
            tried = [log.read_text() for log in tmp_path.glob("api-*.log")]
            assert any("address already in use" in text.lower() for text in tried)  # the first try
        finally:
            cluster.close()
