"""What dropping and reviving steps costs, part of :class:`~historygraph.render.layout.Layout`
(:class:`StepPricing`, one of its bases): the tokens of the dropped-step marker of a run of units
(exact, from :class:`~historygraph.render.markers.MarkerPlan` when there is one), the marker
changes of reviving each unit of a run, priced in bulk, the revival cost of a dropped step (its
assistant message in brief view with ``brief_revivals``), and the drop itself: the oldest
unprotected units until the retained history fits its share of B (our decision where ContextRender
A.4 is silent, see :class:`~historygraph.render.layout.Layout`)."""

from __future__ import annotations

import bisect
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render._memo import brief_savings
from historygraph.render._units import Runs, Spans, UnitsView
from historygraph.render.markers import MarkerPlan, brief_view, marker_message
from historygraph.render.rendering import BudgetTooSmallError
from historygraph.signals.tokens import TokenCounter

if TYPE_CHECKING:
    from historygraph.render._memo import TokenMemo

_DROP_WINDOW = 64  # markers priced at once by the oldest-first drop's search (Layout._first_within)
_DROP_ONE_BY_ONE = 4  # markers priced one at a time by that search before its first window
_RUNS_KEPT = 64  # runs' remove deltas kept per graph (Layout._remove_deltas); cleared when full


