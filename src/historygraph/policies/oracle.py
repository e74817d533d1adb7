"""Clairvoyant selectors: the limit a selector can reach under the same budget (evaluator only).

Ours, beyond the papers. They read the recorded future, so they are registered ``replay_only``:
:func:`~historygraph.policies.registry.create` builds them only for the evaluator, which sets
``upcoming`` before each rendering to the tool results that the recorded turn about to be
rendered for reuses, by the evaluator's own labelling rule (Later-Used Result Recall,
"ContextRender: From Execution Dependencies to Agent Context", arXiv:2609.37743, Appendix B.4).

* ``oracle``, the exact bound: at each call, the most of those results that any rendering our
  layouts allow can show complete within B, found by an integer program
  (:mod:`~historygraph.policies.oracle_program`). Its layout is the most permissive one of
  :class:`~historygraph.render.Layout`: every unprotected step dropped and free to come back
  (``result_reserve=1``), in brief view (``brief_revivals``), a step or user message brought back
  on its own when that costs less than its marker, each unshown result as the shorter of the
  standard placeholder and the observation-masking one
  (:func:`~historygraph.policies.baselines.windows.mask_placeholder`), each newest result that
  does not fit whole (invariant §5.9) as small an excerpt as the chosen selection needs, down to
  the smallest one the excerpt maker makes (a cache-stable re-selection at its low mark shows it
  smaller than the layout's share at B). Every policy on
  :class:`~historygraph.render.Layout` renders a history its program can price no lower (fewer
  steps kept, cheaper views, shorter placeholders), so no such policy shows more of a call's reused
  results; its recall is the ceiling of that metric, and "% of oracle" stays at or under 100.
* ``oracle-greedy`` renders under the standard layout (``result_reserve`` 0.5, full revivals,
  standard placeholders) and shows the upcoming reused results smallest cost first, skipping any
  that no longer fits: what a perfect ranking reaches with the shared greedy pass. Not a bound:
  ``learned``'s layout (brief revivals, 95 % of B for results) beats it on some calls.
* ``oracle-omit``: as ``oracle-greedy``, and leaves out every unprotected step that holds no
  upcoming reused result, so the dropping rule rarely drops a step that holds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering, excerpt_for, placeholder_for
from historygraph.policies.base import PolicyError, Signals
from historygraph.policies.baselines.windows import mask_placeholder
from historygraph.policies.oracle_program import best_selection
from historygraph.policies.registry import register
from historygraph.signals.tokens import TokenCounter

SOURCE = "ours: clairvoyant bound under the shared Layout (ContextRender B.4 events)"


def shortest_placeholder(message: Message, counter: TokenCounter) -> Message:
    """The shorter (in tokens) of the standard placeholder and the observation-masking one of
    ``message``; the standard one on a tie. Both name the result id (invariant §5.3)."""
    standard, masked = placeholder_for(message, counter), mask_placeholder(message, counter)
    return masked if counter.count_message(masked) < counter.count_message(standard) else standard


def excerpt_floors(layout: Layout) -> dict[int, tuple[int, int]]:
    """For each newest result ``layout`` shows as a marked excerpt (``Layout.required``):
    ``(the fewest tokens for which`` :func:`~historygraph.render.excerpt_for` ``still makes an
    excerpt of it, the tokens that excerpt saves against the layout's)``, by position; found by
    bisection (a larger allowance never yields less than an excerpt)."""
    counter, msgs, out = layout.counter, layout.graph.messages, {}
    for p, m in layout.required.items():
        if m.rendered_as != "excerpt":
            continue
        lo, hi = 1, counter.count_message(m)  # hi: the layout's own excerpt fits its tokens
        while lo < hi:
            mid = (lo + hi) // 2
            if excerpt_for(msgs[p], mid, counter, layout.focus).rendered_as == "excerpt":
                hi = mid
            else:
                lo = mid + 1
        out[p] = (hi, counter.count_message(m) - counter.count_message(excerpt_for(msgs[p], hi, counter, layout.focus)))
    return out


def cut_newest(layout: Layout, floors: dict[int, tuple[int, int]], tokens: int) -> int:
    """Cut the newest excerpts of ``layout`` (``floors``: :func:`excerpt_floors`) by at least
    ``tokens`` in all, the ones with most to give first, none below its floor; returns the tokens
    saved (:meth:`~historygraph.render.Layout.recut_newest`)."""
    saved = 0
    for p, (floor, most) in sorted(floors.items(), key=lambda kv: (-kv[1][1], kv[0])):
        if saved >= tokens:
            break
        now = layout.counter.count_message(layout.required[p])
        saved += layout.recut_newest(p, max(floor, now - min(most, tokens - saved)))
    return saved


class _Clairvoyant:
    """The future the evaluator gives: ``upcoming`` must be set before each render."""

    reads_future = True
    Config: ClassVar[type]
    default_name: ClassVar[str]

    def __init__(self, name: str = "", config: Any = None) -> None:
        self.name = name or self.default_name
        self.config = config or self.Config()
        self.upcoming: frozenset[int] | None = None

    def _future(self) -> frozenset[int]:
        if self.upcoming is None:
            raise PolicyError(f"policy {self.name!r} needs the recorded future, which only `historygraph replay` has")
        return self.upcoming


@dataclass(frozen=True)
class OracleConfig:
    """No parameters: the layout is the most permissive one (module docstring)."""


class Oracle(_Clairvoyant):
    """The exact bound (see the module docstring). ``upcoming`` must be set (by the evaluator)
    before each render. The rendering's ``stats`` carry ``solve_seconds`` (the program's CPU
    time, 0 when none was needed), ``priced_gap_tokens`` (rendered history tokens less the
    program's price: 0 when its costs are the renderer's), ``solver_gap`` and ``solver_stopped``
    (the solver's relative gap and 1 when its time limit stopped it, ``oracle_program.TIME_LIMIT``:
    then the call's figure is a lower bound of the exact one).

    Raises:
        PolicyError: on render when no future was given (outside the evaluator).
        BudgetTooSmallError: as :class:`~historygraph.render.Layout`.
    """

    Config = OracleConfig
    default_name = "oracle"

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        reused = self._future()
        layout = Layout(graph, signals.counter, budget, result_reserve=1.0, brief_revivals=True,
                        placeholder=shortest_placeholder, drop_all=True)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        assert budget is not None  # with no budget the history always fits (above)
        floors = excerpt_floors(layout)
        slack = sum(saved for _, saved in floors.values())
        choice = best_selection(layout, reused, newest_slack=slack)
        over = choice.tokens + slack - budget  # what the newest excerpts must give up for it
        price = choice.tokens + slack - (cut_newest(layout, floors, over) if over > 0 else 0)
        sel = layout.selection()
        for p in choice.shown:
            sel.take(p)
            if p in reused:
                layout.reasons[p] = "selected: reused at this turn (clairvoyant, exact)"
        for u in choice.revived:
            sel.revive(u)
        if sel.used > budget:  # the program's price was below the renderer's (see oracle_program)
            raise AssertionError(f"oracle: the program priced {price} tokens, the rendering has {sel.used} > B {budget}")
        for p in reused:
            if p in layout.unit_of and p not in sel.shown:
                layout.reasons[p] = (f"omitted: reused at this turn, but no rendering within B shows it beside the "
                                     f"{choice.hits} reused results shown")
        r = layout.assemble(self.name, sel)
        r.stats.update(solve_seconds=choice.seconds, priced_gap_tokens=r.history_tokens - price,
                       solver_gap=choice.gap, solver_stopped=int(choice.gap > 0))
        return r


@dataclass(frozen=True)
class GreedyOracleConfig:
    """``omit_unused``: leave out unprotected steps that hold no upcoming reused result."""

    omit_unused: bool = False


class GreedyOracle(_Clairvoyant):
    """``oracle-greedy`` and ``oracle-omit`` (see the module docstring). ``upcoming`` must be set
    (by the evaluator) before each render.

    Raises:
        PolicyError: on render when no future was given (outside the evaluator).
    """

    Config = GreedyOracleConfig
    default_name = "oracle-greedy"
    config: GreedyOracleConfig

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        reused = self._future()
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
                                    f"{budget - sel.used} of B unused"
        return layout.assemble(self.name, sel)


register("oracle", SOURCE, "Exact clairvoyant bound (replay only): the most results the next turn reuses that any "
         "rendering of our layouts shows within B (an integer program per call).", replay_only=True)(Oracle)
register("oracle-greedy", SOURCE, "Clairvoyant, greedy (replay only): shows the results the next turn reuses, smallest "
         "first, under the standard layout.", replay_only=True)(GreedyOracle)
register("oracle-omit", SOURCE, "Clairvoyant, greedy (replay only): as oracle-greedy, and leaves out steps holding no "
         "reused result.", replay_only=True, omit_unused=True)(GreedyOracle)
