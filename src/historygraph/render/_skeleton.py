"""Speed only: the layout skeleton (:class:`Skeleton`), the part of a layout that depends on the graph
alone (render order, units with their costs, candidates, synthetic answers, glue), kept per graph
by its token memo and extended as the graph grows instead of rebuilt per render. A reader may skip
this module: every snapshot of it must equal what a scan of the whole graph gives, the reference
being :func:`~historygraph.render.order.render_order` for the order and the unit rules of
:class:`~historygraph.render.layout.Layout` (``tests/test_equivalence.py`` compares them)."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

import numpy as np

from historygraph.history.events import Message
from historygraph.history.graph import ContextGraph
from historygraph.render._grow import Grow
from historygraph.render._units import Unit, Units
from historygraph.render.markers import UNANSWERED

if TYPE_CHECKING:
    from historygraph.render._memo import TokenMemo

class Skeleton:
    """The part of a :class:`Layout` that depends on the graph alone (render order, units with
    their costs, placeholders, synthetic answers, glue without inserts), kept per graph and
    extended when the graph grows by steps of the current tool loop: the last unit is rebuilt
    with the new messages (kept as it is when none of them belong to it). Anything else (a user
    or system message, a result for an earlier step, a superseding result) rebuilds it from
    scratch."""

    def __init__(self) -> None:
        self.n = -1
        self.superseded = -1
        self._lent = False
        self.builds = 0  # how many times built from scratch (a snapshot names the build it was taken of)
        # candidate -> its unit, complete message and delta, as dicts: built from the candidate
        # arrays when first read (:meth:`maps`), then kept up to date; until then the arrays are
        # the only record (a reopened session's first render of a policy that reads no dict, such
        # as prune, builds none)
        self._maps: tuple[dict[int, int], dict[int, Message], dict[int, int]] | None = None

    def update(self, graph: ContextGraph, memo: TokenMemo) -> None:
        if self.n == len(graph.messages) and self.superseded == len(graph.superseded):
            return
        if not self._extend(graph, memo):
            self._build(graph, memo)
        self.n, self.superseded = len(graph.messages), len(graph.superseded)

    def _build(self, graph: ContextGraph, memo: TokenMemo) -> None:
        # (Over 80 lines: one sequence of numpy steps sharing their intermediate arrays.)
        # From whole-graph arrays, not per message: a reopened session's first render builds the
        # skeleton over its whole history (thousands of units). Each unit is a user or assistant
        # message not outside B (only assistant messages carry calls, and every result's call
        # comes before it), followed in the order by its calls' latest results, ascending; what
        # :meth:`_add` does per message when the graph is extended.
        msgs = graph.messages
        n = len(msgs)
        self._lent = False  # every container is a new one
        i64 = np.int64
        # roles from the graph's own maps (no pass over every message): a message with calls is an
        # assistant message (``call_owner``: its position per call), a tool result is a latest or a
        # superseded result (the memo's positions of the results); only the rest (user and system
        # messages, assistant messages without calls) are read
        tools_at = memo.tools.view()
        is_tool = np.zeros(n, dtype=bool)
        is_tool[tools_at] = True
        owners = graph.call_owner
        calls_at = np.bincount(np.fromiter(owners.values(), dtype=i64, count=len(owners)), minlength=n)  # calls per position
        has_calls = calls_at > 0
        rest = (~(has_calls | is_tool)).nonzero()[0].tolist()
        rest_roles = [msgs[p].role for p in rest]
        users = self.users = [p for p, r in zip(rest, rest_roles) if r == "user"]  # (extending adds none)
        self.current_user = users[-1] if users else None
        self.first_user = users[0] if users else None
        with_calls = has_calls.nonzero()[0]
        last = max(int(with_calls[-1]) if len(with_calls) else -1,
                   next((p for p, r in zip(reversed(rest), reversed(rest_roles)) if r == "assistant"), -1))
        self.last_assistant = last if last >= 0 else None
        self.outside = {p for p, r in zip(rest, rest_roles) if r == "system"}
        if self.current_user is not None:
            self.outside.add(self.current_user)
        outside = self.outside
        nt = (~is_tool).nonzero()[0]
        in_b = ~is_tool
        if outside:
            in_b[list(outside)] = False
        lo = in_b.nonzero()[0]
        unit_pos = lo.tolist()
        n_units = len(unit_pos)
        uidx = np.full(n, -1, dtype=i64)  # position -> its unit (a unit's message), −1 otherwise
        uidx[lo] = np.arange(n_units, dtype=i64)
        result_of = graph.result_of
        # every result's call owner, by position (``owner_of`` is filled in position order, as the
        # memo's positions are), and the latest results: those not superseded, ascending
        rpos = tools_at
        rown = np.fromiter(graph.owner_of.values(), dtype=i64, count=len(tools_at))
        if graph.superseded:
            latest = ~np.isin(tools_at, np.fromiter(graph.superseded, dtype=i64, count=len(graph.superseded)))
            rpos, rown = rpos[latest], rown[latest]
        by_owner = np.argsort(rown, kind="stable")  # results grouped by their unit, ascending within it
        rpos, rown = rpos[by_owner], rown[by_owner]
        runit = uidx[rown]
        # the order: every non-tool message, each followed by its results
        head = np.concatenate([nt, rown])
        perm = np.lexsort((np.concatenate([np.full(len(nt), -1, dtype=i64), rpos]), head))
        order = np.concatenate([nt, rpos])[perm]
        entry_unit = uidx[head[perm]]
        starts = np.flatnonzero(perm < len(nt))[uidx[nt] >= 0]  # where each unit's message is in the order
        tokens = memo.tokens_array()
        rph = memo.tools_ph.view()[np.searchsorted(tools_at, rpos)]  # (every result is among the memo's)
        rtok = tokens[rpos]
        answered = np.bincount(runit, minlength=n_units)
        ncalls_a = calls_at[lo]  # (a user message has none)
        # synthetic answers for the calls without a result (only the very last message can be in flight)
        self.synthetic: dict[int, list[Message]] = {}
        synthetic_of = self.synthetic
        syn_tokens = np.zeros(n_units, dtype=i64)
        count_message = memo.counter.count_message
        for i in np.flatnonzero(ncalls_a > answered).tolist():
            p = unit_pos[i]
            if p == n - 1:
                continue
            synthetic = [Message(role="tool", content=UNANSWERED.format(id=call.id), tool_call_id=call.id,
                                 rendered_as="placeholder") for call in msgs[p].tool_calls if call.id not in result_of]
            synthetic_of[p] = synthetic
            syn_tokens[i] = sum(count_message(x) for x in synthetic)
        own = tokens[lo] + syn_tokens
        # (float sums of integers: exact below 2**53)
        cost = own + np.bincount(runit, weights=rph, minlength=n_units).astype(i64)
        full = own + np.bincount(runit, weights=rtok, minlength=n_units).astype(i64)
        hi = lo.copy()  # a unit's message comes before its results
        np.maximum.at(hi, runit, rpos)
        if n_units:
            earlier = np.concatenate([[np.iinfo(i64).min], np.maximum.accumulate(hi)[:-1]])
            top = np.maximum.accumulate(np.where(hi >= earlier, np.arange(n_units, dtype=i64), 0))
        else:
            top = np.zeros(0, dtype=i64)
        is_unit = uidx[nt] >= 0
        glue = np.concatenate([[False], is_unit[:-1]])[is_unit] if len(nt) else np.zeros(0, dtype=bool)
        pre = np.concatenate([[0], np.cumsum(ncalls_a)]).astype(i64)
        order_l, starts_l, sizes = order.tolist(), starts.tolist(), (answered + 1).tolist()
        self.order = order_l
        self.units = Units(order_l, starts_l, sizes, cost.tolist())  # each Unit built when first read
        self.starts = starts_l                 # index in order where each unit's message is
        self.fulls = full.tolist()             # each unit's tokens when complete
        cand_order = np.argsort(rpos, kind="stable")
        cands, cand_units = rpos[cand_order], runit[cand_order]
        cand_delta = (rtok - rph)[cand_order]
        self.candidates = cands.tolist()
        self._msgs, self._maps = msgs, None
        self.builds += 1
        self.glue = glue.tolist()
        self.breaks = (~glue).nonzero()[0].tolist()  # the units whose glue is False, ascending
        self.full_tokens, self.total_cost = int(full.sum()), int(cost.sum())
        # Layout._unit_facts per unit: lowest and highest position, prefix-max holder, calls, prefix sums
        self.lo, self.hi, self.top, self.ncalls, self.pre = unit_pos, hi.tolist(), top.tolist(), ncalls_a.tolist(), pre.tolist()
        self.cand_stale = False  # a candidate was inserted before the last one: rebuild the candidate arrays
        # the same as arrays (see :meth:`arrays`): per order entry its position and unit (−1 outside B),
        # per unit its cost, lowest and highest position and the prefix sums of calls, per candidate
        # (ascending) its position, delta and unit
        self.g_order, self.g_entry_unit, self.g_cost = Grow(order), Grow(entry_unit), Grow(cost)
        self.g_lo, self.g_hi, self.g_pre = Grow(lo), Grow(hi), Grow(pre)
        self.g_cand_pos, self.g_cand_delta, self.g_cand_unit = Grow(cands), Grow(cand_delta), Grow(cand_units)

    def _add(self, p: int, graph: ContextGraph, memo: TokenMemo, glue: bool) -> bool:
        """Append message ``p`` (not a tool result, not outside B) to the order, as a unit when it is
        a user or assistant message (the unit-building rules of :class:`Layout`)."""
        msgs = graph.messages
        m = msgs[p]
        start = len(self.order)
        self.order.append(p)
        results = sorted(graph.result_of[c.id] for c in m.tool_calls if c.id in graph.result_of)
        self.order.extend(results)
        unit_role = m.role in ("user", "assistant")
        i = len(self.units)
        for q in (p, *results):
            self.g_order.append(q)
            self.g_entry_unit.append(i if unit_role else -1)
        if not unit_role:
            return False
        unit = Unit([p], protected=False)
        synthetic = []
        if m.role == "assistant":
            for call in m.tool_calls:
                if call.id not in graph.result_of and p != len(msgs) - 1:  # only the very last message can be in flight
                    synthetic.append(Message(role="tool", content=UNANSWERED.format(id=call.id), tool_call_id=call.id,
                                             rendered_as="placeholder"))
            unit.positions += results
        if synthetic:
            self.synthetic[p] = synthetic
        full = memo.tokens[p] + sum(memo.counter.count_message(x) for x in synthetic)
        unit.cost = full
        for r in unit.positions[1:]:
            ph_tokens = memo.ph_count(r)
            unit.cost += ph_tokens
            full += memo.tokens[r]
            delta = memo.tokens[r] - ph_tokens
            if self.candidates and r < self.candidates[-1]:
                self.maps()  # the arrays fall behind: from now on the dicts are the record
                self.cand_stale = True
            elif not self.cand_stale:
                self.g_cand_pos.append(r)
                self.g_cand_delta.append(delta)
                self.g_cand_unit.append(i)
            if self._maps is not None:
                unit_of, form, deltas = self._maps
                unit_of[r], form[r], deltas[r] = i, msgs[r], delta
            bisect.insort(self.candidates, r)
        self.units.append(unit)
        self.starts.append(start)
        self.fulls.append(full)
        self.glue.append(glue)
        if not glue:
            self.breaks.append(i)
        self.full_tokens += full
        self.total_cost += unit.cost
        self.lo.append(p)  # a unit's message comes before its results
        self.hi.append(unit.positions[-1] if len(unit.positions) > 1 else p)
        self.top.append(i if not self.top or self.hi[-1] >= self.hi[self.top[-1]] else self.top[-1])
        self.ncalls.append(len(m.tool_calls) if m.role == "assistant" else 0)
        self.pre.append(self.pre[-1] + self.ncalls[-1])
        self.g_cost.append(unit.cost)
        self.g_lo.append(self.lo[-1])
        self.g_hi.append(self.hi[-1])
        self.g_pre.append(self.pre[-1])
        return True

    def over(self, budget: int, tokens: np.ndarray) -> list[int]:
        """The candidates whose full cost (``tokens``: every message's, by position) exceeds
        ``budget``, ascending."""
        self._fresh_candidates()
        pos = self.g_cand_pos.view()
        return pos[tokens[pos] > budget].tolist()

    def _fresh_candidates(self) -> None:
        """Rebuild the candidate arrays when a candidate was inserted before the last one."""
        if self.cand_stale:
            assert self._maps is not None  # (built before the arrays fell behind)
            unit_of, _, delta = self._maps
            self.g_cand_pos = Grow(self.candidates)
            self.g_cand_delta = Grow(delta[p] for p in self.candidates)
            self.g_cand_unit = Grow(unit_of[p] for p in self.candidates)
            self.cand_stale = False

    def maps(self) -> tuple[dict[int, int], dict[int, Message], dict[int, int]]:
        """Candidate position -> its unit, its complete message and its delta (full cost −
        placeholder cost, tokens), as dicts: built from the candidate arrays when first asked for,
        then kept up to date by :meth:`_add` and :meth:`_extend` (shared with snapshots, as
        :meth:`lend` says)."""
        if self._maps is None:
            assert not self.cand_stale  # (until the dicts exist, the arrays are kept up to date)
            cands = self.candidates
            self._maps = (dict(zip(cands, self.g_cand_unit.view().tolist())), dict(zip(cands, map(self._msgs.__getitem__, cands))),
                          dict(zip(cands, self.g_cand_delta.view().tolist())))
        return self._maps

    def arrays(self) -> dict[str, np.ndarray]:
        """Views of the array forms (int64): ``order``, ``entry_unit``, ``cost``, ``lo``, ``hi``,
        ``pre``, ``cand_delta``, ``cand_unit``."""
        self._fresh_candidates()
        return {"order": self.g_order.view(), "entry_unit": self.g_entry_unit.view(), "cost": self.g_cost.view(),
                "lo": self.g_lo.view(), "hi": self.g_hi.view(), "pre": self.g_pre.view(),
                "cand_delta": self.g_cand_delta.view(), "cand_unit": self.g_cand_unit.view()}

    def lend(self) -> None:
        """Its dicts, per-unit fact lists and breaks are now shared with a snapshot: until the next
        :meth:`_own`, they are only added to (new keys, appended entries), never changed."""
        self._lent = True

    def _own(self) -> None:
        """Before changing what a snapshot may hold: fresh copies of the lent containers."""
        if self._lent:
            self.synthetic = dict(self.synthetic)
            if self._maps is not None:
                self._maps = (dict(self._maps[0]), dict(self._maps[1]), dict(self._maps[2]))
            self.lo, self.hi, self.top, self.ncalls, self.pre = \
                list(self.lo), list(self.hi), list(self.top), list(self.ncalls), list(self.pre)
            self.breaks = list(self.breaks)
            self._lent = False

    def _extend(self, graph: ContextGraph, memo: TokenMemo) -> bool:
        msgs = graph.messages
        if self.n < 1 or self.superseded != len(graph.superseded) or not self.units or len(msgs) < self.n:
            return False
        last = self.units[-1]
        t = last.positions[0]
        if msgs[t].role != "assistant" or any(p > t for p in self.outside) \
                or self.starts[-1] + len(last.positions) != len(self.order):
            return False
        changed = False  # whether a new message belongs to the last unit
        for q in range(self.n, len(msgs)):
            m = msgs[q]
            if m.role == "assistant":
                continue
            if m.role != "tool":
                return False
            owner = graph.call_owner.get(m.tool_call_id or "")
            if owner is None or owner < t or graph.result_of.get(m.tool_call_id or "") != q:
                return False
            if owner == t:
                changed = True
        if not changed and t == self.n - 1 and any(c.id not in graph.result_of for c in msgs[t].tool_calls):
            changed = True  # its call was in flight; with a message after it, it gets a synthetic answer
        if not changed:  # the last unit stays as it is: only add the new steps
            for q in range(self.n, len(msgs)):
                if msgs[q].role == "assistant":
                    self._add(q, graph, memo, True)
                    self.last_assistant = q
            return True
        # rebuild the last unit with what arrived, then add the new steps
        self._own()
        self.units.pop()
        start = self.starts.pop()
        del self.order[start:]
        self.g_order.truncate(start)
        self.g_entry_unit.truncate(start)
        for g in (self.g_cost, self.g_lo, self.g_hi):
            g.truncate(len(self.units))
        self.g_pre.truncate(len(self.units) + 1)
        self.full_tokens -= self.fulls.pop()
        self.total_cost -= last.cost
        glue = self.glue.pop()
        if not glue:
            self.breaks.pop()
        for facts in (self.lo, self.hi, self.top, self.ncalls, self.pre):
            facts.pop()
        self.synthetic.pop(t, None)
        gone = last.positions[1:]
        if not self.cand_stale:
            if self.candidates[len(self.candidates) - len(gone):] == sorted(gone):
                self.g_cand_pos.truncate(len(self.candidates) - len(gone))
                self.g_cand_delta.truncate(len(self.candidates) - len(gone))
                self.g_cand_unit.truncate(len(self.candidates) - len(gone))
            else:
                self.maps()  # the arrays fall behind: from now on the dicts are the record
                self.cand_stale = True
        for r in gone:
            if self._maps is not None:
                for d in self._maps:
                    del d[r]
            self.candidates.remove(r)
        for q in range(t, len(msgs)):
            if msgs[q].role == "assistant":
                self._add(q, graph, memo, glue)
                glue = True
                self.last_assistant = q
        return True
