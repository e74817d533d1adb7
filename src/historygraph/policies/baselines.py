"""The simplest baselines of ContextRender B.2: Full history and Prune."""

from __future__ import annotations

from ..graph import ContextGraph
from ..render import Layout, Rendering, Selection
from .base import Signals, register


def newest_first(layout: Layout, kept: str, omitted: str) -> Selection:
    """Prune's rule (ContextRender B.2): results newest to oldest, each kept when it still fits in B;
    ``kept``/``omitted`` are the reasons recorded per result."""
    sel = layout.selection()
    for p in reversed(layout.candidates):
        if sel.fits(p):
            sel.take(p)
            layout.reasons[p] = kept
        else:
            layout.reasons[p] = omitted
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
