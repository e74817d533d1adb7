"""Scale on real Claude Code and Codex sessions: replay time per session, render time per policy,
memory, and the exact bound's solver time per call (issue 47, item 5).

Usage: python bench/sessions_scale.py [SESSIONS_DIR] [--budget 64000] [--largest 3] [--policy NAME ...]

Replays the ``--largest`` sessions of each agent (most tool results first) of SESSIONS_DIR (default
``../shared/sessions`` beside the clone) one policy at a time, each with a fresh in-memory store (so
policies that embed pay for embedding, as a first replay does). Prints, per session and policy: CPU
seconds of the whole replay, render p50 / p95 in ms (wall, per call), and for ``oracle`` the solver's
CPU seconds per call (p50, p95, max) and the calls its time limit stopped; then the peak memory of
the process. CPU time (``time.process_time``) is what to compare on a shared machine.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

from historygraph.eval.replay import replay_trace
from historygraph.policies import Signals, create
from historygraph.store import MemoryStore
from historygraph.traces import list_trace_files, read_traces

DEFAULT = Path(__file__).resolve().parents[1].parent / "shared" / "sessions"
POLICIES = ["full", "prune", "learned", "learned-stable", "contextrender", "oracle"]


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", nargs="?", default=str(DEFAULT))
    ap.add_argument("--budget", type=int, default=64000)
    ap.add_argument("--largest", type=int, default=3, help="sessions per agent folder, most tool results first")
    ap.add_argument("--policy", action="append", default=None)
    args = ap.parse_args()
    root = Path(args.path)
    if not root.is_dir():
        sys.exit(f"{root}: no such folder (give the shared/sessions folder)")
    names = args.policy or POLICIES
    chosen = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        traces = [t for f in list_trace_files(folder) for t in read_traces(f)]
        traces.sort(key=lambda t: -sum(1 for m in t.messages if m.role == "tool"))
        chosen += traces[:args.largest]
    print(f"B = {args.budget}; {len(chosen)} sessions from {root}; CPU seconds per replay, render ms p50/p95 per call")
    print("| session | agent | calls | tool results | history tokens (last call) | policy | replay CPU s | render ms p50 | p95 | solver s p50 / p95 / max | stopped |")
    print("|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|")
    for t in chosen:
        results = sum(1 for m in t.messages if m.role == "tool")
        for name in names:
            sig = Signals(store=MemoryStore())
            c0 = time.process_time()
            res = replay_trace(t, {name: create(name, replay=True)}, args.budget, sig)
            cpu = time.process_time() - c0
            st = res.stats[name]
            ms = [s * 1000 for s in st.render_seconds]
            solve = st.extra.get("solve_seconds", [])
            solver = f"{pct(solve, .5):.3f} / {pct(solve, .95):.3f} / {max(solve):.2f}" if solve else "–"
            stopped = int(sum(st.extra.get("solver_stopped", []))) if solve else "–"
            full = res.stats.get("full") or None
            last = max(full.history_tokens) if full and full.history_tokens else res.reference.max_history_tokens if res.reference else 0
            print(f"| {t.trace_id[:8]} | {t.source} | {res.invocations} | {results} | {last} | {name} | {cpu:.1f} | "
                  f"{statistics.median(ms) if ms else float('nan'):.1f} | {pct(ms, .95):.1f} | {solver} | {stopped} |", flush=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory of the process: {peak:.0f} MB")


if __name__ == "__main__":
    main()
