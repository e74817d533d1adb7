"""The shared budget accounting of every policy (:class:`Layout`): budget scope, placeholders,
units dropped oldest first with their dropped-step markers and revival, oversized results as
excerpts; the rules are those of :mod:`historygraph.render`. One class in three modules, by what
each part does: its state and candidates here, what dropping and reviving steps costs in
:mod:`~historygraph.render.pricing`, the rendering built from a selection in
:mod:`~historygraph.render.assemble`."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Set as AbstractSet
from functools import cached_property
from typing import Any, Callable, Iterable

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render._memo import TokenMemo, token_memo
from historygraph.render._units import Runs, Unit, weakly
from historygraph.render.assemble import Assembly
from historygraph.render.focus import FOCUS_MESSAGES, focus_values
from historygraph.render.markers import EXCERPT_MARK, excerpt_for, oversized_excerpt, placeholder_for
from historygraph.render.order import loop_guard
from historygraph.render.plan import latest_plan
from historygraph.render.rendering import BudgetTooSmallError, Rendering
from historygraph.render.selection import Selection
from historygraph.signals.tokens import TokenCounter


class Layout(Assembly):
    """The shared budget accounting for one invocation over the whole ``graph``.

    After construction: ``candidates`` lists every stored tool result a policy may show,
    ``form[p]`` is how it is shown (the original, or for a result whose own cost exceeds B a
    marked excerpt of ``excerpt_fraction·B`` tokens: the oversized-result fallback of
    ContextRender A.4 with no LLM configured, applied for every policy; focused on the lines that
    hold the values of :attr:`focus`, the last ``excerpt_focus`` assistant messages' and the
    current user message's, else head and tail: :func:`~historygraph.render.markers.excerpt_for`), ``delta[p]`` is the extra
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

    ``drop_all`` drops the unprotected units (to ``(1 − result_reserve)·B``, so every one with
    ``result_reserve=1``) even when the retained history fits in B: a selection then brings back
    exactly the steps it wants (the exact bound, :mod:`historygraph.policies.oracle`).

    **The newest results** (docs/architecture.md, invariant §5.9): the results of the latest
    assistant message, the output the coming call answers, are shown whatever the policy selects:
    ``required`` maps each to the form it is shown in, charged in ``base_tokens`` (they stay
    candidates, at cost 0 in every :class:`Selection`): complete, or, when they do not all
    fit beside the protected history, a marked excerpt naming the id (the larger ones first cut to
    an equal share of what B leaves; a result larger than B is its oversized excerpt). Steps are
    dropped (oldest first) to make room for them before anything is cut.

    **The execution state** (docs/architecture.md, invariant §5.10): the assistant message that
    made the agent's latest plan call (Claude Code's ``TodoWrite``, Codex's ``update_plan``:
    :mod:`~historygraph.render.plan`) is protected like the latest assistant message, its
    arguments being the agent's whole current plan; superseded plans are ordinary history.

    **Pins** (docs/architecture.md, "Pins"): an item pinned in the graph (:attr:`ContextGraph.pins`)
    is protected like the latest assistant message: a pinned message's unit, and the unit of a
    pinned result's call, are never dropped nor left out, and a pinned result is in ``required``
    in its complete form (never cut to an excerpt), charged before the newest results share what
    is left.

    Raises:
        ValueError: when ``excerpt_focus`` is negative.
        BudgetTooSmallError: when ``budget`` cannot hold the protected history, the pinned results
            whole and an excerpt of each newest result (naming the pins when there are any).
    """

    def __init__(self, graph: ContextGraph, counter: TokenCounter, budget: int | None,
                 result_reserve: float = 0.5, excerpt_fraction: float = 0.25, omit: Iterable[int] = (),
                 inserts: dict[int, Message] | None = None,
                 placeholder: Callable[[Message, TokenCounter], Message] | None = None,
                 brief_revivals: bool = False, omit_units: Iterable[int] = (), drop_all: bool = False,
                 excerpt_focus: int = FOCUS_MESSAGES, recent_steps: int = 0) -> None:
        if excerpt_focus < 0:
            raise ValueError(f"Layout: excerpt_focus must be >= 0, got {excerpt_focus}")
        if recent_steps < 0:
            raise ValueError(f"Layout: recent_steps must be >= 0, got {recent_steps}")
        self.recent_steps = recent_steps
        self.graph, self.counter, self.budget = graph, counter, budget
        self.excerpt_focus = excerpt_focus
        self.brief_revivals = brief_revivals
        self._brief: dict[int, tuple[int, Message | None]] = {}
        self._reasons: dict[int, str] = {}
        self._pending: list[Callable[[dict[int, str]], None]] = []
        memo = token_memo(graph, counter, placeholder or placeholder_for)
        sk = memo.skeleton(graph, budget)
        self._take_skeleton(memo, sk)
        self.pinned: list[int] = graph.pinned() if graph.pins else []  # positions, as rendered
        self.pin_names = [graph.item_id(p) for p in self.pinned]
        self.plan = latest_plan(graph)  # the agent's latest todo list or plan (§5.10): its message is protected
        protected_units = self._protect(sk)
        left_out = self._leave_out(omit, omit_units, protected_units)
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
        newest = self._newest_results(sk)
        pinned = self._pinned_results(sk)
        whole = set(pinned)
        need = self._newest_need([p for p in newest if p not in whole], excerpt_fraction) + \
            sum(self.full_cost[p] - self.placeholder_tokens[p] for p in pinned)
        if budget is not None and (self.base_tokens + need > budget or drop_all) and not self.fits_in_full:
            # (when the complete history fits, nothing is dropped: placeholders can cost more than
            # the short results they stand for, and the unchanged history is rendered instead)
            self._drop_for_budget(result_reserve, protected_units, dropped_units, need)
        self._offer_candidates(sk, left_mask, excerpt_fraction)
        self.required: dict[int, Message] = {}
        self.required_index = np.zeros(0, dtype=np.int64)  # their indices in ``candidates``
        if (newest or pinned) and budget is not None:
            self._require_newest([p for p in newest if p not in whole], pinned)

    def _newest_results(self, sk: dict[str, Any]) -> list[int]:
        """Positions of the latest results of the latest assistant message's calls (§5.9), ascending."""
        last, graph = sk["last_assistant"], self.graph
        if last is None:
            return []
        cands = set(sk["candidates"])
        return sorted(p for c in graph.messages[last].tool_calls if (p := graph.result_of.get(c.id)) is not None and p in cands)

    def _pinned_results(self, sk: dict[str, Any]) -> list[int]:
        """Positions of the pinned tool results that are candidates, ascending."""
        if not self.pinned:
            return []
        msgs, cands = self.graph.messages, sk["candidates"]
        return [p for p in self.pinned if msgs[p].role == "tool"
                and (i := bisect.bisect_left(cands, p)) < len(cands) and cands[i] == p]

    def _newest_need(self, newest: list[int], excerpt_fraction: float) -> int:
        """Tokens that showing the newest results adds to their placeholders (a result larger than
        B counted as its oversized excerpt)."""
        if not newest or self.budget is None:
            return 0
        ph, full, budget = self.placeholder_tokens, self.full_cost, self.budget
        return sum(min(full[p], max(16, int(excerpt_fraction * budget))) - ph[p] if full[p] > budget else full[p] - ph[p]
                   for p in newest)

    def _require_newest(self, newest: list[int], pinned: list[int]) -> None:
        """Show the pinned results complete and the newest results (those not pinned) whatever the
        policy selects and charge them in ``base_tokens``: the pinned first, then each newest in the
        largest form that fits (:meth:`_fit_newest`), complete when the whole history fits in B
        (placeholders priced above B do not matter then: nothing is left out). Raises
        BudgetTooSmallError when the pinned results and an excerpt of each newest one do not fit."""
        budget, counter, ph = self.budget, self.counter, self.placeholder_tokens
        assert budget is not None
        msgs = self.graph.messages
        pin_cost = sum(self.full_cost[p] - ph[p] for p in pinned)
        for p in pinned:
            self.reasons[p] = "pinned: shown whole in every rendering"

        def too_small() -> BudgetTooSmallError:
            return BudgetTooSmallError(budget, self.base_tokens + pin_cost + sum(self._least_excerpt(q) - ph[q] for q in newest),
                                       self.pin_names)
        forms = {p: self._excerpt_forms.get(p, msgs[p]) for p in newest}
        cost = {p: counter.count_message(forms[p]) if p in self._excerpt_forms else self.full_cost[p] for p in newest}
        if not self.fits_in_full:  # (when it fits, every policy returns it unchanged, §5.5: the newest results complete)
            self._fit_newest(newest, forms, cost, budget - self.base_tokens - pin_cost, too_small)
        self.base_tokens += pin_cost + sum(cost[p] - ph[p] for p in newest)
        forms.update((p, msgs[p]) for p in pinned)
        self.required = forms
        self.required_index = np.asarray(sorted(self._index(p) for p in forms), dtype=np.int64)

    def _fit_newest(self, newest: list[int], forms: dict[int, Message], cost: dict[int, int], room: int,
                    too_small: Callable[[], BudgetTooSmallError]) -> None:
        """Cut the newest results in ``forms`` (their ``cost`` in tokens updated in place) to fit
        ``room`` tokens beside their placeholders: each in the largest form that fits, complete, else
        an excerpt of an equal share of what is left, smallest results first. Raises ``too_small()``
        when an excerpt of each does not fit."""
        counter, msgs = self.counter, self.graph.messages
        left = room + sum(self.placeholder_tokens[p] for p in newest)  # tokens for the newest results themselves
        if left < 0:
            raise too_small()
        for i, p in enumerate(sorted(newest, key=lambda q: (cost[q], q))):
            share = left // (len(newest) - i)
            if cost[p] > share or forms[p].rendered_as == "placeholder":  # (an oversized excerpt too small for any text)
                forms[p] = excerpt_for(msgs[p], share, counter, self.focus)
                if forms[p].rendered_as != "excerpt":  # too small for the marker and some text
                    raise too_small()
                cost[p] = counter.count_message(forms[p])
                self.reasons[p] = (f"newest result (the output the next call answers, invariant §5.9): {self.full_cost[p]} "
                                   f"tokens do not fit beside the protected history; shown as a marked excerpt")
            left -= cost[p]

    def recut_newest(self, p: int, max_tokens: int) -> int:
        """Show newest result ``p`` (shown as a marked excerpt in ``required``) as an excerpt of at
        most ``max_tokens`` tokens (the whole message) instead, charged in ``base_tokens``; returns
        the tokens saved. For the exact bound (:mod:`historygraph.policies.oracle`): a policy may
        show a newest result as a smaller excerpt than this layout's share (a cache-stable
        re-selection at its low mark). Call it before :meth:`selection`.

        Raises:
            ValueError: when ``p`` is not a newest result shown as an excerpt, or ``max_tokens``
                cannot hold the marker and some of its text.
        """
        old = self.required.get(p)
        if old is None or old.rendered_as != "excerpt":
            raise ValueError(f"recut_newest: position {p} is not a newest result shown as an excerpt")
        new = excerpt_for(self.graph.messages[p], max_tokens, self.counter, self.focus)
        if new.rendered_as != "excerpt":
            raise ValueError(f"recut_newest: {max_tokens} tokens cannot hold an excerpt of position {p}")
        saved = self.counter.count_message(old) - self.counter.count_message(new)
        self.required[p] = new
        self.base_tokens -= saved
        self.reasons[p] = (f"newest result (invariant §5.9): {self.full_cost[p]} tokens shown as a marked excerpt "
                           f"of {max_tokens} tokens at most")
        return saved

    def _take_skeleton(self, memo: TokenMemo, sk: dict[str, Any]) -> None:
        """The layout's state from the graph's token memo and a snapshot ``sk`` of its skeleton
        (:meth:`~historygraph.render._memo.TokenMemo.skeleton`)."""
        graph = self.graph
        msgs = graph.messages
        self._memo = memo
        self._tools, self._tools_ph = memo.tools.view(), memo.tools_ph.view()
        self.current_user = sk["current_user"]
        self.first_user: int | None = sk["first_user"]  # position of the first user message
        self.last_assistant: int | None = sk["last_assistant"]  # position of the latest assistant message
        guard = memo.guard
        if guard is None or guard[0] != len(msgs):  # (the graph is append-only: a function of its length)
            guard = memo.guard = (len(msgs), loop_guard(graph, sk["users"]))
        self.loop_guard = guard[1]
        self.order = sk["order"]
        self.outside = sk["outside"]
        self._tokens = memo.tokens
        self._plan = memo.marker_plan
        self.placeholder = sk["placeholder"]
        self._marks = {}
        self._facts = sk["facts"]
        arr = self._arr = sk["arrays"]
        self._costs = arr["cost"]
        self._arrays = (arr["lo"], arr["hi"], arr["pre"])
        self._starts = sk["starts"]
        self._breaks = sk["breaks"]
        self._lo = sk["facts"][0]  # each unit's message position, ascending (see unit_at)
        self._build = sk["build"]
        self._sk_candidates: list[int] = sk["candidates"]
        self._dropped_mask = np.zeros(len(self._costs), dtype=bool)  # dropped_units as a mask (kept in step)
        self._bulk = {}
        self._cand: tuple[np.ndarray, np.ndarray] | None = None
        self._revivals = None
        self.synthetic = sk["synthetic"]  # assistant position -> synthetic results
        self.units = sk["units"]
        self.full_history_tokens = sk["full_tokens"]

    def _protect(self, sk: dict[str, Any]) -> set[int]:
        """Mark the protected units (the first user message, the latest assistant message, the
        ones that keep the active tool loop's opening on the wire, :func:`loop_guard`, the agent's
        latest plan, :func:`~historygraph.render.plan.latest_plan`, and those of the pinned items) and return
        them; the skeleton's units are shared, so fresh copies."""
        owner = self.graph.owner_of
        pinned = [owner.get(p, p) for p in self.pinned]  # a pinned result: its call's message
        protected_units = {u for p in (sk["first_user"], sk["last_assistant"], *self.loop_guard, *pinned, self.plan)
                           if p is not None and (u := self.unit_at(p)) is not None}
        protected_units |= self._recent_units(sk, protected_units)
        for i in protected_units:
            u = self.units[i]
            self.units[i] = Unit(u.positions, True, u.cost)
        self._protected = sorted(protected_units)
        return protected_units

    def _recent_units(self, sk: dict[str, Any], protected: set[int]) -> set[int]:
        """The units of the ``recent_steps`` newest assistant messages (the agent sees what it just
        did: docs/architecture.md, invariant §5.10), newest first, as long as the protected history stays
        within half of B (a step too large for that, and those before it, may still be dropped:
        the budget keeps room for results)."""
        if not self.recent_steps or sk["last_assistant"] is None:
            return set()
        msgs = self.graph.messages
        limit = None if self.budget is None else self.budget // 2
        cost = sum(self.units[i].cost for i in protected)
        out: set[int] = set()
        found = 0
        p = sk["last_assistant"]
        while p >= 0 and found < self.recent_steps:
            if msgs[p].role == "assistant":
                found += 1
                u = self.unit_at(p)
                if u is not None and u not in protected and u not in out:
                    if limit is not None and cost + self.units[u].cost > limit:
                        break
                    cost += self.units[u].cost
                    out.add(u)
            p -= 1
        return out

    def _leave_out(self, omit: Iterable[int], omit_units: Iterable[int], protected_units: set[int]) -> set[int]:
        """The units the policy leaves out: those with a position in ``omit`` or listed in
        ``omit_units``, unprotected, inserted in ascending order (as a scan of the units would),
        each position's reason deferred."""
        found = {u for p in set(omit) if (u := self.unit_at(p)) is not None or (u := self._skeleton_unit_of(p)) is not None}
        found.update(omit_units)
        left_out = set(sorted(found.difference(protected_units)))  # (inserted in ascending order, as before)
        if left_out:
            units = self.units

            def left_out_reasons(reasons: dict[int, str]) -> None:
                for i in left_out:
                    for p in units[i].positions:
                        reasons[p] = "left out by the policy"
            self.defer_reasons(left_out_reasons)
        return left_out

    def _offer_candidates(self, sk: dict[str, Any], left_mask: np.ndarray | None, excerpt_fraction: float) -> None:
        """Set :attr:`candidates` (the skeleton's, less the results of units the policy left out,
        marked in ``left_mask``) and :attr:`excerpts`: a result whose own cost exceeds B is offered
        as a marked excerpt of ``excerpt_fraction·B`` tokens (ContextRender A.4)."""
        msgs, counter, budget, arr = self.graph.messages, self.counter, self.budget, self._arr
        over = sk["over"]
        self._excerpt_forms: dict[int, Message] = {}  # candidate -> its excerpt, for the oversized ones
        if left_mask is not None:  # the skeleton's candidates whose unit is not left out (its unit array is in their order)
            self.candidates: list[int] = list(itertools.compress(sk["candidates"], (~left_mask[arr["cand_unit"]]).tolist()))
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
            excerpt = oversized_excerpt(msgs[p], self.full_cost[p], budget, counter, excerpt_fraction, self.focus)
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

    @cached_property
    def focus(self) -> frozenset[str]:
        """The values the agent is working on (:func:`~historygraph.render.focus.focus_values` of the
        last ``excerpt_focus`` assistant messages and the current user message) that the excerpts of
        this layout keep the lines of; empty when ``excerpt_focus`` is 0 (head-and-tail excerpts)."""
        return focus_values(self.graph, self.current_user, self.excerpt_focus)

    def _least_excerpt(self, p: int) -> int:
        """Tokens of about the smallest excerpt of result ``p``: its marker and 8 tokens of text."""
        m = self.graph.messages[p]
        total = self.counter.count(m.content)
        return self.counter.count_message(m.with_content(EXCERPT_MARK.format(id=m.tool_call_id, kept=8, total=total), "excerpt")) + 8

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

    def unit_at(self, p: int) -> int | None:
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

    def _candidate_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``delta`` and unit of every candidate, in ``candidates`` order (int64)."""
        if self._cand is None:
            n = len(self.candidates)
            self._cand = (np.fromiter((self.delta[p] for p in self.candidates), dtype=np.int64, count=n),
                          np.fromiter((self.unit_of[p] for p in self.candidates), dtype=np.int64, count=n))
        return self._cand

    @property
    def fits_in_full(self) -> bool:
        """True when the complete history fits in B (then it is rendered unchanged, A.1 line 6)."""
        return self.budget is None or self.full_history_tokens <= self.budget

    def selection(self) -> Selection:
        return Selection(self)

    def assemble_full(self, policy: str) -> Rendering:
        """The complete history, unchanged (ContextRender A.1 lines 6–7)."""
        if not self.dropped_units and not self.inserts and not self.excerpts:
            return self._assemble_whole(policy, Selection(self))
        sel = Selection(self)
        for p in self.candidates:
            sel.take(p)
        return self.assemble(policy, sel)
