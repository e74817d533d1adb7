"""The simplest baselines of ContextRender B.2: Full history and Prune."""

from __future__ import annotations

import numpy as np

from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering, Selection
from historygraph.policies.base import Signals
from historygraph.policies.registry import register
from historygraph.policies.baselines.retrieval import taken_in_order


def newest_first(layout: Layout, kept: str, omitted: str) -> Selection:
    """Prune's rule (ContextRender B.2): results newest to oldest, each kept when it still fits in B;
    ``kept``/``omitted`` are the reasons recorded per result."""
    sel = layout.selection()
    cands = layout.candidates
    if layout.budget is None:
        for p in reversed(cands):
            sel.take(p)
            layout.reasons[p] = kept
        return sel
    # "newest to oldest, take each that fits": lower bounds of the costs skip what cannot fit, the
    # rest is priced exactly (retrieval.taken_in_order); a revival takes the bounds again
    n = len(cands)
    taken = [n - 1 - k for k in taken_in_order(layout, sel, cands[::-1], np.arange(n - 1, -1, -1))]  # newest first

    def fill(reasons: dict[int, str]) -> None:  # the reasons in the order the loop decided them
        top = len(cands) - 1
        for j in taken:
            for k in range(top, j, -1):
                reasons[cands[k]] = omitted
            reasons[cands[j]] = kept
            top = j - 1
        for k in range(top, -1, -1):
            reasons[cands[k]] = omitted
    layout.defer_reasons(fill)
    return sel


@register("full", "ContextRender B.2 (Full-history reference)",
          "Passes the entire accumulated history, even when it exceeds B (a reference, not a policy under budget).")
class FullHistory:
    def __init__(self, name: str = "full") -> None:
        self.name = name

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        r = Layout(graph, signals.counter, None).assemble_full(self.name)
        r.budget = budget  # reported against B, never enforced
        return r


@register("prune", "ContextRender B.2 (Prune)",
          "Keeps complete tool results from newest to oldest while they fit in B.")
class Prune:
    """Prune (ContextRender B.2): consider complete results newest to oldest and keep each one that
    still fits; one that does not fit is skipped and older ones are still tried (the paper says
    "retains those that fit"). Accounting is the shared :class:`~historygraph.render.Layout`."""

    def __init__(self, name: str = "prune") -> None:
        self.name = name

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        layout = Layout(graph, signals.counter, budget)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        sel = newest_first(layout, "kept: newest results first, fits", "omitted: does not fit after newer results")
        return layout.assemble(self.name, sel)
