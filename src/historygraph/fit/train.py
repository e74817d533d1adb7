"""``historygraph fit``: fit the learned selector's reuse model on recorded traces.

Examples come from :func:`historygraph.fit.dataset.trace_examples` (render-time features only).
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
below ContextRender, so they are options, not the default (docs/learned.md). The model is scikit-learn's
``LogisticRegression`` (L2, ``C`` below, ``lbfgs``) on features standardised with the training mean
and standard deviation; it is written as a small JSON file that :class:`~historygraph.fit.model.ReuseModel`
reads with numpy alone. The fit is deterministic: the same traces and options give the same file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..events import Trace
from ..signals.tokens import TokenCounter
from .dataset import Examples, trace_examples
from .features import FEATURES
from .model import ReuseModel

C = 1.0  # inverse L2 strength; chosen by leave-trajectories-out cross-validation on the 90 training trajectories (docs/learned.md)


def examples(traces: Iterable[Trace], counter: TokenCounter,
             on_trace: Callable[[Trace], None] | None = None) -> Examples:
    parts = []
    for g, tr in enumerate(traces):
        parts.append(trace_examples(tr, counter, group=g))
        if on_trace:
            on_trace(tr)
    return Examples.concat(parts)


LABELS = ("reuse-or-named", "values-or-named", "named", "reuse")  # the shipped recipe first (module docstring)


def labels(ex: Examples, label: str = LABELS[0]) -> np.ndarray:
    """The 0/1 label of every row of ``ex`` under ``label`` (one of :data:`LABELS`), shape ``(n,)``.

    Raises:
        ValueError: an unknown label.
    """
    if label not in LABELS:
        raise ValueError(f"unknown label {label!r}; choose one of {', '.join(LABELS)}")
    if label == "values-or-named":
        return np.maximum(ex.valued, ex.named)
    if label == "reuse-or-named":
        return np.maximum(ex.reused, ex.named)
    return ex.named if label == "named" else ex.reused


def fit_examples(ex: Examples, c: float = C, meta: dict | None = None, label: str = LABELS[0]) -> ReuseModel:
    """Fit the model on ``ex`` (needs scikit-learn); ``label`` is one of :data:`LABELS`.

    Raises:
        ValueError: an unknown label, or no positive or no negative example (nothing to learn from).
    """
    from sklearn.linear_model import LogisticRegression

    y = labels(ex, label)
    if len(y) == 0 or y.min() == y.max():
        hint = (" (label 'named' counts code identifiers only; for an agent that repeats other values, such as "
                "order numbers, fit with label 'values-or-named')" if label == "named" and len(y) else "")
        raise ValueError(f"cannot fit a reuse model on {len(y)} examples with {int(y.sum())} reused: the traces need "
                         f"tool results, some of them reused later (values repeated by later tool calls or messages)"
                         f"{hint}")
    mean = ex.X.mean(axis=0)
    scale = ex.X.std(axis=0)
    scale[scale == 0] = 1.0
    lr = LogisticRegression(C=c, max_iter=5000, tol=1e-8)
    lr.fit((ex.X - mean) / scale, y)
    info = {"examples": int(len(y)), "reused": int(y.sum()), "traces": int(len(np.unique(ex.group))), "C": c,
            "label": label}
    return ReuseModel(list(FEATURES), mean, scale, lr.coef_[0].copy(), float(lr.intercept_[0]), {**info, **(meta or {})})


def fit_traces(traces: list[Trace], out: str | Path, counter: TokenCounter, c: float = C,
               meta: dict | None = None, on_trace: Callable[[Trace], None] | None = None,
               label: str = LABELS[0]) -> ReuseModel:
    """Fit on ``traces`` with ``label`` (:data:`LABELS`) and write the model to ``out``; returns it.

    Raises:
        ValueError: as :func:`fit_examples`.
    """
    model = fit_examples(examples(traces, counter, on_trace), c, meta, label)
    model.save(out)
    return model