class StepPricing:
    """The drop and pricing methods of a layout, over the layout's state (set by
    :class:`~historygraph.render.layout.Layout`; what these methods read is declared here)."""

    graph: ContextGraph
    counter: TokenCounter
    budget: int | None
    brief_revivals: bool
    units: UnitsView
    runs: Runs
    inserts: dict[int, Message]
    left_out: set[int]
    dropped_units: AbstractSet[int]
    base_tokens: int
    _memo: TokenMemo
    _build: int
    _plan: MarkerPlan | None
    _costs: np.ndarray  # each unit's cost with its results as placeholders
    _arrays: tuple[np.ndarray, np.ndarray, np.ndarray]  # each unit's lowest and highest position, prefix sums of calls
    _facts: tuple[list[int], list[int], list[int], list[int], list[int]] | None  # see _unit_facts
    _breaks: list[int]
    _protected: list[int]
    pin_names: list[str]
    _dropped_mask: np.ndarray
    _brief: dict[int, tuple[int, Message | None]]
    _marks: dict[tuple[int, int], int]
    _bulk: dict[tuple[int, int], np.ndarray]
    _revivals: np.ndarray | None

    def _drop_for_budget(self, result_reserve: float, protected_units: set[int], dropped_units: set[int],
                         need: int = 0) -> None:
        """Drop units until the retained history fits in ``(1 − result_reserve)·B``, and in
        ``B − need`` (the room the newest results need, invariant §5.9), or the protected history
        when more, oldest first: with units the policy left out, unit by unit (each joining the
        runs of markers around it), else a segment at a time (:meth:`_drop_oldest`).
        ``dropped_units``: the layout's set of dropped units (the policy's own). Raises
        :class:`~historygraph.render.rendering.BudgetTooSmallError` when the protected history
        alone is over B."""
        budget, left_out, counter = self.budget, self.left_out, self.counter
        assert budget is not None
        target = min(int(budget * (1.0 - result_reserve)), budget - need)
        protected = sum(self.units[i].cost for i in protected_units) + \
            sum(counter.count_message(m) for m in self.inserts.values())
        if left_out:
            for i, unit in enumerate(self.units):
                if self.base_tokens <= max(target, protected):
                    break
                if unit.protected or i in left_out:
                    continue
                self.base_tokens += self.runs.add_delta(i) - unit.cost
                self.runs.add(i)
                dropped_units.add(i)
                self._dropped_mask[i] = True
        else:
            self._drop_oldest(max(target, protected))
        if self.base_tokens > budget:
            raise BudgetTooSmallError(budget, self.base_tokens, self.pin_names)

    def _drop_oldest(self, limit: int) -> None:
        """Drop the oldest unprotected units until ``base_tokens ≤ limit`` (no unit left out by
        the policy, so no run yet), a segment at a time: within consecutive droppable units that
        share one marker, dropping units ``a..x`` leaves ``base − Σ cost(a..x) + marker(a, x)``,
        priced for every ``x`` at once; the first ``x`` within ``limit`` ends it, as unit by unit."""
        units, glue = self.units, self.runs.glue
        # the units starting a new marker (glue false), ascending: the skeleton's without inserts
        # (lent: entries from n on are of units added to the skeleton since)
        breaks = self._breaks if not self.inserts else None
        i, n = 0, len(units)
        while i < n and self.base_tokens > limit:
            if units[i].protected:
                i += 1
                continue
            # j: the last unit before the next one that starts a new marker (glue false) or is protected
            if breaks is not None:
                b = bisect.bisect_right(breaks, i)
                j = breaks[b] - 1 if b < len(breaks) and breaks[b] < n else n - 1
            else:
                try:
                    j = glue.index(False, i + 1) - 1
                except ValueError:
                    j = n - 1
            k = bisect.bisect_right(self._protected, i)
            if k < len(self._protected):
                j = min(j, self._protected[k] - 1)
            cost = self._costs[i:j + 1].cumsum()
            x, self.base_tokens = self._first_within(i, j, cost, limit)
            self.runs.set_run(i, x)
            spans = self.dropped_units
            if not isinstance(spans, Spans):
                spans = self.dropped_units = Spans()
            spans.add_span(i, x)
            self._dropped_mask[i:x + 1] = True
            i = j + 1

    def _first_within(self, i: int, j: int, cost: np.ndarray, limit: int) -> tuple[int, int]:
        """The first ``x`` in ``i..j`` for which dropping units ``i..x`` leaves ``base − cost[x − i] +
        marker(i, x) ≤ limit`` (``j`` when none does) and that base (``cost``: the running sums of
        the units' costs from ``i``). With a marker plan, markers are priced only from the first
        ``x`` that the fewest tokens a marker can have (:attr:`MarkerPlan.floor`) lets within
        ``limit`` (unit costs are never negative, so ``cost`` never falls), a window at a time."""
        base = self.base_tokens
        if self._plan is None:
            after = base - cost + self._prefix_costs(i, j)
            within = (after <= limit).nonzero()[0]
            x = i + int(within[0]) if len(within) else j
            return x, int(after[x - i])
        s, last = int(cost.searchsorted(base + self._marker_floor() - limit, side="left")), j - i
        # the first few one at a time (almost always the first that the floor lets within the limit:
        # a marker is a few tokens over the floor), then a window at a time
        for t in range(s, min(last, s + _DROP_ONE_BY_ONE - 1) + 1):
            after_t = base - int(cost[t]) + self._marker_tokens(i, i + t)
            if after_t <= limit or t == last:
                return i + t, after_t
        s += _DROP_ONE_BY_ONE
        while s <= last:
            e = min(last, s + _DROP_WINDOW - 1)
            after = base - cost[s:e + 1] + self._prefix_costs(i, i + e, i + s)
            within = (after <= limit).nonzero()[0]
            if len(within):
                return i + s + int(within[0]), int(after[within[0]])
            if e == last:
                return j, int(after[-1])
            s = e + 1
        return j, int(base - cost[last] + self._prefix_costs(i, j, j)[0])

    def revival_cost(self, u: int) -> int:
        """Tokens that bringing back dropped unit ``u`` adds: its whole cost, or with
        ``brief_revivals`` the cost with its assistant message in brief view (:meth:`brief`)."""
        return self.brief(u)[0]

    def brief(self, u: int) -> tuple[int, Message | None]:
        """``(revival cost, brief message or None)`` of unit ``u``. The brief view of an assistant
        message keeps its tool calls and replaces its text by :data:`BRIEF`, which names its
        message number and the tokens left out (ours, beyond the papers: reviving a step for one of its
        results then costs little more than the result). Only for messages with calls, no provider
        blocks (thinking, server tools) and text longer than the marker."""
        hit = self._brief.get(u)
        if hit is None:
            unit = self.units[u]
            hit = (unit.cost, None)
            view = brief_view(self.graph, self.counter, unit.positions[0]) if self.brief_revivals else None
            if view is not None and view[0] > 0:
                hit = (unit.cost - view[0], view[1])
            self._brief[u] = hit
        return hit

    def _marker_tokens(self, a: int, b: int) -> int:
        """Tokens of the marker standing for units ``a..b`` (memoised per layout)."""
        key = (a, b)
        n = self._marks.get(key)
        if n is None:
            n = self._fast_marker_tokens(a, b)
            if n is None:
                n = self.counter.count_message(self.marker(a, b))
            self._marks[key] = n
        return n

    def _marker_floor(self) -> int:
        """The fewest tokens any dropped-step marker has (:attr:`MarkerPlan.floor`), 0 without a
        plan (the bound then assumes nothing)."""
        return max(0, self._plan.floor) if self._plan is not None else 0

    def _fast_marker_tokens(self, a: int, b: int) -> int | None:
        """:meth:`_marker_tokens` from the per-graph :class:`MarkerPlan`, or ``None`` without one."""
        if self._plan is None:
            return None
        return self._plan.tokens(*self._marker_numbers(a, b))

    def _marker_numbers(self, a: int, b: int) -> tuple[int, int, int]:
        """First and last position and number of calls of units ``a..b``, from per-unit facts
        (a C-level max over the run at worst)."""
        lo, hi, top, _ncalls, pre = self._unit_facts()
        # units are in chronological order of their first message, which is each unit's lowest position
        return lo[a], (hi[top[b]] if top[b] >= a else max(hi[a:b + 1])), pre[b + 1] - pre[a]

    def marker(self, a: int, b: int) -> Message:
        """The dropped-step marker for units ``a..b`` (:func:`dropped_marker`, same message), built
        from per-unit facts, not O(run) Python: selection asks for the markers of many runs per render."""
        return marker_message(*self._marker_numbers(a, b))

    def _unit_facts(self) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
        """Per unit: lowest and highest position, the unit holding the highest position among
        units 0..i, the number of calls of its first message, and the prefix sums of those
        numbers (computed once per layout)."""
        if self._facts is None:
            msgs = self.graph.messages
            lo = [min(u.positions) for u in self.units]
            hi = [max(u.positions) for u in self.units]
            top: list[int] = []
            for i, h in enumerate(hi):
                top.append(i if not top or h >= hi[top[-1]] else top[-1])
            ncalls = [len(msgs[u.positions[0]].tool_calls) for u in self.units]
            pre = [0]
            for c in ncalls:
                pre.append(pre[-1] + c)
            self._facts = (lo, hi, top, ncalls, pre)
        return self._facts

    def _run_costs(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Marker tokens of the runs ``a..x`` and ``y..b`` for every ``x``, ``y`` in ``a..b``:
        ``P[x − a] = _marker_tokens(a, x)``, ``S[y − a] = _marker_tokens(y, b)`` (int64), with
        the :class:`MarkerPlan` terms gathered per unit (one by one without a plan)."""
        xs = np.arange(a, b + 1)
        plan = self._plan
        if plan is None:
            return (self._prefix_costs(a, b),
                    np.array([self._marker_tokens(y, b) for y in xs.tolist()], dtype=np.int64))
        lo, hi, pre = self._arrays
        n_s = pre[b + 1] - pre[xs]
        top_s = np.maximum.accumulate(hi[a:b + 1][::-1])[::-1]
        S = plan.const + plan.gather("first", lo[xs]) + plan.gather("last", top_s) + plan.gather("n", n_s)
        return self._prefix_costs(a, b), S

    def _prefix_costs(self, a: int, b: int, s: int | None = None) -> np.ndarray:
        """``P`` of :meth:`_run_costs` alone; from ``x = s`` on when ``s`` (``a ≤ s ≤ b``) is given."""
        s = a if s is None else s
        xs = np.arange(s, b + 1)
        plan = self._plan
        if plan is None:
            return np.array([self._marker_tokens(a, x) for x in xs.tolist()], dtype=np.int64)
        lo, hi, pre = self._arrays
        n_p = pre[xs + 1] - pre[a]
        top_p = np.maximum.accumulate(hi[s:b + 1])
        if s > a:  # the highest position of units a..x, for x from s
            top_p = np.maximum(top_p, hi[a:s].max())
        return plan.const + plan.number("first", int(lo[a])) + plan.gather("last", top_p) + plan.gather("n", n_p)

    def _remove_deltas(self, a: int, b: int) -> np.ndarray:
        """``[runs.remove_delta(i) for i in a..b]`` for the run ``a..b`` (int64, read-only), memoised
        per layout and, for a run before the last unit, per graph across renders
        (:attr:`TokenMemo.run_deltas`: consecutive renders drop mostly the same runs)."""
        out = self._bulk.get((a, b))
        if out is None:
            kept = self._memo.run_deltas
            key = (self._build, a, b)
            final = b < len(self._costs) - 1  # (the last unit may still gain results)
            out = kept.get(key) if final else None
            if out is None:
                P, S = self._run_costs(a, b)
                out = np.full(len(P), -P[-1], dtype=np.int64)
                out[1:] += P[:-1]
                out[:-1] += S[1:]
                out.flags.writeable = False
                if final:
                    if len(kept) >= _RUNS_KEPT:
                        kept.clear()
                    kept[key] = out
            self._bulk[(a, b)] = out
        return out

    def _revival_costs(self) -> np.ndarray:
        """:meth:`revival_cost` of every dropped unit (0 for the others), int64."""
        if self._revivals is None:
            if self.brief_revivals:  # a unit's cost less what the brief view of its first message saves
                saved = brief_savings(self.graph, self.counter)
                first = self._arrays[0]  # each unit's lowest position: its first message
                self._revivals = np.where(self._dropped_mask, self._costs - saved[first], 0)
            else:  # a unit's whole cost (:meth:`brief` without brief views)
                self._revivals = np.where(self._dropped_mask, self._costs, 0)
        return self._revivals
