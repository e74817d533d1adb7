"""The shared budget accounting of every policy (:class:`Layout`): budget scope, placeholders,
units dropped oldest first with their dropped-step markers and revival, oversized results as
excerpts, assembly of the rendering; the rules are those of :mod:`historygraph.render`."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Set as AbstractSet
from functools import cached_property
from typing import Callable, Iterable

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render._memo import brief_savings, token_memo
from historygraph.render._units import Runs, Spans, Unit, UnitsView, weakly
from historygraph.render.markers import brief_view, marker_message, oversized_excerpt, placeholder_for
from historygraph.render.order import loop_guard
from historygraph.render.rendering import BudgetTooSmallError, Rendering
from historygraph.render.selection import Selection
from historygraph.signals.tokens import TokenCounter

_DROP_WINDOW = 64  # markers priced at once by the oldest-first drop's search (Layout._first_within)
_DROP_ONE_BY_ONE = 4  # markers priced one at a time by that search before its first window
_RUNS_KEPT = 64  # runs' remove deltas kept per graph (Layout._remove_deltas); cleared when full

def _not_shown(tools: np.ndarray, full) -> np.ndarray:  # noqa: ANN001 - a list or an int64 array
    """The result positions of ``tools`` (ascending) that are not in ``full`` (a subset of them, in
    any order): the rendering's omitted results, a new array."""
    if not len(full):
        return tools.copy()
    keep = np.ones(len(tools), dtype=bool)
    keep[np.searchsorted(tools, full)] = False
    return tools[keep]

