"""``historygraph fit``: fit the learned selector's reuse model on recorded traces.

Examples come from :func:`historygraph.policies.learned.dataset.trace_examples` (render-time features only).
The label is observed reuse at the next invocation (:data:`LABELS`). The shipped recipe,
``reuse-or-named``: the next assistant message repeats a TFA value attributed to the result
(ContextRender, arXiv:2609.37743, §3.2, A.2) *or* names a code identifier first held by the result
(ContextWeaver §3.1's identifier rule, attributed to the first result holding it as TFA attributes
values). Chosen over TFA alone (``reuse``) by grouped 5-fold cross-validation on the training
trajectories (docs/learned.md): identifier reuse catches dotted and partial names that TFA's
whole-value matching misses. ``values-or-named`` leaves out the TFA values that are file names
(``compiler.py``: an agent repeats it in every view of that file, whichever result it needs) and
``named`` counts identifiers alone; both scored higher on that cross-validation and on unseen
coding-agent trajectories but put τ-bench (an agent that repeats order numbers and IDs) a little
below ContextRender alone. ``fresh`` is ``values-or-named`` counting only the values and
identifiers that no user or assistant message wrote before the result (the result was their first
source; :mod:`historygraph.policies.learned.dataset`): a name the agent wrote itself, then found in a result,
was not learned there. The shipped blend fits its trees on ``fresh`` (below).
Three objectives (:data:`OBJECTIVES`):

* ``blend`` (the shipped recipe): the weighted mean of the probabilities of the two below, each
  with its own label (:data:`BLEND`: 0.1 × ``logistic`` on ``reuse-or-named`` + 0.9 ×
  ``lambdarank`` on ``fresh``), chosen among such means on grouped 5-fold cross-validation on the
  training trajectories (79.8 / 62.2 at B = 6000 / 3000 against 78.8 / 61.3 with the trees on
  ``values-or-named``, the default before, and 76.0 / 58.0 for ``logistic`` alone; the weight
  0.25 then, re-screened to 0.1 under ``reserve_always``: 85.2 / 63.8 → 85.7 / 64.5); measured once
  on unseen trajectories it keeps τ-bench and τ²-bench at or above ContextRender, which the trees
  alone did not, nor the blend with both members on ``fresh`` (docs/learned.md). An ensemble of unlike
  models ("Ensemble Methods in Machine Learning", Dietterich, MCS 2000): the logistic member keeps
  a smooth response where the trees, fitted on one agent family, are flat.
* ``logistic`` (the default before): scikit-learn's ``LogisticRegression`` (L2, ``C`` below,
  ``lbfgs``) on features standardised with the training mean and standard deviation.
* ``lambdarank``: LightGBM's LambdaRank (gradient-boosted regression trees that order the
  candidates of each invocation, one query per invocation: "From RankNet to LambdaRank to
  LambdaMART: An Overview", Burges, 2010; "LightGBM: A Highly Efficient Gradient Boosting Decision
  Tree", Ke et al., NeurIPS 2017), :data:`TREE_PARAMS`; its score is mapped to a probability by a
  one-feature logistic regression fitted on the same rows (the knapsack needs probabilities, not
  only an order). Alone it beat ``logistic`` on cross-validation but put τ-bench at B = 3000 a
  little below ContextRender (docs/learned.md).

Either is written as a small JSON file that :mod:`historygraph.policies.learned.model` reads with numpy alone.
The fit is deterministic: the same traces and options give the same file (LightGBM with one thread
and its ``deterministic`` option).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, cast

import numpy as np

from historygraph.history.events import Trace
from historygraph.signals.tokens import TokenCounter
from historygraph.policies.learned.dataset import Examples, trace_examples
from historygraph.policies.learned.features import FEATURES
from historygraph.policies.learned.model import AnyReuseModel, BlendReuseModel, ReuseModel, TreeReuseModel

C = 1.0  # inverse L2 strength; chosen by leave-trajectories-out cross-validation on the 90 training trajectories (docs/learned.md)


def examples(traces: Iterable[Trace], counter: TokenCounter,
             on_trace: Callable[[Trace], None] | None = None) -> Examples:
    parts = []
    for g, tr in enumerate(traces):
        parts.append(trace_examples(tr, counter, group=g))
        if on_trace:
            on_trace(tr)
    return Examples.concat(parts)


LABELS = ("reuse-or-named", "values-or-named", "named", "reuse", "fresh")  # the shipped recipe first (module docstring)


def labels(ex: Examples, label: str = LABELS[0]) -> np.ndarray:
    """The 0/1 label of every row of ``ex`` under ``label`` (one of :data:`LABELS`), shape ``(n,)``.

    Raises:
        ValueError: an unknown label.
    """
    if label not in LABELS:
        raise ValueError(f"unknown label {label!r}; choose one of {', '.join(LABELS)}")
    if label == "values-or-named":
        return np.maximum(ex.valued, ex.named)
    if label == "fresh":
        return ex.fresh
    if label == "reuse-or-named":
        return np.maximum(ex.reused, ex.named)
    return ex.named if label == "named" else ex.reused


OBJECTIVES = ("blend", "logistic", "lambdarank")  # the shipped recipe first (module docstring)
# --objective blend: (objective, label, weight) of each member (docs/learned.md: chosen on grouped 5-fold
# cross-validation over traces-train among weighted means of the logistic regression and LambdaRank trees, and
# the trees' label among values-or-named and fresh; the weights re-screened under learned's reserve_always)
BLEND = (("logistic", "reuse-or-named", 0.1), ("lambdarank", "fresh", 0.9))
# LightGBM LambdaRank settings of the shipped recipe, as screened on cross-validation folds 0–1 (docs/learned.md;
# not tuned further): 200 trees of at most 15 leaves, each leaf at least 50 rows; NDCG truncated at 30 candidates
TREE_PARAMS: dict[str, Any] = {"objective": "lambdarank", "n_estimators": 200, "learning_rate": 0.05, "num_leaves": 15,
               "min_child_samples": 50, "lambdarank_truncation_level": 30, "random_state": 0, "n_jobs": 1,
               "deterministic": True, "verbose": -1}


def invocation_sizes(ex: Examples) -> np.ndarray:
    """Rows per invocation (consecutive rows of one trace's invocation), in row order: LambdaRank's
    queries; shape ``(number of invocations with candidates,)``."""
    if not len(ex.group):
        return np.zeros(0, dtype=np.int64)
    new = np.r_[True, (np.diff(ex.group) != 0) | (np.diff(ex.invocation) != 0)]
    return np.diff(np.r_[np.flatnonzero(new), len(ex.group)])


def tree_arrays(dump: dict) -> tuple[list[int], list[int], list[float], list[int], list[int], list[float]]:
    """Roots, split features, thresholds, left and right children and leaf values of every tree of
    a LightGBM ``Booster.dump_model()`` (nodes numbered in one sequence, a leaf's feature −1).

    Raises:
        ValueError: a split that is not numerical ``≤`` (categorical splits are never fitted here).
    """
    roots: list[int] = []
    feat: list[int] = []
    thr: list[float] = []
    left: list[int] = []
    right: list[int] = []
    val: list[float] = []

    def add(node: dict) -> int:
        i = len(feat)
        feat.append(-1)
        thr.append(0.0)
        left.append(-1)
        right.append(-1)
        val.append(0.0)
        if "leaf_value" in node:
            val[i] = float(node["leaf_value"])
            return i
        if node.get("decision_type") != "<=":
            raise ValueError(f"tree model: unsupported split {node.get('decision_type')!r}")
        feat[i], thr[i] = int(node["split_feature"]), float(node["threshold"])
        left[i] = add(node["left_child"])
        right[i] = add(node["right_child"])
        return i

    for tree in dump["tree_info"]:
        roots.append(add(tree["tree_structure"]))
    return roots, feat, thr, left, right, val


def fit_examples(ex: Examples, c: float = C, meta: dict | None = None, label: str = LABELS[0],
                 objective: str = OBJECTIVES[0]) -> AnyReuseModel:
    """Fit the model on ``ex``; ``label`` is one of :data:`LABELS`, ``objective`` one of
    :data:`OBJECTIVES` (``lambdarank`` needs LightGBM and scikit-learn, ``logistic`` scikit-learn;
    ``c`` is the logistic regression's inverse L2 strength).

    Raises:
        ValueError: an unknown label or objective, or no positive or no negative example (nothing to learn from).
    """
    from sklearn.linear_model import LogisticRegression

    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")

    y = labels(ex, label)
    if len(y) == 0 or y.min() == y.max():
        hint = (" (label 'named' counts code identifiers only; for an agent that repeats other values, such as "
                "order numbers, fit with label 'values-or-named')" if label == "named" and len(y) else "")
        raise ValueError(f"cannot fit a reuse model on {len(y)} examples with {int(y.sum())} reused: the traces need "
                         f"tool results, some of them reused later (values repeated by later tool calls or messages)"
                         f"{hint}")
    info = {"examples": int(len(y)), "reused": int(y.sum()), "traces": int(len(np.unique(ex.group))), "label": label}
    if objective == "blend":
        if label != LABELS[0]:
            raise ValueError(f"objective 'blend' fits each member with its own label "
                             f"({', '.join(f'{o}: {lb}' for o, lb, _ in BLEND)}); leave the label at {LABELS[0]!r}")
        # BLEND's objectives fit a logistic regression and trees, never a blend
        members = cast(list[ReuseModel | TreeReuseModel], [fit_examples(ex, c, None, lb, o) for o, lb, _ in BLEND])
        blend = BlendReuseModel(list(FEATURES), members, [w for _, _, w in BLEND],
                                {**info, "label": "per member", "objective": objective, **(meta or {})})
        return BlendReuseModel.from_dict(blend.to_dict(), "fitted model")  # as the saved file reads it
    if objective == "lambdarank":
        info["objective"] = objective
        import lightgbm

        ranker = lightgbm.LGBMRanker(**TREE_PARAMS)
        ranker.fit(ex.X, y.astype(int), group=invocation_sizes(ex))
        roots, feat, thr, left, right, val = tree_arrays(ranker.booster_.dump_model())
        draft = TreeReuseModel(list(FEATURES), np.array(roots), np.array(feat), np.array(thr), np.array(left),
                               np.array(right), np.array(val), (1.0, 0.0))
        cal = LogisticRegression(max_iter=5000, tol=1e-8).fit(draft.score(ex.X)[:, None], y)
        draft.calibration = (float(cal.coef_[0, 0]), float(cal.intercept_[0]))
        draft.meta = {**info, "trees": len(roots), **(meta or {})}
        return TreeReuseModel.from_dict(draft.to_dict(), "fitted model")  # as the saved file reads it
    mean = ex.X.mean(axis=0)
    scale = ex.X.std(axis=0)
    scale[scale == 0] = 1.0
    lr = LogisticRegression(C=c, max_iter=5000, tol=1e-8)
    lr.fit((ex.X - mean) / scale, y)
    info["C"] = c
    return ReuseModel(list(FEATURES), mean, scale, lr.coef_[0].copy(), float(lr.intercept_[0]), {**info, **(meta or {})})


def fit_traces(traces: list[Trace], out: str | Path, counter: TokenCounter, c: float = C,
               meta: dict | None = None, on_trace: Callable[[Trace], None] | None = None,
               label: str = LABELS[0], objective: str = OBJECTIVES[0]) -> AnyReuseModel:
    """Fit on ``traces`` with ``label`` (:data:`LABELS`) and ``objective`` (:data:`OBJECTIVES`) and
    write the model to ``out``; returns it.

    Raises:
        ValueError: as :func:`fit_examples`.
    """
    model = fit_examples(examples(traces, counter, on_trace), c, meta, label, objective)
    model.save(out)
    return model
