"""Cross-validated recall of the learned selector: the protocol behind docs/learned.md.

Grouped k-fold over trajectories: the model that renders a trajectory was fitted without it. For
each fold the reuse model is fitted on the other trajectories' examples (observed TFA reuse as the
label) and the held-out ones are scored with Later-Used Result Recall (ContextRender B.4), summed
over all held-out trajectories.

Scoring runs the policy's own code (the same :class:`~historygraph.render.Layout` and
:func:`~historygraph.policies.learned.policy.knapsack_select`, on the same feature rows) at every recorded
invocation; only the final assembly of the message list is skipped, and the layouts, which do not
depend on the model, are built once per trajectory and budget and shared by every model and fold.
``--check`` replays the same trajectories through ``historygraph.eval.replay`` as well and asserts
equal hits, so the shortcut measures exactly what ``historygraph replay -p learned`` reports.

    python bench/fit_cv.py TRAIN --folds 5                               # CV on TRAIN (used to choose)
    python bench/fit_cv.py TRAIN --test TEST                             # fit on all of TRAIN, score TEST
    python bench/fit_cv.py TRAIN --test TEST --curve 5,10,20,45,90       # learning curve on TEST
    python bench/fit_cv.py TRAIN --test TEST --own-loo                   # leave-one-out over TEST, fitted with its other trajectories
    python bench/fit_cv.py TRAIN --configs 'reserve=0.5;reserve=0.9,brief,alpha=0.5'

``--ceiling`` also scores, on the same layouts, a selector that knows the label in advance (value
0.9 for a result the next call reuses by the training label of ``--variant``, plus 0.1 times the model's
probability to order the rest), and splits the B.4 events by whether the training label marks them
and, if not, whether every token linking them is a Titlecase word (prose such as ``Looking``, which
TFA's value rules exclude). This is analysis in the benchmark only; no policy reads the B.4 rule.

``--variant``: ``shipped`` (label: TFA reuse or identifier reuse at the next call, the shipped
recipe), ``values-or-named`` (TFA values other than file names, or identifiers), ``named``
(identifier reuse alone), ``tfa`` (TFA reuse alone), ``fresh`` (``values-or-named`` counting only
what no user or assistant message wrote before the result), ``within`` (TFA reuse within the next 3
calls).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

from historygraph.eval.recall import reuse_events
from historygraph.eval.replay import replay_trace
from historygraph.policies.learned.dataset import Examples, trace_examples
from historygraph.policies.learned.train import C, OBJECTIVES, fit_examples, labels
from historygraph.traces import read_traces
from historygraph.history.graph import ContextGraph
from historygraph.policies import Signals, create
from historygraph.policies.learned.policy import LearnedConfig, reserve_layout, select_results
from historygraph.render import BudgetTooSmallError, Layout

KEYS = {"reserve": "result_reserve", "brief": "brief_revivals", "minp": "min_probability", "alpha": "cost_exponent",
        "swap": "swap_pairs"}


def parse_configs(text: str) -> dict[str, dict]:
    """``"reserve=0.8,brief;reserve=0.9"`` -> {label: learned config overrides}."""
    out = {}
    for part in text.split(";"):
        cfg = {}
        for item in filter(None, part.split(",")):
            k, _, v = item.partition("=")
            cfg[KEYS.get(k, k)] = True if not v else int(v) if v.isdigit() else float(v)
        out[part or "defaults"] = cfg
    return out


VARIANT_LABEL = {"shipped": "reuse-or-named", "values-or-named": "values-or-named", "named": "named", "tfa": "reuse",
                 "fresh": "fresh"}


def variant_label(ex: Examples, variant: str) -> np.ndarray:
    """The training label of ``variant`` per row of ``ex``."""
    return ex.within if variant == "within" else labels(ex, VARIANT_LABEL[variant])


OBJECTIVE = [OBJECTIVES[0]]  # set by --objective


def fit_variant(ex: Examples, variant: str, c: float):
    if variant == "within":
        z = np.zeros_like(ex.named)
        return fit_examples(Examples(ex.X, ex.within, ex.within, ex.group, ex.invocation, z, z, z), c,
                            label="reuse", objective=OBJECTIVE[0])
    if variant not in VARIANT_LABEL:
        raise SystemExit(f"unknown variant {variant!r}; choose one of {', '.join([*VARIANT_LABEL, 'within'])}")
    return fit_examples(ex, c, label=VARIANT_LABEL[variant], objective=OBJECTIVE[0])


class Scorer:
    """Per trajectory: the B.4 events per invocation, the feature rows, and cached layouts."""

    def __init__(self, trace, ex: Examples, counter):
        self.trace, self.ex, self.counter = trace, ex, counter
        self.events: dict[int, set[int]] = {}
        self.tokens: dict[tuple[int, int], frozenset[str]] = {}
        for e in reuse_events(trace.messages):
            self.events.setdefault(e.turn, set()).add(e.result)
            self.tokens[(e.turn, e.result)] = e.tokens
        self._layouts: dict[tuple, list] = {}

    def layouts(self, budget: int, reserve: float, brief: bool):
        key = (budget, reserve, brief)
        if key not in self._layouts:
            out, g, inv = [], ContextGraph("cv"), 0
            rows = np.cumsum([0] + [int((self.ex.invocation == i).sum()) for i in range(int(self.ex.invocation.max()) + 1)]) \
                if len(self.ex.invocation) else [0]
            for j, m in enumerate(self.trace.messages):
                if m.role == "assistant" and len(g):
                    try:
                        lay = Layout(g, self.counter, budget, result_reserve=reserve, brief_revivals=brief)
                    except BudgetTooSmallError:
                        lay = None
                    # learned's reserve_always: the same history with the steps dropped to the reserve (used when set)
                    alt = reserve_layout(lay, LearnedConfig(result_reserve=reserve, brief_revivals=brief)) \
                        if lay is not None else None
                    lo, hi = (rows[inv], rows[inv + 1]) if inv + 1 < len(rows) else (0, 0)
                    out.append((j, lay, alt, lo, hi))
                    inv += 1
                g.append(m)
            self._layouts[key] = out
        return self._layouts[key]

    def hits(self, model, budget: int, cfg: dict, prob: np.ndarray | None = None) -> tuple[int, int, list[int]]:
        """Hits, events and history tokens of ``model`` (or of the given per-row values ``prob``)."""
        c = LearnedConfig(**cfg)  # the policy's defaults for what cfg does not set
        reserve, brief = c.result_reserve, c.brief_revivals
        if prob is None:
            prob = model.predict(self.ex.X) if len(self.ex.X) else np.zeros(0)
        hits = events = 0
        tokens = []
        msgs = self.trace.messages
        for j, lay, alt, lo, hi in self.layouts(budget, reserve, brief):
            ev = self.events.get(j, set())
            events += len(ev)
            if lay is None:
                continue
            if lay.fits_in_full:
                hits += len(ev)
                tokens.append(lay.full_history_tokens)
                continue
            _, _, sel, _ = select_results(lay, prob[lo:hi], c, alt if c.reserve_always else None)
            shown = {p for p, f in sel.shown.items() if f is msgs[p]}
            hits += len(ev & shown)
            tokens.append(sel.used)
        return hits, events, tokens


def label_rows(s: Scorer, variant: str) -> dict[tuple[int, int], bool]:
    """(assistant position, result position) -> the training label of ``variant`` of that row; rows
    run over the results stored before each invocation, in order (fit.dataset)."""
    out: dict[tuple[int, int], bool] = {}
    label = variant_label(s.ex, variant)
    row, results = 0, []
    for j, m in enumerate(s.trace.messages):
        if m.role == "assistant" and j:
            for p in results:
                out[(j, p)] = bool(label[row])
                row += 1
        elif m.role == "tool":
            results.append(j)
    return out


TITLECASE = re.compile(r"[A-Z][a-z]+")


def ceiling(scorers, model, budgets, variant: str) -> str:
    """The ``--ceiling`` figures (module docstring): label-oracle recall per B and the B.4 events by label."""
    parts, kinds = [], {"labelled": 0, "Titlecase words only": 0, "other": 0}
    for b in budgets:
        h = e = 0
        for s in scorers:
            label = variant_label(s.ex, variant)
            p = model.predict(s.ex.X) if len(s.ex.X) else np.zeros(0)
            a, b_, _ = s.hits(model, b, {}, prob=0.9 * label + 0.1 * p)
            h, e = h + a, e + b_
        parts.append(f"B={b} label oracle {100.0 * h / max(1, e):.1f} %")
    for s in scorers:
        rows = label_rows(s, variant)
        for key, toks in s.tokens.items():
            kinds["labelled" if rows.get(key) else "Titlecase words only" if all(TITLECASE.fullmatch(t) for t in toks)
                  else "other"] += 1
    n = max(1, sum(kinds.values()))
    return "; ".join(parts) + "; B.4 events: " + ", ".join(f"{k} {100.0 * v / n:.1f} %" for k, v in kinds.items())


def run(scorers, model, budgets, configs):
    out = {}
    for b in budgets:
        for label, cfg in configs.items():
            h = e = 0
            t: list[int] = []
            for s in scorers:
                a, b_, c = s.hits(model, b, cfg)
                h, e, t = h + a, e + b_, t + c
            out[(b, label)] = (h, e, t)
    return out


def fmt(res) -> str:
    return "; ".join(f"B={b} [{label}] {100.0 * h / max(1, e):.1f} % ({np.mean(t):.0f} tok)" for (b, label), (h, e, t) in res.items())


def oracle_figures(traces, budgets, signals) -> str:
    parts = []
    for b in budgets:
        h = e = 0
        for tr in traces:
            st = replay_trace(tr, {"oracle": create("oracle", replay=True)}, b, signals).stats["oracle"]
            h, e = h + st.hits, e + st.events
        parts.append(f"B={b} oracle {100.0 * h / max(1, e):.1f} %")
    return "; ".join(parts)


def load(folder: str, limit: int = 0):
    traces = [t for f in sorted(Path(folder).glob("*")) for t in read_traces(f)]
    return traces[::max(1, len(traces) // limit)][:limit] if limit else traces


def own_loo(scorers: list, exs: list, texs: list, a, budgets: list[int], configs: dict) -> None:
    """``--own-loo``: leave-one-out over the test trajectories (see the option's help)."""
    base = Examples.concat(exs)
    shipped = fit_variant(base, a.variant, a.C)
    total: dict = {}
    for i, sc in enumerate(scorers):
        others = [x for j, x in enumerate(texs) if j != i]
        models = {"train": shipped, "train+own": fit_variant(Examples.concat([base, *others]), a.variant, a.C),
                  "train+own x10": fit_variant(Examples.concat([base, *others * 10]), a.variant, a.C)}
        if any(x.reused.any() or x.named.any() for x in others):
            models["own only"] = fit_variant(Examples.concat(others), a.variant, a.C)
        for name, m in models.items():
            for key, (h, e, _t) in run([sc], m, budgets, configs).items():
                acc = total.setdefault((name, *key), [0, 0])
                acc[0] += h
                acc[1] += e
        print(f"left out {i + 1}/{len(scorers)}", file=sys.stderr, flush=True)
    for (name, b, label), (h, e) in sorted(total.items()):
        print(f"leave-one-out [{name}] B={b} [{label}]: {100.0 * h / max(1, e):.1f} ({h}/{e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("train")
    ap.add_argument("--test")
    ap.add_argument("--budget", default="6000,3000")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--only", default="", help="run only these folds, e.g. '0,1' (quick comparisons)")
    ap.add_argument("--variant", default="shipped")
    ap.add_argument("--C", type=float, default=C)
    ap.add_argument("--objective", default=None, choices=OBJECTIVES,
                    help="the model: the blend of the logistic regression and LambdaRank trees (the shipped recipe; the default "
                    "with --variant shipped), the logistic regression (the default with other variants) or the trees alone")
    ap.add_argument("--configs", default="", help="learned configs to compare, e.g. 'reserve=0.9,brief;reserve=0.5'")
    ap.add_argument("--limit", type=int, default=0, help="use N training trajectories (every k-th)")
    ap.add_argument("--curve", help="learning curve: comma-separated numbers of training trajectories (needs --test)")
    ap.add_argument("--oracle", action="store_true", help="also replay the oracle on the scored trajectories")
    ap.add_argument("--ceiling", action="store_true", help="also score a selector that knows the training label "
                    "(the model's ceiling) and split the B.4 events by it")
    ap.add_argument("--own-loo", action="store_true", help="with --test: leave-one-out over TEST, each trajectory "
                    "scored by models fitted on TRAIN alone, TRAIN plus the other TEST trajectories (also repeated "
                    "10 times), and the other TEST trajectories alone (fitting to one's own agent)")
    ap.add_argument("--check", action="store_true", help="replay learned on the scored trajectories and assert equal hits")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budget.split(",")]
    a.objective = a.objective or (OBJECTIVES[0] if a.variant == "shipped" else "logistic")
    OBJECTIVE[0] = a.objective
    configs = parse_configs(a.configs)
    signals = Signals()
    t0 = time.process_time()
    train = load(a.train, a.limit)
    exs = [trace_examples(t, signals.counter, group=g) for g, t in enumerate(train)]
    print(f"{len(train)} training trajectories, {sum(len(e.reused) for e in exs)} examples "
          f"({time.process_time() - t0:.0f} s CPU)", file=sys.stderr)
    if a.test:
        test = load(a.test)
        texs = [trace_examples(t, signals.counter, group=len(train) + g) for g, t in enumerate(test)]
        scorers = [Scorer(t, ex, signals.counter) for t, ex in zip(test, texs)]
        if a.own_loo:
            own_loo(scorers, exs, texs, a, budgets, configs)
            return
        if a.curve:
            rng = np.random.default_rng(0)
            for n in [int(x) for x in a.curve.split(",")]:
                reps = []
                for _ in range(5 if n < len(train) else 1):
                    pick = sorted(rng.choice(len(train), size=n, replace=False))
                    reps.append(run(scorers, fit_variant(Examples.concat([exs[i] for i in pick]), a.variant, a.C), budgets, configs))
                print(f"n={n}: " + "; ".join(
                    f"B={b} [{label}] mean {np.mean(v):.1f} (min {min(v):.1f}, max {max(v):.1f})"
                    for (b, label) in reps[0] for v in [[100.0 * r[(b, label)][0] / max(1, r[(b, label)][1]) for r in reps]]),
                    flush=True)
            return
        model = fit_variant(Examples.concat(exs), a.variant, a.C)
        res = run(scorers, model, budgets, configs)
        print(f"unseen ({len(test)} trajectories, variant={a.variant}, C={a.C}): {fmt(res)}")
        if a.ceiling:
            print("unseen ceiling: " + ceiling(scorers, model, budgets, a.variant))
        if a.oracle:
            print("unseen " + oracle_figures(test, budgets, signals))
        return
    folds = np.arange(len(train)) % a.folds
    total: dict = {}
    for k in [int(x) for x in a.only.split(",")] if a.only else range(a.folds):
        model = fit_variant(Examples.concat([exs[i] for i in range(len(train)) if folds[i] != k]), a.variant, a.C)
        held = [i for i in range(len(train)) if folds[i] == k]
        scorers = [Scorer(train[i], exs[i], signals.counter) for i in held]
        res = run(scorers, model, budgets, configs)
        if a.ceiling:
            print(f"fold {k} ceiling: " + ceiling(scorers, model, budgets, a.variant), file=sys.stderr, flush=True)
        if a.check:
            for b in budgets:
                for label, cfg in configs.items():
                    pol = create("learned", **cfg)
                    pol.model = model
                    h = sum(replay_trace(train[i], {"l": pol}, b, signals).stats["l"].hits for i in held)
                    assert h == res[(b, label)][0], (b, label, h, res[(b, label)][0])
        for key, (h, e, t) in res.items():
            acc = total.setdefault(key, [0, 0, []])
            acc[0] += h
            acc[1] += e
            acc[2] += t
        print(f"fold {k}: {fmt(res)}", file=sys.stderr, flush=True)
    print(f"CV {a.folds} folds over {len(train)} trajectories (variant={a.variant}, objective={a.objective}, C={a.C}): {fmt(total)}")
    if a.oracle:
        print("CV trajectories " + oracle_figures(train, budgets, signals))
    print(f"CPU {time.process_time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