class Layout:
    """The shared budget accounting for one invocation over the whole ``graph``.

    After construction: ``candidates`` lists every stored tool result a policy may show,
    ``form[p]`` is how it is shown (the original, or for a result whose own cost exceeds B a
    head-and-tail excerpt of ``excerpt_fraction·B`` tokens: the oversized-result fallback of
    ContextRender A.4 with no LLM configured, applied for every policy), ``delta[p]`` is the extra
    cost of showing ``form[p]`` instead of the placeholder, and ``base_tokens`` the cost of the
    retained history with every result as a placeholder; ``excerpts`` lists the candidates whose
    ``form`` is that excerpt (ascending).

    When the retained non-tool history exceeds ``(1 − result_reserve)·B`` the oldest unprotected
    units are dropped until it fits (our decision where ContextRender A.4 is silent: without a
    reserve the assistant messages of a 100-step trace leave no room for any result). A dropped
    step stays a candidate: showing one of its results revives the step, and the revival is
    charged (see :class:`Selection`).

    Policies that leave history out or add synthetic messages say so here, so that the budget
    stays shared: ``omit`` lists positions whose (unprotected) units are left out entirely and are
    not candidates (``omit_units`` the same by unit index, as in ``units`` of a layout of the same graph) (e.g. covered by a summary, or a block a ReCAP baseline did not select);
    ``inserts`` maps a position to a synthetic message rendered right after it (e.g. a summary with
    ``rendered_as="summary"``), charged to B first, like the non-tool history; ``placeholder``
    builds the stand-in of an unshown result (it must name the result id, docs/architecture.md, invariant §5.3).

    Raises:
        BudgetTooSmallError: when ``budget`` cannot hold the protected history.
    """

    def __init__(self, graph: ContextGraph, counter: TokenCounter, budget: int | None,
                 result_reserve: float = 0.5, excerpt_fraction: float = 0.25, omit: Iterable[int] = (),
                 inserts: dict[int, Message] | None = None,
                 placeholder: Callable[[Message, TokenCounter], Message] | None = None,
                 brief_revivals: bool = False, omit_units: Iterable[int] = ()) -> None:
        self.graph, self.counter, self.budget = graph, counter, budget
        self.brief_revivals = brief_revivals
        self._brief: dict[int, tuple[int, Message | None]] = {}
        msgs = graph.messages
        self._reasons: dict[int, str] = {}
        self._pending: list[Callable[[dict[int, str]], None]] = []
        memo = token_memo(graph, counter, placeholder or placeholder_for)
        sk = memo.skeleton(graph, budget)
        self._memo = memo
        self._tools, self._tools_ph = memo.tools.view(), memo.tools_ph.view()
        self.current_user = sk["current_user"]
        self.first_user: int | None = sk["first_user"]  # position of the first user message
        self.last_assistant: int | None = sk["last_assistant"]  # position of the latest assistant message
        guard = memo.guard
        if guard is None or guard[0] != len(msgs):  # (the graph is append-only: a function of its length)
            guard = memo.guard = (len(msgs), loop_guard(graph, sk["users"]))
        self.loop_guard = guard[1]
        self.order: list[int] = sk["order"]
        self.outside: set[int] = sk["outside"]
        self._tokens = memo.tokens
        self._plan = memo.marker_plan
        self.placeholder: dict[int, Message] = sk["placeholder"]
        self._marks: dict[tuple[int, int], int] = {}
        self._facts: tuple[list[int], list[int], list[int], list[int], list[int]] | None = sk["facts"]
        arr = self._arr = sk["arrays"]
        self._costs: np.ndarray = arr["cost"]
        self._arrays: tuple[np.ndarray, np.ndarray, np.ndarray] = (arr["lo"], arr["hi"], arr["pre"])
        self._starts: list[int] = sk["starts"]
        self._breaks: list[int] = sk["breaks"]
        self._lo: list[int] = sk["facts"][0]  # each unit's message position, ascending (see _unit_at)
        self._build = sk["build"]
        self._sk_candidates: list[int] = sk["candidates"]
        self._dropped_mask = np.zeros(len(self._costs), dtype=bool)  # dropped_units as a mask (kept in step)
        self._bulk: dict[tuple[int, int], np.ndarray] = {}
        self._cand: tuple[np.ndarray, np.ndarray] | None = None
        self._revivals: np.ndarray | None = None
        self.synthetic: dict[int, list[Message]] = sk["synthetic"]  # assistant position -> synthetic results
        self.units: UnitsView = sk["units"]
        # protected: the first user message, the latest assistant message and the ones that keep the
        # active tool loop's opening on the wire (:func:`loop_guard`); the skeleton's units are shared,
        # so fresh copies
        protected_units = {u for p in (sk["first_user"], sk["last_assistant"], *self.loop_guard)
                           if p is not None and (u := self._unit_at(p)) is not None}
        for i in protected_units:
            u = self.units[i]
            self.units[i] = Unit(u.positions, True, u.cost)
        self._protected = sorted(protected_units)
        self.full_history_tokens = sk["full_tokens"]

        # units with a position in ``omit`` or listed in ``omit_units``, unprotected, inserted in
        # ascending order (as a scan of the units would)
        found = {u for p in set(omit) if (u := self._unit_at(p)) is not None or (u := self._skeleton_unit_of(p)) is not None}
        found.update(omit_units)
        left_out = set(sorted(found.difference(protected_units)))  # (inserted in ascending order, as before)
        if left_out:
            units = self.units

            def left_out_reasons(reasons: dict[int, str]) -> None:
                for i in left_out:
                    for p in units[i].positions:
                        reasons[p] = "left out by the policy"
            self.defer_reasons(left_out_reasons)
        self.inserts = dict(inserts or {})
        self.left_out = left_out
        # a set, or the spans of the oldest-first drop (:class:`Spans`) when the policy left nothing out
        dropped_units = set(left_out)
        self.dropped_units: AbstractSet[int] = dropped_units
        left_mask = None
        if left_out:
            self._dropped_mask[list(left_out)] = True
            left_mask = self._dropped_mask.copy()
        # Steps left out get a dropped-step marker where they were (docs/architecture.md, invariant §5.6), charged to B,
        # except those a policy stands in for with its own inserts (a summary names what it covers).
        self.runs = Runs(self._glue() if self.inserts else sk["glue"], weakly(self._marker_tokens), weakly(self._remove_deltas))
        if left_out and not self.inserts:
            self.runs.add_sorted(sorted(left_out))
        self.base_tokens = sk["total_cost"] - (int(self._costs[self._dropped_mask].sum()) if left_out else 0) + \
            sum(counter.count_message(m) for m in self.inserts.values()) + self.runs.total()
        if budget is not None and self.base_tokens > budget and not self.fits_in_full:
            # (when the complete history fits, nothing is dropped: placeholders can cost more than
            # the short results they stand for, and the unchanged history is rendered instead)
            target = int(budget * (1.0 - result_reserve))
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
                raise BudgetTooSmallError(budget, self.base_tokens)
        over = sk["over"]
        self._excerpt_forms: dict[int, Message] = {}  # candidate -> its excerpt, for the oversized ones
        if left_mask is not None:  # the skeleton's candidates whose unit is not left out (its unit array is in their order)
            self.candidates = list(itertools.compress(sk["candidates"], (~left_mask[arr["cand_unit"]]).tolist()))
            self.form = {p: msgs[p] for p in self.candidates}
            ph = self.placeholder_tokens
            self.delta = {p: self._tokens[p] - ph[p] for p in self.candidates}
        else:  # the skeleton's, for every candidate: ``form`` and ``delta`` built when first read
            self.candidates = sk["candidates"]
            self._cand = (arr["cand_delta"], arr["cand_unit"])
        self.excerpts: list[int] = []
        for p in over:  # a result whose own cost exceeds B is offered as an excerpt (ContextRender A.4)
            if left_mask is not None and p not in self.form:
                continue
            excerpt = oversized_excerpt(msgs[p], self.full_cost[p], budget, counter, excerpt_fraction)
            if excerpt is not None:  # always one for a candidate here: its cost exceeds B
                bisect.insort(self.excerpts, p)
                self._excerpt_forms[p] = excerpt
                self.reasons[p] = f"oversized: {self.full_cost[p]} tokens > B; offered as a marked excerpt"
                delta = counter.count_message(excerpt) - self.placeholder_tokens[p]
                if left_mask is not None:
                    self.form[p], self.delta[p] = excerpt, delta
                else:
                    assert self._cand is not None
                    if self._cand[0] is arr["cand_delta"]:  # shared with the skeleton: a copy of our own
                        self._cand = (self._cand[0].copy(), self._cand[1])
                    self._cand[0][bisect.bisect_left(self.candidates, p)] = delta

    def _candidate_maps(self) -> None:
        """Set :attr:`unit_of`, :attr:`form` and :attr:`delta` (those not set yet) from the
        skeleton's candidate dicts as of this layout's snapshot: shared with the skeleton while it
        is of the same build, else built from the snapshot's candidate arrays; the excerpts of
        results larger than B replace their complete forms in copies."""
        maps = self._memo.candidate_maps(self._build)
        if maps is None:
            cands, arr = self._sk_candidates, self._arr
            maps = (dict(zip(cands, arr["cand_unit"].tolist())), dict(zip(cands, map(self.graph.messages.__getitem__, cands))),
                    dict(zip(cands, arr["cand_delta"].tolist())))
        unit_of, forms, deltas = maps
        d = self.__dict__
        d.setdefault("unit_of", unit_of)
        if "form" not in d:  # (set in __init__, with "delta", when units are left out)
            if self._excerpt_forms:  # (then the candidate arrays are this layout's own, with the excerpts' deltas)
                assert self._cand is not None
                own = self._cand[0]
                forms = {**forms, **self._excerpt_forms}
                deltas = {**deltas, **{p: int(own[self._index(p)]) for p in self._excerpt_forms}}
            d["form"], d["delta"] = forms, deltas

    @cached_property
    def unit_of(self) -> dict[int, int]:
        """Every candidate's unit (index into :attr:`units`), by position; built when first read
        (shared with the graph's skeleton), with :attr:`form` and :attr:`delta`."""
        self._candidate_maps()
        return self.__dict__["unit_of"]

    @cached_property
    def form(self) -> dict[int, Message]:
        """Every candidate's form when shown: its complete message, or the marked excerpt of a
        result larger than B (:attr:`excerpts`); built when first read, as :attr:`unit_of`."""
        self._candidate_maps()
        return self.__dict__["form"]

    @cached_property
    def delta(self) -> dict[int, int]:
        """Every candidate's tokens shown as :attr:`form` less its placeholder's; built when first
        read, as :attr:`unit_of`."""
        self._candidate_maps()
        return self.__dict__["delta"]

    def _index(self, p: int) -> int:
        """Candidate ``p``'s index in :attr:`candidates`. Raises KeyError when ``p`` is not one."""
        cands = self.candidates
        i = bisect.bisect_left(cands, p)
        if i == len(cands) or cands[i] != p:
            raise KeyError(p)
        return i

    def _unit_at(self, p: int) -> int | None:
        """The unit whose first message is at position ``p``, None when no unit starts there."""
        lo = self._lo
        i = bisect.bisect_left(lo, p)
        return i if i < len(lo) and lo[i] == p else None

    def _skeleton_unit_of(self, p: int) -> int | None:
        """The unit of the skeleton's candidate ``p`` (None when ``p`` is not one), from the arrays."""
        cands = self._sk_candidates
        i = bisect.bisect_left(cands, p)
        return int(self._arr["cand_unit"][i]) if i < len(cands) and cands[i] == p else None

    def form_at(self, p: int, index: int) -> Message:
        """``form[p]`` for the candidate ``p`` at ``index`` in :attr:`candidates`, without building
        :attr:`form`."""
        forms = self.__dict__.get("form")
        if forms is not None:
            return forms[p]
        excerpt = self._excerpt_forms.get(p)
        return self.graph.messages[p] if excerpt is None else excerpt

    def candidate_unit(self, index: int) -> int:
        """``unit_of[candidates[index]]``, from the candidate arrays."""
        return int(self._candidate_arrays()[1][index])

    def candidate_delta(self, index: int) -> int:
        """``delta[candidates[index]]``, from the candidate arrays."""
        return int(self._candidate_arrays()[0][index])

    def candidate_units(self) -> np.ndarray:
        """Every candidate's unit, in :attr:`candidates` order (int64; do not change it)."""
        return self._candidate_arrays()[1]

    @cached_property
    def full_cost(self) -> dict[int, int]:
        """Every tool result's tokens in full, by position (the memo's, shared: built when a
        layout of the graph first reads it)."""
        return self._memo.result_tokens

    @cached_property
    def placeholder_tokens(self) -> dict[int, int]:
        """Every tool result's placeholder tokens, by position (shared as :attr:`full_cost`)."""
        return self._memo.ph_tokens

    @property
    def reasons(self) -> dict[int, str]:
        """Per-position explanation of the decisions so far (policies write theirs here). Reading
        it first applies what :meth:`defer_reasons` put off, in order, so every write lands as if
        made eagerly."""
        if self._pending:
            pending, self._pending = self._pending, []
            for fill in pending:
                fill(self._reasons)
        return self._reasons

    def defer_reasons(self, fill: Callable[[dict[int, str]], None]) -> None:
        """Put off writing reasons: ``fill(reasons)`` runs when :attr:`reasons` is next read, or
        when the rendering's reasons are (:meth:`assemble` passes pending fills on unread).
        ``fill`` must depend only on what it captured."""
        self._pending.append(fill)

    def unit_totals(self, per_position: np.ndarray) -> np.ndarray:
        """For every unit, the sum of ``per_position`` (int64, indexed by graph position) over its
        positions (int64)."""
        at, units = self._arr["order"], self._arr["entry_unit"]
        inside = units >= 0
        return np.bincount(units[inside], weights=per_position[at[inside]],
                           minlength=len(self.units)).astype(np.int64)

    @property
    def unit_costs(self) -> np.ndarray:
        """Every unit's tokens with its results as placeholders (``units[i].cost``; int64, read-only)."""
        return self._costs

    def unit_result_deltas(self) -> np.ndarray:
        """For every unit, the sum of ``delta`` over its candidate results (int64)."""
        delta, unit = self._candidate_arrays()
        return np.bincount(unit, weights=delta, minlength=len(self.units)).astype(np.int64)

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

    def _glue(self) -> list[bool]:
        """``glue[i]``: no rendered message (system, current user message, insert) sits between
        unit ``i − 1`` and unit ``i``, so one marker may stand for both when both are left out."""
        first = {u.positions[0]: i for i, u in enumerate(self.units)}
        unit_at = {p: i for i, u in enumerate(self.units) for p in u.positions}
        glue = [False] * len(self.units)
        apart = True
        for p in self.order:
            if p in first:
                glue[first[p]] = not apart
                apart = False
            elif p in self.outside:
                apart = True
            if p in self.inserts and p in unit_at:
                apart = True
        return glue

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

    def _candidate_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``delta`` and unit of every candidate, in ``candidates`` order (int64)."""
        if self._cand is None:
            n = len(self.candidates)
            self._cand = (np.fromiter((self.delta[p] for p in self.candidates), dtype=np.int64, count=n),
                          np.fromiter((self.unit_of[p] for p in self.candidates), dtype=np.int64, count=n))
        return self._cand

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

    @property
    def fits_in_full(self) -> bool:
        """True when the complete history fits in B (then it is rendered unchanged, A.1 line 6)."""
        return self.budget is None or self.full_history_tokens <= self.budget

    def selection(self) -> Selection:
        return Selection(self)

    def assemble_full(self, policy: str) -> Rendering:
        """The complete history, unchanged (ContextRender A.1 lines 6–7)."""
        if not self.dropped_units and not self.inserts and not self.excerpts:
            return self._assemble_whole(policy)
        sel = Selection(self)
        for p in self.candidates:
            sel.take(p)
        return self.assemble(policy, sel)

    def _assemble_whole(self, policy: str) -> Rendering:
        """:meth:`assemble` with every result shown complete, when nothing is dropped or left out,
        nothing inserted and every candidate's form is its stored message: the rendering is the
        render order itself (with the synthetic answers after their calls), built by slices from
        the skeleton, not message by message. Its history tokens are the skeleton's complete
        tokens (every unit complete, synthetic answers included), and nothing else is charged."""
        msgs, order, synthetic = self.graph.messages, self.order, self.synthetic
        get = msgs.__getitem__
        if synthetic:  # the synthetic answers of a unit's message follow it, before its results
            out: list[Message] = []
            positions: list[int | None] = []
            prev = 0
            starts = self._starts
            # (a synthetic answer follows an assistant message: a unit's first message)
            for at, p in sorted((starts[bisect.bisect_left(self._lo, p)] + 1, p) for p in synthetic):
                out += map(get, order[prev:at])
                positions += order[prev:at]
                out += synthetic[p]
                positions += [None] * len(synthetic[p])
                prev = at
            out += map(get, order[prev:])
            positions += order[prev:]
        else:
            out, positions = list(map(get, order)), list(order)
        order_arr, tools = self._arr["order"], self._tools
        is_tool = np.zeros(len(msgs), dtype=bool)
        is_tool[tools] = True
        full_arr = order_arr[is_tool[order_arr]]  # in render order, as assemble appends them
        dropped = np.zeros(0, dtype=np.int64)
        if self.graph.superseded:
            dropped = np.union1d(dropped, np.fromiter(self.graph.superseded, dtype=np.int64))
        history = self.full_history_tokens
        tokens = self._tokens
        total = history + sum(tokens[p] for p in self.outside)
        rendering = Rendering(policy=policy, budget=self.budget, messages=out, positions=positions,
                              full=full_arr.tolist(), omitted=[], dropped=[], history_tokens=history,
                              input_tokens=total)
        rendering.defer_positions(_not_shown(tools, full_arr), dropped)
        rendering.defer_reasons(self._reasons_builder(Selection(self), {}, [], []))
        return rendering

    def assemble(self, policy: str, selection: Selection) -> Rendering:
        """Build the rendering: results in ``selection.shown`` are rendered with the given message
        (the original for full, or an excerpt), other results of retained steps as placeholders,
        dropped steps that were not revived are left out. Chronological."""
        shown = selection.shown
        msgs = self.graph.messages
        # per order entry whether it is left out: its unit is dropped and not revived (a mask, as arrays)
        n_units = len(self._dropped_mask)
        idle = np.empty(n_units + 1, dtype=bool)  # one more, False: entries outside B have unit −1 (kept)
        idle[:n_units] = self._dropped_mask
        idle[n_units] = False
        if selection.revived:
            idle[list(selection.revived)] = False
        at = idle[self._arr["entry_unit"]]
        dropped_at = at.tolist() if self.inserts else at  # (the walk below steps over runs: few look-ups)
        dropped = self._arr["order"][at]
        if self.graph.superseded:
            dropped = np.union1d(dropped, np.fromiter(self.graph.superseded, dtype=np.int64))
        briefs = {self.units[u].positions[0]: b for u in selection.revived if u in self.dropped_units
                  if (b := self.brief(u)[1]) is not None}
        marks: list[tuple[int, str]] = []  # (result, reason) of placeholders and excerpts, in render order
        placeholders: list[int] = []  # the results rendered as their placeholder
        out: list[Message] = []
        positions: list[int | None] = []
        full: list[int] = []
        history = outside = 0  # tokens charged to B, tokens of system and current user messages
        pending: list[Message] = []  # inserts wait for the end of the step they follow
        count, tokens, placeholder = self.counter.count_message, self._tokens, self.placeholder

        def flush() -> None:
            nonlocal history
            for s in pending:
                out.append(s)
                positions.append(None)
                history += count(s)
            pending.clear()

        runs = selection.runs
        unit_at, order, starts, units, lo = self._unit_at, self.order, self._starts, self.units, self._lo
        n_lo, bisect_left = len(lo), bisect.bisect_left
        opening = self.loop_guard[-1] if self.loop_guard else None
        joined: list[int] = []  # text replies left out with the dropped steps after them (see close_run)
        last_marker: list[int] = []  # index in ``out`` and first unit of the latest marker

        def close_run(a: int) -> None:
            """Append the marker of the run of units ``a..runs.end[a]``. In the active tool loop (after
            its opening thinking block) a marker right after an assistant message without tool calls
            would be a wire user turn holding no tool result, and the provider's loop would begin
            after it, at an assistant message without the thinking block (docs/architecture.md,
            invariant §5.7). Such a reply (a late result is rendered before it, at its call) is
            left out with the run, and a marker right before it is merged."""
            nonlocal history
            b = runs.end[a]
            q = positions[-1] if positions else None
            if opening is not None and q is not None and q > opening and msgs[q].role == "assistant" \
                    and not msgs[q].tool_calls and unit_at(q) == a - 1:
                r = out.pop()
                positions.pop()
                history -= tokens[q] if r is msgs[q] else count(r)
                joined.append(q)
                a -= 1
                if last_marker and last_marker[0] == len(out) - 1 and runs.end.get(last_marker[1]) == a - 1:
                    out.pop()
                    positions.pop()
                    history -= self._marker_tokens(last_marker[1], a - 1)
                    a = last_marker[1]
            out.append(self.marker(a, b))
            positions.append(None)
            history += self._marker_tokens(a, b)
            last_marker[:] = [len(out) - 1, a]

        # without inserts, the entries of a run of marked units are those units' positions, one after
        # the other (no message outside B between them), all left out: the walk steps over them
        jump = not self.inserts
        open_run: int | None = None
        k, n_order = 0, len(order)
        while k < n_order:
            p = order[k]
            m = msgs[p]
            if m.role != "tool":
                if pending:
                    flush()
                i = bisect_left(lo, p)  # (what _unit_at says, inline: once per message walked)
                a = runs.run_of(i) if i < n_lo and lo[i] == p else None
                if open_run is not None and a != open_run:
                    close_run(open_run)
                    open_run = None
                if a is not None:
                    open_run = a
                    if jump:
                        last_unit = runs.end[open_run]
                        k = starts[last_unit] + len(units[last_unit].positions)
                        continue
            if not dropped_at[k]:
                if m.role == "tool":
                    ph = placeholder.get(p, m)
                    r = shown.get(p, ph)
                    if r is m:
                        full.append(p)
                        n = tokens[p]
                    else:
                        marks.append((p, "omitted: placeholder" if r.rendered_as == "placeholder" else "excerpt"))
                        if r is ph:  # (counted after the walk, from the memo's arrays)
                            placeholders.append(p)
                            n = 0
                        else:
                            n = count(r)
                else:
                    r = briefs.get(p, m)
                    n = tokens[p] if r is m else count(r)
                out.append(r)
                positions.append(p)
                if p in self.outside:
                    outside += n
                else:
                    history += n
                for s in self.synthetic.get(p, ()):
                    out.append(s)
                    positions.append(None)
                    history += count(s)
            if p in self.inserts:
                pending.append(self.inserts[p])
            k += 1
        flush()
        if open_run is not None:
            close_run(open_run)
        if placeholders:
            history += int(self._tools_ph[self._tools.searchsorted(placeholders)].sum())
        if joined:
            dropped = np.union1d(dropped, np.asarray(joined, dtype=np.int64))
        total = history + outside
        tools = self._tools
        rendering = Rendering(policy=policy, budget=self.budget, messages=out, positions=positions, full=full,
                              omitted=[], dropped=[], history_tokens=history, input_tokens=total)
        # (every result shown in full is one of the graph's results)
        rendering.defer_positions(_not_shown(tools, full), dropped)
        rendering.defer_reasons(self._reasons_builder(selection, briefs, marks, joined))
        return rendering

    def _reasons_builder(self, selection: Selection, briefs: dict[int, Message],
                         marks: list[tuple[int, str]], joined: list[int]) -> Callable[[], dict[int, str]]:
        """The rendering's reasons, built when first read, from what this call captures now
        (copies of what may still change: the policy's reasons, the revived units, the
        superseded results)."""
        base, pending = dict(self._reasons), list(self._pending)
        revived, superseded = set(selection.revived), dict(self.graph.superseded)
        msgs, units, dropped_units, left_out, outside = self.graph.messages, self.units, self.dropped_units, \
            self.left_out, self.outside

        def build() -> dict[int, str]:
            reasons = dict(base)
            for fill in pending:
                fill(reasons)
            for p, later in superseded.items():
                reasons[p] = f"superseded: a later result for the same call (message {later}) is rendered instead"
            why = "retained non-tool history over its share of the budget (oldest first)"
            for u in dropped_units - left_out:  # dropped for the share; a policy's own omissions keep its reason
                for p in units[u].positions:
                    if u in revived:
                        if msgs[p].role != "tool":
                            reasons.setdefault(p, f"kept{' in brief (its text left out)' if p in briefs else ''}: brought "
                                                  f"back because a result of its step is shown (the step was first dropped as {why})")
                    elif p not in reasons:
                        reasons[p] = f"dropped: {why}"
                    elif msgs[p].role == "tool":  # the policy's own choice for it did not take effect
                        reasons[p] = f"dropped with its step: {why}; the policy had decided: {reasons[p]}"
            for p in outside:
                reasons.setdefault(p, "outside B: " + ("system message" if msgs[p].role == "system" else "current user message"))
            for p, why_p in marks:
                reasons.setdefault(p, why_p)
            for p in joined:
                reasons[p] = ("left out with the dropped steps after it: their marker must not follow a text reply "
                              "inside the active tool loop (docs/architecture.md, invariant §5.7)")
            return reasons
        # the selection lives as long as the rendering's reasons may still be built: the reasons a
        # policy deferred may reach it through a weak reference (contextrender), so that the layout's
        # pending reasons do not hold it (selection -> layout -> pending -> selection: a cycle)
        build.selection = selection  # type: ignore[attr-defined]
        return build
