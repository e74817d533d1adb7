"""Render p50 of two (or more) source trees, measured interleaved, for before/after comparisons.

Each run starts one process per tree, in alternating order, that imports ``historygraph`` from
that tree's ``src`` and runs this checkout's ``bench/run.py`` render section on it (the same
synthetic sessions, B = 6000, 15 warm renders per policy and size, policies taking turns, CPU
time). On a shared machine load moves from minute to minute; alternating the trees run by run lets
it fall on both alike. Each tree has its own embedding cache (filled on its first run) under the
temporary directory, as a store written by a newer schema cannot be opened by older code. Prints per tree and cell the median over runs of the per-run p50, and the
median of the per-run ratios to the first tree.

Usage: ``python bench/render_ab.py TREE [TREE ...] [--runs 5] [--policy prune ...] [--sizes 1000,5000]``,
e.g. a ``git worktree`` of the commit before a change and this checkout (``.``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent

CHILD = """
import json, sys
sys.path.insert(0, {src!r})
import historygraph  # noqa: F401  (from the tree under test; bench/run.py's own path comes after)
sys.path.insert(0, {bench!r})
import run as bench
from historygraph.policies import Signals
from historygraph.store import open_store
pool = bench.StepPool(bench.Path({traces!r}))
signals = Signals(store=open_store({cache!r}))
bench.warm_embeddings(pool, signals)
out = bench.bench_render(pool, signals, {policies!r}, {sizes!r}, {repeats}, 1e9)
print(json.dumps([[k[0], k[1], v["p50"]] for k, v in out.items() if v]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--traces", type=Path, default=BENCH.parents[0].parent / "shared" / "traces")
    args = ap.parse_args()
    policies = args.policy or ["prune"]
    sizes = [int(s) for s in args.sizes.split(",")]
    res: dict[int, list[dict]] = {i: [] for i in range(len(args.trees))}
    loads = []
    for r in range(args.runs):
        order = list(range(len(args.trees)))
        if r % 2:
            order.reverse()
        for i in order:
            # an embedding cache per tree: a store written by a newer schema cannot be opened by older code
            cache = Path(tempfile.gettempdir()) / "hg-render-ab" / hashlib.sha1(str(args.trees[i].resolve()).encode()).hexdigest()[:12]
            cache.mkdir(parents=True, exist_ok=True)
            code = CHILD.format(src=str(args.trees[i].resolve() / "src"), bench=str(BENCH), traces=str(args.traces),
                                cache=str(cache / "embeddings.sqlite"), policies=policies, sizes=sizes, repeats=args.repeats)
            loads.append(os.getloadavg()[0])
            p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(f"{args.trees[i]}: the render run failed:\n{p.stderr[-3000:]}")
            res[i].append({(name, n): v for name, n, v in json.loads(p.stdout.strip().splitlines()[-1])})
            print(f"run {r + 1} tree {args.trees[i]}: " + ", ".join(f"{k[0]}@{k[1]} {v:.2f}" for k, v in res[i][-1].items()),
                  file=sys.stderr, flush=True)
    print(f"load average during the runs: {min(loads):.1f}–{max(loads):.1f}; {args.runs} runs, p50 of {args.repeats} renders each\n")
    print("| policy | results | " + " | ".join(f"{t} p50 ms" for t in args.trees) +
          "".join(f" | {t} / {args.trees[0]}" for t in args.trees[1:]) + " |")
    print("|---|---:|" + "---:|" * (2 * len(args.trees) - 1))
    for key in res[0][0]:
        cells = [statistics.median(run[key] for run in res[i]) for i in range(len(args.trees))]
        ratios = [statistics.median(b[key] / a[key] for a, b in zip(res[0], res[i])) for i in range(1, len(args.trees))]
        print(f"| {key[0]} | {key[1]:,} | " + " | ".join(f"{c:.2f}" for c in cells) + "".join(f" | {x:.2f}×" for x in ratios) + " |")


if __name__ == "__main__":
    main()
