"""ReCAP evaluation (issue 4): replay traces through ReCAP, its ablations and the comparison
policies at one token budget, and print recall, tokens per call, compaction time (selection and
proxy attention), graph memory per session and the revival rate.

    PYTHONPATH=src python bench/recap_eval.py ../shared/traces/openhands --budget 6000 --out /tmp/recap-eval

The ReCAP variants that use the attention graph (``recap``, ``recap-paragraph``, ``recap-line``)
run here with ``measure_mid_turn=True`` so that sessions made of one long user turn (mini-swe-agent,
most OpenHands runs) get proxy attention at their budget-forced compactions; the registered names
measure completed user turns only. Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from historygraph.eval.replay import replay_trace
from historygraph.eval.report import summarize, write_outputs
from historygraph.traces import read_traces
from historygraph.policies import Signals, create
from historygraph.store import open_store

MID_TURN = ("recap", "recap-paragraph", "recap-line")
COLS = ["source", "policy", "traces", "invocations", "events", "recall", "mean_history_tokens", "max_history_tokens",
        "render_ms_median", "compactions", "selection_ms_mean", "attention_s_mean", "graph_kb_session", "revival_pct"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--policy", action="append", help="policy names (default: recap, recap-noattn, contextrender, prune, cr-recency)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/recap-eval"))
    args = ap.parse_args()
    names = args.policy or ["recap", "recap-noattn", "contextrender", "prune", "cr-recency"]
    policies = {n: create(n, measure_mid_turn=True) if n in MID_TURN else create(n) for n in names}
    args.out.mkdir(parents=True, exist_ok=True)
    store = open_store(str(args.out / "store.sqlite"))
    signals = Signals(store=store)
    t0 = time.perf_counter()
    traces = [t for p in args.paths for t in read_traces(p)]
    results = []
    for k, tr in enumerate(traces, 1):
        results.append(replay_trace(tr, policies, args.budget, signals, store))
        print(f"[{k}/{len(traces)}] {tr.source}:{tr.trace_id} {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0
    write_outputs(args.out, results, {"budget": args.budget, "policies": names, "paths": [str(p) for p in args.paths],
                                      "wall_seconds": round(wall, 1)})
    _, per_source = summarize(results)
    print("| " + " | ".join(COLS) + " |")
    print("|" + "---|" * len(COLS))
    for r in per_source:
        print("| " + " | ".join("–" if r[c] is None else str(r[c]) for c in COLS) + " |")
    print(f"wall {wall:.0f} s; violations {json.dumps({n: sum(len(x.stats[n].violations) for x in results) for n in names})}")


if __name__ == "__main__":
    main()
