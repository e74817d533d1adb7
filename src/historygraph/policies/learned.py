"""``learned``: show the results most likely to be reused, per token of budget (ours, beyond the papers).

1. If the complete history fits in B it is returned unchanged (as ContextRender, arXiv:2609.37743,
   A.1 lines 6–7), under the shared :class:`~historygraph.render.Layout` (budget scope,
   placeholders, step dropping and revival, oversized excerpts).
2. Each candidate result ``r`` gets ``p(r)``, the probability that the next invocation reuses one of
   its values, from a small fitted model (:class:`~historygraph.fit.model.ReuseModel`) over
   render-time features only (:mod:`historygraph.fit.features`: age, observed reuse of Tool-Flow
   Analysis and its recent history, lexical relevance, size, kind of call, ContextWeaver ancestry,
   superseding, unique values). The shipped model was fitted by ``historygraph fit`` on real
   mini-swe-agent trajectories (docs/results.md gives the command and the cross-validation).
3. Selection is a 0/1 knapsack: maximise ``Σ p(r)`` (the expected number of reused results shown)
   subject to the assembled history staying within B, where a result costs its extra tokens over
   its placeholder plus, for a result of a dropped step, the step's revival
   (:class:`~historygraph.render.Selection`). Solved greedily by ``p(r) / cost(r)`` (highest first,
   ties to the older result), then the single most probable result that fits is swapped in if it
   alone beats the greedy set (the classic guarantee of half the optimum); a second pass retries
   what did not fit, since revivals make later costs smaller. An oversized result is offered as its
   marked excerpt, valued at ``excerpt_value·p``. Results with ``p < min_probability`` are not shown
   (fewer tokens sent when nothing else is likely to be needed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fit.features import feature_matrix
from ..fit.model import ReuseModel
from ..graph import ContextGraph
from ..render import Layout, Rendering, Selection
from .base import Signals, register

SOURCE = "ours: fitted reuse probability (render-time features incl. ContextRender TFA) + knapsack under B"


@dataclass(frozen=True)
class LearnedConfig:
    """``model``: path of a model file written by ``historygraph fit`` (``""``: the shipped default).
    ``min_probability``: results less likely to be reused are not shown. ``excerpt_value``: the
    value of an oversized result's excerpt relative to the whole result."""

    model: str = ""
    min_probability: float = 0.0
    excerpt_value: float = 0.5
    oversized_excerpt_fraction: float = 0.25

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_probability < 1.0:
            raise ValueError(f"learned config: min_probability must be in [0, 1), got {self.min_probability}")
        if not 0.0 <= self.excerpt_value <= 1.0:
            raise ValueError(f"learned config: excerpt_value must be in [0, 1], got {self.excerpt_value}")
        if not 0 < self.oversized_excerpt_fraction <= 1:
            raise ValueError("learned config: oversized_excerpt_fraction must be in (0, 1]")


def knapsack_select(candidates: list[int], value: dict[int, float], sel: Selection) -> list[int]:
    """Greedy 0/1 knapsack on ``value[p] / sel.cost(p)`` with the best-single-item swap (see module
    docstring, step 3); fills ``sel`` and returns the positions taken, in selection order. Items with
    value ≤ 0 are never taken. Costs below one token count as one."""
    items = [p for p in candidates if value[p] > 0]
    order = sorted(items, key=lambda p: (-value[p] / max(1, sel.cost(p)), p))
    base_used, base_revived, base_shown = sel.used, set(sel.revived), dict(sel.shown)
    taken: list[int] = []
    left: list[int] = []
    for p in order:
        if sel.fits(p):
            sel.take(p)
            taken.append(p)
        else:
            left.append(p)
    for p in sorted(left, key=lambda p: (-value[p] / max(1, sel.cost(p)), p)):  # revivals may have made room
        if sel.fits(p):
            sel.take(p)
            taken.append(p)
    best = max((p for p in items if sel.layout.budget is None or base_used + _alone(sel, p, base_revived) <= sel.layout.budget),
               key=lambda p: (value[p], -p), default=None)
    if best is not None and value[best] > sum(value[p] for p in taken):
        sel.used, sel.revived, sel.shown = base_used, set(base_revived), dict(base_shown)
        sel.take(best)
        return [best]
    return taken


def _alone(sel: Selection, p: int, revived: set[int]) -> int:
    """Cost of ``p`` when nothing else is shown (its step's revival included)."""
    lay = sel.layout
    u = lay.unit_of[p]
    return lay.delta[p] + (lay.units[u].cost if u in lay.dropped_units and u not in revived else 0)


class Learned:
    """The learned selector (see module docstring). The model file is read once per instance.

    Raises:
        historygraph.fit.model.ReuseModelError: the configured model file cannot be used.
    """

    Config = LearnedConfig

    def __init__(self, name: str = "learned", config: LearnedConfig | None = None) -> None:
        self.name = name
        self.config = config or LearnedConfig()
        self.model = ReuseModel.load(self.config.model)

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget, excerpt_fraction=cfg.oversized_excerpt_fraction)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        cands = layout.candidates
        msgs = graph.messages
        prob = self.model.predict(feature_matrix(graph, cands, signals.counter)) if cands else np.zeros(0)
        value: dict[int, float] = {}
        for p, pr in zip(cands, prob):
            v = float(pr) if pr >= cfg.min_probability else 0.0
            value[p] = v * cfg.excerpt_value if layout.form[p] is not msgs[p] else v
        sel = layout.selection()
        taken = knapsack_select(cands, value, sel)
        chosen = set(taken)
        for rank, p in enumerate(taken, 1):
            kind = "excerpt of oversized result" if layout.form[p] is not msgs[p] else "selected"
            layout.reasons[p] = f"{kind} #{rank}: reuse probability {value[p]:.3f}, {sel.cost(p)} tokens"
        for p in cands:
            if p not in chosen:
                why = (f"reuse probability {value[p]:.3f} below min_probability {cfg.min_probability:g}"
                       if value[p] == 0 else f"reuse probability {value[p]:.3f}; showing it costs {sel.cost(p)} tokens, "
                       f"{budget - sel.used} were left")
                layout.reasons[p] = f"omitted: {why}"
        return layout.assemble(self.name, sel)


register("learned", SOURCE, "Fitted reuse probability per result from render-time signals; knapsack on probability "
         "per token under B.")(Learned)
