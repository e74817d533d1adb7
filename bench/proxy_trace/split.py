"""Per-worker connections and CPU during one ``bench/proxy_latency.py`` level (issue 13, "Why requests
queue at 50 sessions" in bench/RESULTS.md).

Usage: ``python bench/proxy_trace/split.py [WORKERS=2] [SESSIONS=50] [REQUESTS=20] [serve args...]``.
Prints the level's row as ``proxy_latency.py`` measures it, then each worker process's established
connections to the proxy's port (sampled mid-run) and CPU seconds over the run. ``BENCH=DIR``: the
``bench`` folder whose ``proxy_latency.py`` (and so whose ``src``) to run, e.g. an older worktree's.
Environment switches for the workers (read by ``hook/sitecustomize.py``, put on ``PYTHONPATH`` when
any is set): ``HG_TRACE=DIR`` (per-request stage timestamps, SQLite lock waits and event-loop lag,
one file per worker; read them with ``analyze.py DIR``), ``HG_THREADS=N`` (the request path's thread
pool), ``HG_SWITCH=S`` (``sys.setswitchinterval``), ``HG_REUSEPORT=1`` (each worker of uvicorn's
supervisor rebinds its own ``SO_REUSEPORT`` socket; for code before ``historygraph.server.workers``).
"""
# ruff: noqa: E401, E402, E701, E702  (a diagnostic script, kept compact)
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.environ.get("BENCH", str(HERE.parent)))
import proxy_latency as pl
import psutil

def main():
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    reqs = int(sys.argv[3]) if len(sys.argv) > 3 else 20
    extra = sys.argv[4:]
    tmp = tempfile.mkdtemp(prefix="hg-diag-")
    up, px = pl.free_port(), pl.free_port()
    procs = [pl.start_upstream(up, Path(tmp, "u.log"))]
    if any(os.environ.get(k) for k in ("HG_TRACE", "HG_REUSEPORT", "HG_THREADS", "HG_SWITCH")): os.environ["PYTHONPATH"] = str(HERE / "hook") + os.pathsep + os.environ.get("PYTHONPATH", "")
    procs.append(pl.start(pl.serve_args(up, px, f"{tmp}/b.sqlite", "prune", 6000, workers, extra), px, Path(tmp, "p.log")))
    if workers > 1: time.sleep(5)
    sup = psutil.Process(procs[1].pid)
    stop = False
    samples = []
    def mon():
        while not stop:
            row = {}
            for c in sup.children(recursive=True):
                try:
                    conns = [k for k in c.net_connections("tcp") if k.status == "ESTABLISHED" and k.laddr.port == px]
                    row[c.pid] = (len(conns), c.cpu_times().user + c.cpu_times().system)
                except psutil.Error: pass
            samples.append((time.time(), row)); time.sleep(1)
    t = threading.Thread(target=mon, daemon=True); t.start()
    try:
        print("load", os.getloadavg())
        r = pl.run_level(n, reqs, 333.0, f"http://127.0.0.1:{px}/v1", f"http://127.0.0.1:{up}/v1",
                         cpu=lambda: pl.tree_cpu(procs[1].pid), upstream_cpu=lambda: pl.tree_cpu(procs[0].pid))
        print(f"rps {r['rps']:.1f} cpu {r['cpu_ms']:.2f} client {r['client_cpu_ms']:.2f} fake {r['upstream_cpu_ms']:.2f} "
              f"e2e {statistics.median(r['paced']):.1f}/{pl.pct(r['paced'],.95):.1f} direct {statistics.median(r['direct']):.1f}/{pl.pct(r['direct'],.95):.1f} hdr {statistics.median(r['hdr']):.1f}/{pl.pct(r['hdr'],.95):.1f}")
    finally:
        stop = True; time.sleep(1.1)
        for p in reversed(procs): p.terminate(); p.wait(10)
    # print conn split at a mid sample and cpu per worker over run
    first, last = samples[0][1], samples[-1][1]
    mid = samples[len(samples)//2][1]
    for pid in last:
        print(pid, "conns(mid)", mid.get(pid, (0,0))[0], "cpu", round(last[pid][1] - first.get(pid,(0,0))[1], 2))
    print("load", os.getloadavg())
    print("tmp", tmp)

main()
