"""The simplest baselines of ContextRender B.2: Full history and Prune."""

from __future__ import annotations

import numpy as np

from ..graph import ContextGraph
from ..render import Layout, Rendering, Selection
from .base import Signals, register


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
    # the loop "newest to oldest, take each that fits", a take at a time: the costs of all
    # candidates are exact for the current revivals, so the next one taken is the newest older
    # one whose cost fits what is left; a revival changes costs, which are then priced again
    costs = sel.candidate_costs()
    taken: list[int] = []  # indices into cands, newest first; every other one from the newest down is omitted
    i = len(cands) - 1
    while i >= 0:
        fitting = np.flatnonzero(costs[:i + 1] <= layout.budget - sel.used)
        j = int(fitting[-1]) if len(fitting) else -1
        if j < 0:
            break
        p = cands[j]
        u = layout.unit_of[p]
        revives = u in layout.dropped_units and u not in sel.revived
        sel.take(p)
        taken.append(j)
        if revives:
            costs = sel.candidate_costs()
        i = j - 1

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
