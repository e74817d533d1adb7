"""Digests of renderings, to check that a change to the render path leaves every rendering as it was.

Renders each policy on real-trace graphs grown event by event (per-graph state kept between
renders, as in a session) before every ``--every``-th assistant message, at B = 2000 and 6000, and
on one synthetic ``bench/run.py`` session grown step by step from 150 results; prints per policy
the number of renderings and a SHA-256 over each rendering's messages, positions, full / omitted
/ dropped positions, token counts and reasons (in their order). Run it on the code before and
after a change (``--src`` of a ``git worktree`` of the earlier commit) and compare the lines.

Usage: ``python bench/render_digests.py [--src TREE/src] [--policy NAME ...] [--every 4]
[--cache embeddings.sqlite]``. Policies that need a chat or scoring model are left out (their
renders depend on the model); embeddings come from the default embedder, cached in ``--cache``
(default: none, every text embedded).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=BENCH.parent / "src")
    ap.add_argument("--policy", action="append")
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--traces", type=Path, default=BENCH.parents[1] / "shared" / "traces")
    args = ap.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    from historygraph.traces import read_traces
    from historygraph.history.graph import ContextGraph
    from historygraph.policies import Signals, create, names

    sys.path.insert(1, str(BENCH))
    import run as bench

    def no_model():
        raise RuntimeError("no model in the digest run")

    store = None
    if args.cache:
        from historygraph.store import open_store
        store = open_store(str(args.cache))
    signals = Signals(store=store, model_factory=no_model, scorer_factory=no_model)
    traces = []
    for rel in ("mini-swe-agent-deepseek", "openhands", "swe-agent", "tau-bench"):
        if (args.traces / rel).exists():
            traces += list(read_traces(args.traces / rel))[:3]
    pool = bench.StepPool(args.traces)
    head, k = pool.session(150)
    bench_steps = [pool.step(k + i) for i in range(40)]
    todo = args.policy or [n for n in names() if n not in ("full",)] + ["full"]
    for name in todo:
        try:
            policy = create(name)
        except Exception as exc:  # noqa: BLE001 (report and go on)
            print(f"{name}: not created ({type(exc).__name__})")
            continue
        h = hashlib.sha256()
        count, skipped = 0, False
        walks = [(tr.trace_id, tr.messages, None) for tr in traces] + [("bench", head, bench_steps)]
        try:
            for sid, msgs, steps in walks:
                g = ContextGraph(sid)
                if steps is None:  # a trace: render before every --every-th assistant message
                    cuts = set([p for p, m in enumerate(msgs) if m.role == "assistant"][2::args.every])
                    events = [(j in cuts, m) for j, m in enumerate(msgs)]
                else:  # the bench session: render after each step (an assistant message and its results)
                    g.extend(msgs)
                    events = [(j == 0, m) for step in steps for j, m in enumerate(step)] + [(True, None)]
                for render_now, m in events:
                    if render_now:
                        for budget in (2000, 6000):
                            try:
                                r = policy.render(g, budget, signals)
                            except ValueError as exc:  # budget below the protected history: part of the digest
                                h.update(f"error {type(exc).__name__} {exc}".encode())
                                continue
                            h.update(json.dumps([[x.to_dict() for x in r.messages], r.positions, r.full, r.omitted,
                                                 r.dropped, r.history_tokens, r.input_tokens,
                                                 list(r.reasons.items())], sort_keys=True, default=str).encode())
                            count += 1
                    if m is not None:
                        g.append(m)
        except RuntimeError as exc:
            if "no model" not in str(exc):
                raise
            skipped = True
        print(f"{name}: {'needs a model, left out' if skipped else f'{count} renderings {h.hexdigest()[:16]}'}", flush=True)


if __name__ == "__main__":
    main()
