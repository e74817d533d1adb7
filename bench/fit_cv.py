"""Cross-validated recall of the learned selector: the protocol behind docs/results.md.

Grouped k-fold over trajectories: the model that renders a trajectory was fitted without it. For
each fold the reuse model is fitted on the other trajectories' examples (observed TFA reuse as the
label) and the held-out ones are replayed through ``learned`` with that model; Later-Used Result
Recall (ContextRender B.4) is summed over all held-out trajectories. Also prints ``oracle`` and
``contextrender`` on the same trajectories for comparison.

    python bench/fit_cv.py ../shared/traces-train/mini-swe-agent-deepseek --budget 6000 --folds 5
    python bench/fit_cv.py TRAIN --test ../shared/traces/mini-swe-agent-deepseek   # fit on all of TRAIN, score TEST
    python bench/fit_cv.py TRAIN --curve 5,10,20,45,90                             # learning curve on TEST

Variants for model choice (``--variant``): ``base`` (the shipped recipe), ``within`` (label: reused
within the next 3 invocations), ``hgb`` (scikit-learn HistGradientBoosting instead of logistic).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from historygraph.eval.replay import replay_trace
from historygraph.fit.dataset import Examples, trace_examples
from historygraph.fit.train import C, fit_examples
from historygraph.formats import read_traces
from historygraph.policies import Signals, create
from historygraph.store import open_store


class _SklearnModel:
    def __init__(self, est):
        self.est = est

    def predict(self, X):
        return self.est.predict_proba(X)[:, 1]


def fit_variant(ex: Examples, variant: str, c: float):
    if variant in ("base", "within"):
        if variant == "within":
            ex = Examples(ex.X, ex.within, ex.within, ex.group, ex.invocation)
        return fit_examples(ex, c)
    if variant == "hgb":
        from sklearn.ensemble import HistGradientBoostingClassifier
        return _SklearnModel(HistGradientBoostingClassifier(max_iter=200, learning_rate=0.1, max_leaf_nodes=15,
                                                            random_state=0).fit(ex.X, ex.reused))
    raise SystemExit(f"unknown variant {variant!r}")


def parse_configs(text: str) -> dict[str, dict]:
    """``"reserve=0.8,brief;reserve=0.9"`` -> {label: learned config overrides}."""
    out = {}
    for part in text.split(";"):
        cfg = {}
        for item in filter(None, part.split(",")):
            k, _, v = item.partition("=")
            key = {"reserve": "result_reserve", "brief": "brief_revivals", "minp": "min_probability"}.get(k, k)
            cfg[key] = True if not v else float(v)
        out[f"learned[{part}]" if part else "learned"] = cfg
    return out


def score(traces, model, budgets, signals, extra=(), configs=None):
    out = {}
    configs = configs or {"learned": {}}
    for b in budgets:
        pols = {}
        for label, cfg in configs.items():
            pols[label] = create("learned", **cfg)
            pols[label].model = model
        others = {n: create(n, replay=True) for n in extra}
        tot = {n: [0, 0, []] for n in [*pols, *extra]}
        for tr in traces:
            res = replay_trace(tr, {**pols, **others}, b, signals)
            for n, st in res.stats.items():
                tot[n][0] += st.hits
                tot[n][1] += st.events
                tot[n][2] += st.history_tokens
        out[b] = {n: (h, e, t) for n, (h, e, t) in tot.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train")
    ap.add_argument("--test")
    ap.add_argument("--budget", default="6000,3000")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--variant", default="base")
    ap.add_argument("--C", type=float, default=C)
    ap.add_argument("--configs", default="", help="learned configs to compare, e.g. 'reserve=0.8,brief;reserve=0.5'")
    ap.add_argument("--curve")
    ap.add_argument("--compare", default="", help="comma-separated policies replayed beside learned, e.g. oracle,contextrender "
                    "(embeddings are cached in the default store)")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budget.split(",")]
    signals = Signals(store=open_store())
    t0 = time.process_time()
    train = [t for f in sorted(Path(a.train).glob("*")) for t in read_traces(f)]
    exs = [trace_examples(t, signals.counter, group=g) for g, t in enumerate(train)]
    print(f"{len(train)} training trajectories, {sum(len(e.reused) for e in exs)} examples "
          f"({time.process_time() - t0:.0f} s CPU)", file=sys.stderr)
    extra = tuple(filter(None, a.compare.split(",")))
    configs = parse_configs(a.configs)
    first = next(iter(configs))
    if a.curve:
        test = [t for f in sorted(Path(a.test).glob("*")) for t in read_traces(f)]
        rng = np.random.default_rng(0)
        for n in [int(x) for x in a.curve.split(",")]:
            rows = []
            for _rep in range(3 if n < len(train) else 1):
                pick = sorted(rng.choice(len(train), size=n, replace=False))
                model = fit_variant(Examples.concat([exs[i] for i in pick]), a.variant, a.C)
                rows.append(score(test, model, budgets, signals, configs=configs))
            rec = {b: [100.0 * r[b][first][0] / max(1, r[b][first][1]) for r in rows] for b in budgets}
            print(f"n={n}: " + ", ".join(f"B={b}: {np.mean(v):.1f} (min {min(v):.1f}, max {max(v):.1f})"
                                         for b, v in rec.items()), flush=True)
        return
    if a.test:
        test = [t for f in sorted(Path(a.test).glob("*")) for t in read_traces(f)]
        model = fit_variant(Examples.concat(exs), a.variant, a.C)
        res = score(test, model, budgets, signals, extra, configs)
        for b in budgets:
            print(f"unseen B={b}: " + ", ".join(f"{n} {100.0 * h / max(1, e):.1f} % ({np.mean(t):.0f} tok)"
                                                for n, (h, e, t) in res[b].items()))
        return
    folds = np.arange(len(train)) % a.folds
    tot = {b: {} for b in budgets}
    for k in range(a.folds):
        fit_on = [exs[i] for i in range(len(train)) if folds[i] != k]
        model = fit_variant(Examples.concat(fit_on), a.variant, a.C)
        held = [train[i] for i in range(len(train)) if folds[i] == k]
        res = score(held, model, budgets, signals, extra, configs)
        for b in budgets:
            for n, (h, e, t) in res[b].items():
                acc = tot[b].setdefault(n, [0, 0, []])
                acc[0] += h
                acc[1] += e
                acc[2] += t
        print(f"fold {k}: " + ", ".join(f"B={b} {n} {100.0 * h / max(1, e):.1f}" for b in budgets
                                        for n, (h, e, _) in res[b].items()), file=sys.stderr, flush=True)
    for b in budgets:
        print(f"CV B={b} variant={a.variant} C={a.C}: " +
              ", ".join(f"{n} {100.0 * h / max(1, e):.1f} % ({np.mean(t):.0f} tok)" for n, (h, e, t) in tot[b].items()))
    print(f"CPU {time.process_time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
