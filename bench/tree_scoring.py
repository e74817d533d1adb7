"""CPU time of a tree reuse model's scoring: leaf masks (``TreeReuseModel.score``) against the
level-by-level walk (``TreeReuseModel.score_levels``), on real feature rows, with equal bits asserted.

    python bench/tree_scoring.py MODEL.json [--traces ../shared/traces-train/mini-swe-agent-deepseek]

``MODEL.json`` is a tree model (``historygraph fit ... --objective lambdarank --out MODEL.json``).
Rows are those of the first five trajectories of ``--traces`` (``historygraph.policies.learned.dataset``), drawn
at random for each size; per size, the median CPU time (``time.process_time``) over alternating
repeats of the two readers, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from historygraph.policies.learned.dataset import Examples, trace_examples
from historygraph.policies.learned.model import ReuseModel, TreeReuseModel
from historygraph.traces import read_traces
from historygraph.signals.tokens import TokenCounter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--traces", default="../shared/traces-train/mini-swe-agent-deepseek")
    ap.add_argument("--sizes", default="50,200,1000,5000")
    ap.add_argument("--repeats", type=int, default=21)
    a = ap.parse_args()
    model = ReuseModel.load(a.model)
    if not isinstance(model, TreeReuseModel):
        raise SystemExit(f"{a.model} is a logistic model; fit one with --objective lambdarank")
    counter = TokenCounter()
    traces = [t for f in sorted(Path(a.traces).glob("*"))[:5] for t in read_traces(f)]
    X = Examples.concat([trace_examples(t, counter) for t in traces]).X
    rng = np.random.default_rng(0)
    print(f"{len(model.roots)} trees, {len(model._masks.groups) if model._masks else 0} feature groups; "
          f"{len(X)} rows; load average {os.getloadavg()[0]:.1f}")
    print("| rows | leaf masks CPU ms | level walk CPU ms | ratio |\n|---:|---:|---:|---:|")
    for n in [int(s) for s in a.sizes.split(",")]:
        rows = np.ascontiguousarray(X[rng.choice(len(X), n, replace=n > len(X))])
        assert np.array_equal(model.score(rows), model.score_levels(rows))
        fast, walk = [], []
        for _ in range(a.repeats if n <= 1000 else max(3, a.repeats // 4)):
            t = time.process_time()
            model.score(rows)
            fast.append(time.process_time() - t)
            t = time.process_time()
            model.score_levels(rows)
            walk.append(time.process_time() - t)
        f, w = 1e3 * float(np.median(fast)), 1e3 * float(np.median(walk))
        print(f"| {n} | {f:.2f} | {w:.2f} | {w / f:.1f}× |", flush=True)


if __name__ == "__main__":
    main()
