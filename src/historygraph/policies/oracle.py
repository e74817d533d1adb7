"""Clairvoyant selectors: the limit a selector can reach under the same budget (evaluator only).

Ours, beyond the papers. Both read the recorded future, so they are registered ``replay_only``:
:func:`~historygraph.policies.registry.create` builds them only for the evaluator, which sets
``upcoming`` before each rendering to the tool results that the recorded turn about to be
rendered for reuses, by the evaluator's own labelling rule (Later-Used Result Recall,
"ContextRender: From Execution Dependencies to Agent Context", arXiv:2609.37743, Appendix B.4).
Their recall is therefore the ceiling of that metric for a given layout.

* ``oracle`` renders under the standard :class:`~historygraph.render.Layout` (same budget scope,
  placeholders, step dropping and revival, token counts as every policy) and shows the upcoming
  reused results smallest cost first, skipping any that no longer fits, then the marked excerpts of
  reused results larger than B while room is left; nothing else is shown.
* ``oracle-omit`` may also leave out every unprotected step (an assistant message with its results)
  that holds no upcoming reused result, so the retained history is smaller and the dropping rule
  of :class:`~historygraph.render.Layout` rarely has to drop a step that holds one.

Comparing the two shows what the standard dropping rule costs; comparing ``oracle`` with a policy
shows how far that policy's choice is from the best choice under the same layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering
from historygraph.policies.base import PolicyError, Signals
from historygraph.policies.registry import register

SOURCE = "ours: clairvoyant bound under the shared Layout (ContextRender B.4 events)"


@dataclass(frozen=True)
class OracleConfig:
    """``omit_unused``: leave out unprotected steps that hold no upcoming reused result."""

    omit_unused: bool = False


class Oracle:
    """See the module docstring. ``upcoming`` must be set (by the evaluator) before each render.

    Raises:
        PolicyError: on render when no future was given (outside the evaluator).
    """

    Config = OracleConfig
    reads_future = True

    def __init__(self, name: str = "oracle", config: OracleConfig | None = None) -> None:
        self.name = name
        self.config = config or OracleConfig()
        self.upcoming: frozenset[int] | None = None

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        if self.upcoming is None:
            raise PolicyError(f"policy {self.name!r} needs the recorded future, which only `historygraph replay` has")
        reused = self.upcoming
        layout = Layout(graph, signals.counter, budget)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        assert budget is not None  # with no budget the history always fits (above)
        if self.config.omit_unused:
            keep = {layout.unit_of[p] for p in reused if p in layout.unit_of}
            omit = [u.positions[0] for i, u in enumerate(layout.units)
                    if not u.protected and i not in keep and graph.messages[u.positions[0]].role == "assistant"]
            layout = Layout(graph, signals.counter, budget, omit=omit)
            for p in omit:
                layout.reasons[p] = "left out: its step holds no result reused at this turn (clairvoyant)"
        sel = layout.selection()
        msgs = graph.messages
        # whole results first (an excerpt never counts as shown), then excerpts of oversized ones
        wanted = sorted((p for p in layout.candidates if p in reused),
                        key=lambda p: (layout.form[p] is not msgs[p], sel.cost(p), p))
        for p in wanted:
            if sel.fits(p):
                sel.take(p)
                layout.reasons[p] = "selected: reused at this turn (clairvoyant)"
            else:
                layout.reasons[p] = f"omitted: reused at this turn but showing it would add {sel.cost(p)} tokens, " \
                                    f"{budget - sel.used} were left"
        return layout.assemble(self.name, sel)


register("oracle", SOURCE, "Clairvoyant bound (replay only): shows the results the next turn reuses, smallest first, "
         "under the standard layout.", replay_only=True)(Oracle)
register("oracle-omit", SOURCE, "Clairvoyant bound (replay only): as oracle, and leaves out steps holding no reused "
         "result.", replay_only=True, omit_unused=True)(Oracle)
