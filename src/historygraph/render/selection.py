"""The running budget state of one greedy pass over a layout's candidates (:class:`Selection`):
tokens used, results taken and how they are shown, dropped steps revived (eq. 6 on the
assembled history)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from historygraph.history.events import Message
from historygraph.render._units import BULK_AFTER
from historygraph.render.markers import recent_brief_view, stub_for

if TYPE_CHECKING:
    from historygraph.render.layout import Layout

_STUBS = "render.stubs"  # graph.memo key: {(position, encoding): (short placeholder, its tokens)}


class Selection:
    """Running budget state of one greedy pass: tokens used and the dropped steps revived so far.

    ``cost(p)`` is the exact growth of the assembled history if result ``p`` is shown as
    ``layout.shown_cost`` says: its extra tokens over the placeholder, plus, when its step was
    dropped, the step's assistant message and its siblings' placeholders, and the change of the
    dropped-step markers around it (eq. 6 on the assembled history). Reviving a step changes the
    cost of reviving the other steps of its marker's run, so a caller caching costs recomputes
    those after :meth:`take` (``layout.dropped_units``).
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.used = layout.base_tokens
        self.revived = set()
        self.shown: dict[int, Message] = dict(layout.required)  # the newest results (§5.9), charged in the base
        # the compact form of the newest steps (revive_recent): their units, their results' short
        # placeholders (rendered while the result is not shown) with the tokens each saves over the
        # placeholder (added to the result's cost: showing it replaces the shorter stand-in), and their
        # assistant messages' short brief views, by unit
        self.recent: set[int] = set()
        self.stubs: dict[int, Message] = {}
        self.stub_savings: dict[int, int] = {}
        self.recent_briefs: dict[int, Message] = {}

    @property
    def revived(self) -> set[int]:
        """Dropped units brought back so far. Assigning a set (to roll a selection back) also
        rebuilds the dropped-step marker runs for it."""
        return self._revived

    @revived.setter
    def revived(self, units: set[int]) -> None:
        self._revived = units
        self._table: dict[int, int] | None = None  # every candidate's cost, once asked often (see cost)
        self._asked = 0
        self.runs = self.layout.runs.copy()
        for u in units:
            if self.runs.run_of(u) is not None:
                self.runs.remove(u)

    def cost(self, p: int, form: Message | None = None) -> int:
        """Tokens added by showing result ``p`` as ``form`` (default ``layout.form[p]``); 0 for a
        newest result (``layout.required``: shown already, charged in the base)."""
        lay = self.layout
        if p in lay.required:
            return 0
        if form is None or form is lay.form[p]:  # many questions between revivals: price every candidate at once
            if self._table is not None and (hit := self._table.get(p)) is not None:
                return hit
            self._asked += 1
            if self._asked > BULK_AFTER * 4 and p in lay.form:
                self._table = dict(zip(lay.candidates, self.candidate_costs().tolist()))
                return self._table[p]
        return self.exact_cost(p, form)

    def exact_cost(self, p: int, form: Message | None = None, index: int | None = None) -> int:
        """:meth:`cost` priced for ``p`` alone (no table of every candidate); ``index``: ``p``'s in
        ``layout.candidates`` when the caller has it (then read from the candidate arrays: the
        layout's candidate dicts are not built)."""
        lay = self.layout
        if p in lay.required:
            return 0
        if index is None:
            u = lay.unit_of[p]
            shown = lay.form[p]
        else:
            u, shown = lay.candidate_unit(index), lay.form_at(p, index)
        extra = 0
        if u in lay.dropped_units and u not in self.revived:
            extra = lay.revival_cost(u) + (self.runs.remove_delta(u) if self.runs.run_of(u) is not None else 0)
        if form is None or form is shown:
            delta = lay.delta[p] if index is None else lay.candidate_delta(index)
        else:
            delta = lay.counter.count_message(form) - lay.placeholder_tokens[p]
        if self.stub_savings:
            delta += self.stub_savings.get(p, 0)
        return delta + extra

    def lower_costs(self) -> np.ndarray:
        """A lower bound of ``[cost(p) for p in layout.candidates]`` (int64), exact for the results
        of steps not dropped: reviving a dropped step costs at least its own tokens less its run's
        whole marker plus the fewest tokens a marker can have (:attr:`MarkerPlan.floor`; 0 without
        a plan) for each side of it that stays a run. O(candidates) in numpy plus one marker per
        run, where :meth:`candidate_costs` prices every unit of every run."""
        lay = self.layout
        floor = lay._marker_floor()
        delta, unit = lay._candidate_arrays()
        extra = lay._revival_costs().copy()  # as in _priced, with each run's term added in place
        if self.revived:
            extra[list(self.revived)] = 0
        for a, b in self.runs.end.items():
            whole = lay._marker_tokens(a, b)
            if not floor or a == b:
                extra[a:b + 1] -= whole
            else:
                extra[a:b + 1] += 2 * floor - whole  # a marker left on each side
                extra[a] -= floor  # the first and last unit of the run leave one
                extra[b] -= floor
        return self._required_free(delta + extra[unit])

    def _required_free(self, costs: np.ndarray) -> np.ndarray:
        """``costs`` (per candidate) with the newest results' set to 0: shown already (§5.9), and a
        stubbed result's (:meth:`revive_recent`) raised by what its stub saves."""
        if self.stub_savings:
            for p, saved in self.stub_savings.items():
                costs[self.layout._index(p)] += saved
        if len(self.layout.required_index):
            costs[self.layout.required_index] = 0
        return costs

    def candidate_costs(self) -> np.ndarray:
        """``[cost(p) for p in layout.candidates]`` (int64), in bulk: each run of dropped steps is
        priced for all its units at once."""
        return self._priced(self.layout._remove_deltas)

    def _priced(self, run_term: Callable[[int, int], Any]) -> np.ndarray:
        """Each candidate's delta plus its unit's revival cost (0 for a unit not dropped or revived)
        plus ``run_term(a, b)`` over the units ``a … b`` of each run of dropped steps (a number, or
        one per unit)."""
        lay = self.layout
        delta, unit = lay._candidate_arrays()
        extra = lay._revival_costs().copy()  # 0 but for dropped units
        if self.revived:
            extra[list(self.revived)] = 0
        for a, b in self.runs.end.items():
            extra[a:b + 1] += run_term(a, b)
        return self._required_free(delta + extra[unit])

    def fits(self, p: int, form: Message | None = None) -> bool:
        lay = self.layout
        if lay.budget is None or p in lay.required:
            return True
        u = lay.unit_of[p]
        if form is None and u in lay.dropped_units and u not in self.revived \
                and (a := self.runs.run_of(u)) is not None:
            # a lower bound first: reviving the step costs at least its own tokens less the whole
            # marker of its run plus the fewest tokens of a marker per side of it left in the run;
            # most results of dropped steps fail on it, without pricing the markers the revival leaves
            b = self.runs.end[a]
            low = lay.delta[p] + lay.revival_cost(u) - lay._marker_tokens(a, b) + \
                lay._marker_floor() * ((u > a) + (u < b))
            if self.used + low > lay.budget:
                return False
        return self.used + self.cost(p, form) <= lay.budget

    def revive(self, u: int) -> int:
        """Bring back dropped unit ``u`` without showing any of its results (they stay placeholders):
        a step or user message cheaper than the dropped-step marker change its absence causes.
        Returns the tokens added (:meth:`exact_cost`'s revival term; 0 when ``u`` is not dropped or
        is back already)."""
        lay, revived = self.layout, self._revived
        if u not in lay.dropped_units or u in revived:
            return 0
        in_run = self.runs.run_of(u) is not None
        cost = lay.revival_cost(u) + (self.runs.remove_delta(u) if in_run else 0)
        if in_run:
            self.runs.remove(u)
        self.used += cost
        self._table, self._asked = None, 0
        revived.add(u)
        return cost

    def revive_recent(self, n: int, limit: int | None = None, total: int | None = None, brief: bool = True) -> int:
        """Show the ``n`` newest assistant messages (newest first, the latest one included, which is
        never dropped) with their tool calls, in a compact form: a dropped step comes back with its
        text in a short brief view (:data:`~historygraph.render.markers.RECENT_BRIEF`, when the layout
        has ``brief_revivals``, ``brief`` is true and it saves tokens; ``brief=False``: its text as
        stored, as invariant 10 asks), and the results of each of these steps that are not shown get
        a short placeholder (:data:`~historygraph.render.markers.STUB`, naming the id) instead of the
        full one. A step whose compact form would take the history over B, add more than ``limit``
        tokens, or take the tokens these steps add past ``total`` stays in its dropped-step marker
        (the older ones are still tried). So the agent sees what it just did (docs/architecture.md,
        invariant 10) for little more than its calls' tokens. Showing a stubbed result later costs
        what its stub saved too (:attr:`stub_savings`). Call it before any result is taken. Returns
        how many of the ``n`` are shown with their calls."""
        lay = self.layout
        msgs = lay.graph.messages
        seen = shown = 0
        start = self.used
        p = len(msgs) - 1
        while p >= 0 and seen < n:
            if msgs[p].role == "assistant":
                seen += 1
                u = lay.unit_at(p)
                cap = limit
                if total is not None:
                    left = total - (self.used - start)
                    cap = left if cap is None else min(cap, left)
                if u is None or u in self.recent or self._revive_compact(u, cap, brief):
                    shown += 1
            p -= 1
        return shown

    def _revive_compact(self, u: int, limit: int | None, in_brief: bool = True) -> bool:
        """Unit ``u`` in the compact form of :meth:`revive_recent` (brought back first when dropped);
        False, changing nothing, when that would take the history over B or add over ``limit`` tokens.
        ``in_brief``: a dropped step comes back in brief view when the layout allows it and it saves tokens."""
        lay = self.layout
        unit = lay.units[u]
        msgs = lay.graph.messages
        stubs: dict[int, Message] = {}
        savings: dict[int, int] = {}
        memo: dict[tuple[int, str], tuple[Message, int]] = lay.graph.memo(_STUBS, dict)
        cands = lay.candidates
        for q in unit.positions:
            if msgs[q].role != "tool" or q in self.shown or q not in lay.placeholder:
                continue
            i = bisect.bisect_left(cands, q)
            if i == len(cands) or cands[i] != q:  # (not one the selection may show: its placeholder stays)
                continue
            key = (q, lay.counter.encoding_name)
            hit = memo.get(key)
            if hit is None:
                stub = stub_for(msgs[q])
                hit = memo[key] = (stub, lay.counter.count_message(stub))
            saved = lay.placeholder_tokens[q] - hit[1]
            if saved > 0:
                stubs[q], savings[q] = hit[0], saved
        cost = -sum(savings.values())
        brief = None
        revives = u in lay.dropped_units and u not in self._revived
        if revives:
            cost += unit.cost
            view = recent_brief_view(lay.graph, lay.counter, unit.positions[0]) if lay.brief_revivals and in_brief else None
            if view is not None and view[0] > 0:
                cost -= view[0]
                brief = view[1]
            in_run = self.runs.run_of(u) is not None
            if in_run:
                cost += self.runs.remove_delta(u)
        if (lay.budget is not None and self.used + cost > lay.budget) or (limit is not None and cost > limit):
            return False
        if revives:
            if in_run:
                self.runs.remove(u)
            self._revived.add(u)
            if brief is not None:
                self.recent_briefs[u] = brief
        self.used += cost
        self.recent.add(u)
        self.stubs.update(stubs)
        self.stub_savings.update(savings)
        self._table, self._asked = None, 0
        return True

    def adopt_recent(self, other: Selection) -> None:
        """Take ``other``'s compact newest steps (:meth:`revive_recent`: units, stubs, short brief
        views; shared, they do not change after it), for a selection rebuilt from ``other``'s state
        (the exchange of :func:`~historygraph.policies.learned.policy.swap_pass`)."""
        self.recent, self.stubs, self.stub_savings, self.recent_briefs = \
            other.recent, other.stubs, other.stub_savings, other.recent_briefs
        self._table, self._asked = None, 0

    def take(self, p: int, form: Message | None = None, cost: int | None = None, *,
             index: int | None = None, unit: int | None = None) -> None:
        """Show result ``p`` as ``form``: by default ``layout.form[p]`` (the original, or the excerpt
        of an oversized one); a policy may pass a summary or its own stand-in, marked and naming
        the result id (docs/architecture.md, invariant §5.3). ``cost``: :meth:`cost` of it now, when
        the caller has priced it; ``index``: ``p``'s in ``layout.candidates``, and ``unit`` its unit,
        when the caller has those (then read from the candidate arrays: the layout's candidate
        dicts are not built)."""
        if p in self.layout.required:  # a newest result (§5.9): shown already, charged in the base
            return
        if cost is None:
            cost = self.cost(p, form)
        self.used += cost
        lay, revived = self.layout, self._revived
        if index is None:
            u = lay.unit_of[p]
        else:
            u = lay.candidate_unit(index) if unit is None else unit
        if u not in revived:
            if self.runs.run_of(u) is not None:
                self.runs.remove(u)
            if u in lay.dropped_units:  # costs change: the step is back
                self._table, self._asked = None, 0
            revived.add(u)
        if form is None:
            form = lay.form[p] if index is None else lay.form_at(p, index)
        self.shown[p] = form
