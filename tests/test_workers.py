"""``historygraph serve --workers N`` on Linux: one ``SO_REUSEPORT`` socket per worker
(:mod:`historygraph.server.workers`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from historygraph.server import workers

SRC = str(Path(__file__).resolve().parents[1] / "src")
pytestmark = pytest.mark.skipif(not workers.REUSE_PORT, reason="SO_REUSEPORT load balancing is Linux's")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_taken_port_fails_before_any_worker_starts():
    with socket.socket() as taken:  # an ordinary listening socket, without SO_REUSEPORT
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        t0 = time.monotonic()
        with pytest.raises(OSError):
            workers.run_workers("historygraph.server.app:create_app_from_env", 2, "127.0.0.1", taken.getsockname()[1])
        assert time.monotonic() - t0 < 5


def test_a_worker_that_cannot_start_stops_the_supervisor_with_its_status():
    # the app import string names no module: each worker exits during startup; the supervisor does
    # not restart it forever but returns the worker's exit status (uvicorn exits 1 here)
    t0 = time.monotonic()
    status = workers.run_workers("historygraph_no_such_module:app", 2, "127.0.0.1", _port())
    assert status != 0
    assert time.monotonic() - t0 < 60


@pytest.mark.slow
def test_a_burst_of_keep_alive_connections_is_spread_over_the_workers(tmp_path):
    """40 connections opened at once, as 40 agents starting together: with one shared socket the
    first worker to wake took most of such a burst (40/10 of 50 measured, bench/RESULTS.md); with a
    socket per worker each connection goes to a worker by the kernel's hash of its addresses, so
    each of 2 workers holds about 20 (binomial(40, 1/2): fewer than 8 on one has probability
    below 1e-4)."""
    import psutil

    port = _port()
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = tmp_path / "w.log"
    px = subprocess.Popen([sys.executable, "-m", "historygraph", "serve", "--upstream", "http://127.0.0.1:9/v1",
                           "--port", str(port), "--store", str(tmp_path / "w.sqlite"), "--policy", "prune",
                           "--workers", "2"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    conns: list[socket.socket] = []
    try:
        def children() -> list[psutil.Process]:
            return [c for c in psutil.Process(px.pid).children() if "spawn_main" in " ".join(c.cmdline())]

        deadline = time.time() + 60
        while time.time() < deadline:  # both workers answering
            try:
                if len(children()) == 2 and all(httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1).status_code == 200
                                                for _ in range(4)):
                    time.sleep(2)
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert px.poll() is None, log.read_text()
        for _ in range(40):
            conns.append(socket.create_connection(("127.0.0.1", port)))
        time.sleep(1)
        held = [sum(1 for k in c.net_connections("tcp") if k.status == psutil.CONN_ESTABLISHED and k.laddr.port == port)
                for c in children()]
        assert sum(held) == 40 and min(held) >= 8, held
    finally:
        for c in conns:
            c.close()
        px.terminate()
        px.wait(30)
    assert px.returncode == 0, log.read_text()
