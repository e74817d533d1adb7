"""The least any policy can cost with a provider's prompt cache, as a share of Full history's cost.

Invariant §5.9 (docs/architecture.md) shows the results of the latest assistant message complete,
and the latest user and assistant messages are always shown: so every message of a trajectory is
sent to the model at least once, and the first time it is sent no cache can hold it. Under a price
model (``eval/prices.toml``) that first sending costs at least ``min(input, cache_write)`` per token
(uncached input, or a cache write); the tool schemas lead every request and cost at least
``cached_input`` per call after the first; the output is the same for every policy. The sum over a
trajectory is a lower bound on the cost of any rendering that holds the invariants, whatever it
selects; this script prints it per source as ContextRender eq. 9 normalises cost (ratio of means
over the traces where Full history exceeds B), next to what each policy of a replay measured.

Usage: ``python bench/cache_floor.py REPLAY_DIR TRACES [--budget 6000]``, where ``REPLAY_DIR`` is
the ``--out`` of a ``historygraph replay`` of ``TRACES`` that included ``-p full``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from historygraph.eval.prices import default_price_models
from historygraph.eval.prompt_cache import CacheTokens, bill
from historygraph.eval.replay import session_id_for, tool_schema_tokens
from historygraph.signals.tokens import TokenCounter
from historygraph.traces import read_traces


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("replay_dir", type=Path)
    ap.add_argument("traces", type=Path)
    ap.add_argument("--budget", type=int, default=6000)
    args = ap.parse_args()
    run = json.loads((args.replay_dir / "replay.json").read_text())
    rows = [r for r in run["per_trace"] if r.get("budget") == args.budget]
    compared = {r["session"] for r in rows if r["policy"] == "full" and r.get("cost_traces")}
    if not compared:
        raise SystemExit(f"{args.replay_dir}: no Full history rows at B = {args.budget} (replay with -p full -b {args.budget})")
    models = default_price_models()
    counter = TokenCounter()
    floor: dict[tuple[str, str], float] = defaultdict(float)
    full: dict[tuple[str, str], float] = defaultdict(float)
    for trace in read_traces(args.traces):
        sid = session_id_for(trace)
        if sid not in compared:
            continue
        ref = run["references"][f"{args.budget}|{sid}"]
        msgs = trace.messages
        last_call = max(i for i, m in enumerate(msgs) if m.role == "assistant")
        calls = sum(1 for m in msgs if m.role == "assistant")
        fixed = tool_schema_tokens(trace, counter)
        unique = fixed + sum(counter.count_message(m) for m in msgs[:last_call])
        for name, m in models.items():
            first = CacheTokens(uncached=unique) if m.input <= m.write_price else CacheTokens(write=unique)
            least = bill(m, first + CacheTokens(read=fixed * (calls - 1)), ref.get("output") or 0)
            for src in (trace.source, "ALL"):
                floor[(src, name)] += least
                full[(src, name)] += bill(m, CacheTokens(**ref["cache"][name]), ref.get("output") or 0)
    measured: dict[tuple[str, str, str], float] = {}
    for r in run["per_source"]:
        if r.get("budget") == args.budget:
            for name in models:
                if r.get(f"cost_cache_{name}") is not None:
                    measured[(r["source"], r["policy"], name)] = r[f"cost_cache_{name}"]
    policies = sorted({p for _, p, _ in measured})
    print(f"cost with the cache, Full history = 1, B = {args.budget}: the floor (every message sent once, "
          f"uncached or written) and each policy")
    print("source          price model        floor  " + "  ".join(f"{p:>14s}" for p in policies))
    for src, name in sorted(floor):
        cells = "  ".join(f"{measured.get((src, p, name), float('nan')):14.3f}" for p in policies)
        print(f"{src:15s} {name:17s} {floor[(src, name)] / full[(src, name)]:6.3f}  {cells}")


if __name__ == "__main__":
    main()
