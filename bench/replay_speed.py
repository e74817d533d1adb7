"""Render speed per policy on real traces: invocations per second and ms per render (p50, p95).

Usage: python bench/replay_speed.py [TRACE_PATH] [--budget 6000] [--policy NAME ...]
Prints one line per policy. Embeddings are cached in an in-memory store, so the first policy
that embeds pays for embedding; run ContextRender twice to see the warm figure.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from pathlib import Path

from historygraph.eval.replay import replay_trace
from historygraph.traces import read_traces
from historygraph.policies import Signals, create
from historygraph.store import MemoryStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path", nargs="?", default=str(Path(__file__).resolve().parents[1].parent / "shared/traces/mini-swe-agent-deepseek"))
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--policy", action="append", default=None)
    args = ap.parse_args()
    names = args.policy or ["full", "prune", "contextrender", "contextrender"]
    traces = list(read_traces(args.path))
    store = MemoryStore()
    signals = Signals(store=store)
    print(f"{len(traces)} traces from {args.path}, B = {args.budget}")
    for name in names:
        policy = create(name)
        t0 = time.perf_counter()
        times: list[float] = []
        for tr in traces:
            times += replay_trace(tr, {name: policy}, args.budget, signals).stats[name].render_seconds
        wall = time.perf_counter() - t0
        ms = sorted(t * 1000 for t in times)
        p95 = ms[int(0.95 * (len(ms) - 1))] if ms else 0.0
        print(f"{name:24s} renders={len(ms):6d}  {len(ms) / wall:8.1f} renders/s (incl. replay)  "
              f"p50={statistics.median(ms) if ms else 0:7.2f} ms  p95={p95:7.2f} ms  wall={wall:6.1f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
