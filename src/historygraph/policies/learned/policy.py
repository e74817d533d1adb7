"""``learned``: show the results most likely to be reused, per token of budget (ours, beyond the papers).

1. If the complete history fits in B it is returned unchanged (as ContextRender, arXiv:2609.37743,
   A.1 lines 6–7), under the shared :class:`~historygraph.render.Layout` (budget scope,
   placeholders, step dropping and revival, oversized excerpts).
2. Each candidate result ``r`` gets ``p(r)``, the probability that the next invocation reuses one of
   its values, from a small fitted model (:class:`~historygraph.policies.learned.model.ReuseModel`) over
   render-time features only (:mod:`historygraph.policies.learned.features`: age, observed reuse of Tool-Flow
   Analysis and its recent history, lexical relevance, size, kind of call, ContextWeaver ancestry,
   superseding, unique values). The shipped model was fitted by ``historygraph fit`` on real
   mini-swe-agent trajectories (docs/results.md gives the command and the cross-validation).
3. Selection is a 0/1 knapsack: maximise ``Σ p(r)`` (the expected number of reused results shown)
   subject to the assembled history staying within B, where a result costs its extra tokens over
   its placeholder plus, for a result of a dropped step, the step's revival
   (:class:`~historygraph.render.Selection`). Solved greedily by ``p(r) / cost(r)^α`` (``α`` =
   ``cost_exponent``, 0.5 by default: the plain ratio, ``α = 1``, let many small unlikely results
   crowd out a large likely one; highest first,
   ties to the older result; a revival makes the other results of that step cheaper, and they are
   re-queued at their new ratio), then the single most probable result that fits is swapped in if it
   alone beats the greedy set (the classic guarantee of half the optimum); then one exchange
   (:func:`swap_pass`, ``swap_pairs``): one shown result is replaced by one or two not shown that are
   worth more together and fit in the tokens it frees, so the history never grows. An oversized result is offered as its
   marked excerpt, valued at ``excerpt_value·p``. Results with ``p < min_probability`` (0.002 by
   default) are not shown even when room is left: the greedy fill otherwise packs the last tokens
   of B with small results nearly certain not to be reused.
4. Layout (ours): non-tool history keeps only the newest steps within ``(1 − result_reserve)·B``
   (0.95: 5 % of B), so old steps that hold nothing worth showing leave room for results; a step
   comes back when one of its results is shown, in brief view (its calls, its text replaced by a
   marker naming the call id; :class:`~historygraph.render.Layout` ``brief_revivals``).
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
import os
from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from historygraph.policies.learned.features import feature_matrix
from historygraph.policies.learned.model import ReuseModel, ReuseModelError
from historygraph.history.graph import ContextGraph
from historygraph.render import Layout, Rendering, Selection
from historygraph.policies.base import Signals
from historygraph.policies.registry import register

SOURCE = "ours: fitted reuse probability (render-time features incl. ContextRender TFA) + knapsack under B"


@dataclass(frozen=True)
class LearnedConfig:
    """``model``: path of a model file written by ``historygraph fit`` (``""``: the file named by the
    environment variable ``HISTORYGRAPH_LEARNED_MODEL``, else the shipped default).
    ``min_probability``: results less likely to be reused are not shown, even with room left; 0.002
    was chosen by grouped cross-validation on the 90 training trajectories (docs/learned.md, "Mean
    history tokens"): the smallest threshold whose mean history tokens are no higher than
    ContextRender's on the same trajectories at B = 6000 and 3000 (recall −0.3 / −0.1 points). ``excerpt_value``: the
    value of an oversized result's excerpt relative to the whole result. ``excerpt_focus``: excerpts
    keep the lines holding the values of this many latest assistant messages (0: head and tail;
    :class:`~historygraph.render.Layout`, docs/policies.md "Focused excerpts"). ``result_reserve``: share of
    B not given to retained non-tool history (:class:`~historygraph.render.Layout`; older steps come
    back only with a result). ``brief_revivals``: such a step shows its calls, not its text.
    ``cost_exponent``: rank by ``p / cost^α``. The defaults of the last three were chosen by grouped
    5-fold cross-validation on the 90 training trajectories at B = 6000 and 3000 (docs/learned.md);
    settings within 0.5 points of each other were tied there. ``swap_pairs``: the exchange after the
    greedy fill (:func:`swap_pass`) tries this many most valuable results for the freed room (0: no
    exchange); 3 was chosen by the same cross-validation (79.6 / 62.3 against 79.5 / 62.1 without,
    at 9 / 6 fewer history tokens a call; 5 and 10 gave the same at 3000; docs/learned.md, "One
    exchange after the greedy fill"). ``reserve_always``: when the retained history fits in B, so
    that the layout drops no step, also select under the layout that keeps only the newest steps
    within ``(1 − result_reserve)·B`` (as it does once the history passes B) and render the one
    whose selection is worth more (docs/learned.md, "Layout"). ``recent_steps``: the steps of this many
    newest assistant messages are never dropped, so the agent sees its text and calls (their results
    may be placeholders; within half of B: :class:`~historygraph.render.Layout`; docs/architecture.md,
    invariant §5.10; 0: only the latest). Not yet the default: on the 14 mini-swe-agent traces at B = 6000,
    5 lifts the median of the newest five shown from 2 to 5 but costs `learned` 3.5 points of recall
    (86.1 → 82.6) and `learned-stable`, whose inner `learned` keeps the default, 5.9 (79.8 → 73.9)
    (docs/evaluator.md, "What is measured"). ``recent_calls``: the steps of this many newest assistant
    messages are shown with their tool calls at every call, in a compact form, before the selection
    (:meth:`~historygraph.render.Selection.revive_recent`): a dropped step comes back with its text
    in a short brief view, and the results of these steps that are not selected get a short
    placeholder naming the id (:data:`~historygraph.render.markers.STUB`, about 25 tokens instead of
    46); ``recent_step_share``: a step whose compact form would add more than this share of B
    (a long file written through a heredoc) stays in its dropped-step marker (1: no limit). Not
    the default (``recent_calls`` 0; 0.1 is the share measured for 5): on the 14 mini-swe-agent traces, 5 newest with no limit are shown at every
    call at B = 6000 but cost `learned` 3.3 points of recall (86.1 → 82.8) and 9.5 at 3000
    (66.5 → 57.0), `learned-stable` 7.1 and 8.3: the calls themselves are the cost, and a few
    steps that write whole files most of it (a step brought back adds a median of 74 tokens, a
    mean of 210 at 6000; its placeholder was 46 of them before the short one). With 0.1 `learned` keeps 84.7 at 6000 (−1.5) and 62.4 at 3000 (−4.1),
    `learned-stable` 77.2 (−2.5) and 54.3 (−1.3), and shows all five newest with their calls
    at 79 % of the calls at 6000 (mean 4.73 of 5; 21 % before) and 57 % at 3000 (8 %); on 30 of the
    training trajectories, −1.3 / −2.8 (`learned`) and −1.0 / −3.8 (`learned-stable`) at 6000 /
    3000, 65 % and 41 % of calls with all five. 0.1 was chosen on the 14 at 6000 among 0.05, 0.1,
    0.125, 0.15 and 1: the largest within 2 points with half a point to spare (0.125: −1.96); the 30
    confirm it (docs/learned.md, "The newest steps in view"). A step over the limit (a file written
    whole) is not shown: the item's "at every call" is not met. Before the compact form (each
    result a full placeholder, the exchange free to drop such a step again), 5 cost 2.4 and 8.4
    points, with a worst call of 4 of 5 at 6000. ``recent_share``: the tokens the ``recent_calls``
    newest steps add together are at most this share of B (newest first, a step that would pass it
    stays in its marker and older ones are still tried; 1: no limit); ``recent_brief``: a dropped
    one of them comes back in the short brief view (false: its text as stored, as invariant 10
    asks). The cache-stable default sets the four (:meth:`Learned.with_recent`;
    :mod:`historygraph.policies.cache_stable`, ``recent``)."""

    model: str = ""
    min_probability: float = 0.002
    excerpt_value: float = 0.5
    oversized_excerpt_fraction: float = 0.25
    excerpt_focus: int = 3
    result_reserve: float = 0.95
    brief_revivals: bool = True
    cost_exponent: float = 0.5
    swap_pairs: int = 3
    reserve_always: bool = True
    recent_steps: int = 0
    recent_calls: int = 0
    recent_step_share: float = 0.1
    recent_share: float = 1.0
    recent_brief: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_probability < 1.0:
            raise ValueError(f"learned config: min_probability must be in [0, 1), got {self.min_probability}")
        if not 0.0 <= self.excerpt_value <= 1.0:
            raise ValueError(f"learned config: excerpt_value must be in [0, 1], got {self.excerpt_value}")
        if not 0 < self.oversized_excerpt_fraction <= 1:
            raise ValueError("learned config: oversized_excerpt_fraction must be in (0, 1]")
        if not (isinstance(self.excerpt_focus, int) and self.excerpt_focus >= 0):
            raise ValueError(f"learned config: excerpt_focus must be a whole number ≥ 0, got {self.excerpt_focus}")
        if not 0.0 <= self.cost_exponent <= 1.0:
            raise ValueError(f"learned config: cost_exponent must be in [0, 1], got {self.cost_exponent}")
        if not (isinstance(self.swap_pairs, int) and self.swap_pairs >= 0):
            raise ValueError(f"learned config: swap_pairs must be a whole number ≥ 0, got {self.swap_pairs}")
        if not (isinstance(self.recent_calls, int) and self.recent_calls >= 0):
            raise ValueError(f"learned config: recent_calls must be a whole number ≥ 0, got {self.recent_calls}")
        if not 0.0 <= self.recent_step_share <= 1.0:
            raise ValueError(f"learned config: recent_step_share must be in [0, 1], got {self.recent_step_share}")
        if not 0.0 <= self.recent_share <= 1.0:
            raise ValueError(f"learned config: recent_share must be in [0, 1], got {self.recent_share}")
        if not 0.0 <= self.result_reserve < 1.0:
            raise ValueError(f"learned config: result_reserve must be in [0, 1), got {self.result_reserve}")


_IDLE_POPS = 16  # pops without a take before knapsack_select checks whether anything left can fit
_POWERS: dict[float, np.ndarray] = {}  # per exponent: max(1, c) ** α by cost c (NaN: not computed yet)


def _powers(costs: np.ndarray, a: float) -> np.ndarray:
    """``max(1, c) ** a`` for each of ``costs``, each computed once per process by Python's ``**``
    (the figures the loop over candidates had; numpy's ``power`` may round differently)."""
    c = np.maximum(costs, 1)
    table = _POWERS.get(a)
    top = int(c.max()) + 1 if len(c) else 0
    if table is None or len(table) < top:
        grown = np.full(max(top, 2 * len(table) if table is not None else 64), np.nan)
        if table is not None:
            grown[:len(table)] = table
        table = _POWERS[a] = grown
    out = table[c]
    for x in np.unique(c[np.isnan(out)]).tolist():
        table[x] = x ** a
    return table[c]


_POP_CHUNK = 64  # pop-order entries converted to Python numbers at a time (doubling)


def knapsack_select(candidates: list[int], value: "Mapping[int, float] | np.ndarray", sel: Selection,
                    cost_exponent: float = 1.0) -> list[int]:
    """Greedy 0/1 knapsack on ``value[p] / sel.cost(p)`` with the best-single-item swap (see module
    docstring, step 3); fills ``sel`` and returns the positions taken, in selection order. A result
    that costs no more than its placeholder (cost ≤ 0: a short output) is taken before any other,
    since it frees room. Costs are
    re-read when a revival lowers them (the other results of a revived step become cheaper: they are
    queued again at their new ratio). Items with value ≤ 0 are never taken; costs below one token
    count as one. ``cost_exponent`` ``α`` ranks by ``value / cost^α`` instead (``α = 1``: the knapsack
    ratio; ``α < 1`` favours larger results that are likely to be reused over many small unlikely ones).
    ``candidates``: positions among ``sel.layout.candidates``; ``value``: per position, or an array
    in the order of ``candidates``.

    Every candidate is priced at once; a revival changes only the costs of the results of the
    steps in the revived step's run of dropped steps, which are re-priced one by one when next met
    (:meth:`~historygraph.render.Selection.exact_cost`). Candidates are visited in ratio order
    (ties to the older), those re-queued at a new ratio merged in from a heap.

    Raises:
        ValueError: a position of ``candidates`` that is not a candidate of the layout.
    """
    # (over 80 lines: one priority-queue loop whose re-pricing after a revival needs its queue, costs and runs in locals; tested against a reference loop, tests/test_equivalence.py)
    lay = sel.layout
    a = cost_exponent
    base_used, base_revived, base_shown = sel.used, set(sel.revived), dict(sel.shown)
    cands = lay.candidates
    if candidates is cands or (isinstance(candidates, list) and candidates == cands):  # every candidate, in their order (learned's own call)
        at: "np.ndarray | slice" = slice(None)
    else:
        cand_arr = np.asarray(cands, dtype=np.intp)  # sorted (Layout keeps candidates in position order)
        given = np.asarray(candidates, dtype=np.intp)
        at = np.searchsorted(cand_arr, given)
        if len(given) and (at.max() >= len(cands) or (cand_arr[at] != given).any()):
            raise ValueError("knapsack_select: candidates must be candidates of the selection's layout")
    vals = np.zeros(len(cands))
    vals[at] = value if isinstance(value, np.ndarray) else \
        np.fromiter(map(value.__getitem__, candidates), dtype=np.float64, count=len(candidates))
    item_mask = vals > 0
    costs0 = sel.candidate_costs()  # every candidate priced at once; before anything is revived also its cost alone
    cur = costs0.tolist()           # costs as last priced
    cand_unit = lay._candidate_arrays()[1].tolist()
    priced_at = [0] * len(cands)    # revivals counted when cur[i] was priced
    changed_at = [0] * len(lay.units)  # per unit: revivals counted when its costs last changed
    revivals = 0
    items = np.flatnonzero(item_mask)
    ratios = -vals[items] / _powers(costs0[items], a)
    ratios[costs0[items] <= 0] = -np.inf  # no dearer than its placeholder: taken first, it frees room for the rest
    order = np.lexsort((items, ratios))  # pop order of the heap of (ratio, candidate index, cost)
    # the pop order as Python numbers, converted a chunk at a time (a render pops few dozen)
    sorted_arrays = (ratios[order], items[order], costs0[items][order])
    s_ratio: list[float] = []
    s_index: list[int] = []
    s_cost: list[int] = []

    def value_of(i: int) -> float:
        return float(vals[i])

    def ratio(i: int, c: int) -> float:  # as the initial ratios (``**`` on Python numbers)
        return -value_of(i) / max(1, c) ** a if c > 0 else -math.inf

    heap: list[tuple[float, int, int]] = []  # entries queued again at a new ratio
    unit_of, units, dropped = lay.unit_of, lay.units, lay.dropped_units
    taken: list[int] = []
    done = bytearray(len(cands))
    is_item = item_mask.tolist()
    budget = lay.budget
    # once no result left can fit, nothing more is taken (costs change only when one is): stop.
    # Checked after `idle` pops without a take, doubling while it fails
    idle, since = _IDLE_POPS, 0
    k, n_sorted = 0, len(items)
    while True:
        if k == len(s_index) < n_sorted:
            more = slice(k, k + max(_POP_CHUNK, k))
            s_ratio += sorted_arrays[0][more].tolist()
            s_index += sorted_arrays[1][more].tolist()
            s_cost += sorted_arrays[2][more].tolist()
        if heap and (k == n_sorted or heap[0] < (s_ratio[k], s_index[k], s_cost[k])):
            _, i, c = heapq.heappop(heap)
        elif k < n_sorted:
            i, c = s_index[k], s_cost[k]
            k += 1
        else:
            break
        if done[i]:
            continue
        if changed_at[cand_unit[i]] > priced_at[i]:
            cur[i], priced_at[i] = sel.exact_cost(cands[i]), revivals
        now = cur[i]
        if now != c:  # its step was revived since it was queued
            heapq.heappush(heap, (ratio(i, now), i, now))
            continue
        if budget is not None and sel.used + now > budget:  # Selection.fits, with the cost in hand
            since += 1
            if since >= idle:
                left = item_mask.copy()
                left[taken] = False
                if sel.lower_costs()[left].min(initial=budget + 1) > budget - sel.used:
                    break  # (a lower bound of every cost, cheaper than pricing every run exactly)
                costs = sel.candidate_costs()
                cur, priced_at = costs.tolist(), [revivals] * len(cands)
                if costs[left].min(initial=budget + 1) > budget - sel.used:
                    break
                idle, since = 2 * idle, 0
            continue  # stays out unless its step is revived (then it is queued again)
        p = cands[i]
        u = unit_of[p]
        revives = u in dropped and u not in sel.revived
        first = sel.runs.run_of(u) if revives else None  # the run of dropped steps it leaves
        first, last = (u, u) if first is None else (first, sel.runs.end[first])
        sel.take(p, cost=now)
        taken.append(i)
        done[i] = 1
        since = 0
        if revives:
            revivals += 1
            changed_at[first:last + 1] = [revivals] * (last + 1 - first)
            for q in units[u].positions:  # the other results of the step (push order does not matter)
                j = bisect.bisect_left(cands, q)
                if j < len(cands) and cands[j] == q and is_item[j] and not done[j]:
                    cq = cur[j] = sel.exact_cost(q)
                    priced_at[j] = revivals
                    heapq.heappush(heap, (ratio(j, cq), j, cq))
    best: int | None = None  # the candidate index of the most probable that fits alone, ties to the older
    if not base_revived and budget is not None:  # in bulk: costs0 are costs alone
        fit = np.flatnonzero(item_mask & (base_used + costs0 <= budget))
        if len(fit):
            best = int(fit[np.argmax(vals[fit])])
    elif budget is None:
        best = int(items[np.argmax(vals[items])]) if len(items) else None
    else:
        fits = [i for i in items.tolist() if base_used + _alone(sel, cands[i], base_revived) <= budget]
        best = max(fits, key=lambda i: (value_of(i), -i), default=None)
    if best is not None and value_of(best) > sum(value_of(i) for i in taken):
        sel.used, sel.revived, sel.shown = base_used, set(base_revived), dict(base_shown)
        sel.take(cands[best])
        return [cands[best]]
    return [cands[i] for i in taken]


def _best_gain(s: int, value: np.ndarray, spare: np.ndarray, costs: np.ndarray, room: int, pairs: int) -> float:
    """The largest gain of exchanging ``s`` for one of the ``pairs`` most valuable ``spare``
    candidates (most valuable first) that fit in ``room`` under ``costs``, plus the most valuable
    other one that fits beside it."""
    fit = spare[costs[spare] <= room]
    best = 0.0
    if float(value[fit[:2]].sum()) <= float(value[s]):
        return best  # not even the two most valuable that fit alone are worth more
    for a in fit[:pairs].tolist():
        left = fit[(costs[fit] <= room - costs[a]) & (fit != a)]
        best = max(best, float(value[a] + (value[left[0]] if len(left) else 0.0) - value[s]))
    return best


def swap_pass(sel: Selection, taken: list[int], value: np.ndarray, pairs: int) -> list[int]:
    """One exchange after :func:`knapsack_select` (ours, a bounded 1-opt step): replace one result
    ``s`` it showed by one or two it did not, ``u`` (and ``u₂``), when their summed value is higher
    than ``s``'s and showing them costs no more than removing ``s`` frees, so the history never
    grows; of all such exchanges the one of the largest gain is made, and only one. ``u`` is one of
    the ``pairs`` most valuable results that fit alone in the freed room and ``u₂`` the most
    valuable that fits beside it; results ``s`` worth at least the two most valuable results not
    shown together are not tried (no exchange can gain). Fills ``sel`` with the result and returns
    the positions shown (the kept ones in their order, then ``u``, ``u₂``).

    Costs are exact: costs depend only on which dropped steps are revived, so the room ``s`` frees
    and every other result's cost without ``s`` are priced on a selection reviving the same steps
    but ``s``'s (when ``s`` alone brought its step back; else on ``sel`` itself), and an exchange is
    made only after taking it on top of the rest confirms it fits in the tokens used before.

    ``taken``: positions returned by :func:`knapsack_select` on ``sel``; ``value``: the knapsack's
    values in the order of ``sel.layout.candidates``; ``pairs`` ≤ 0 or no budget: ``taken`` as it
    is. Cost: one bulk pricing (:meth:`~historygraph.render.Selection.candidate_costs`) per tried
    removal that passes a screen on lower bounds of the costs, one selection per exchange tried.
    """
    # (over 80 lines: one search over exchanges sharing the screened bounds and the priced selections in locals)
    lay = sel.layout
    if pairs <= 0 or lay.budget is None or not taken:
        return taken
    cands, unit_of = lay.candidates, lay.unit_of
    idx = [bisect.bisect_left(cands, p) for p in taken]
    free = value > 0
    free[idx] = False
    spare = np.flatnonzero(free)
    if not len(spare):
        return taken
    spare = spare[np.argsort(-value[spare], kind="stable")]  # most valuable first, ties to the older
    ceiling = float(value[spare[:2]].sum())
    shown_in: dict[int, int] = {}
    for p in taken:
        shown_in[unit_of[p]] = shown_in.get(unit_of[p], 0) + 1
    used = sel.used
    low = sel.lower_costs()  # a lower bound of every candidate's cost beside sel, for screening
    here: np.ndarray | None = None  # the exact costs, priced once some removal passes the screen
    best: tuple[float, list[int], Selection] | None = None
    for s in sorted(idx, key=lambda i: (float(value[i]), i)):
        if float(value[s]) >= ceiling:
            break  # the rest are worth as much or more
        p = cands[s]
        if p in lay.required:
            continue  # a newest result is shown whatever the selection (invariant §5.9): never exchanged
        u = unit_of[p]
        room = lay.delta[p]  # what removing s frees: what s costs on top of the rest
        room += sel.stub_savings.get(p, 0)  # (a result of a newest step goes back to its short placeholder)
        # removing s drops its step again (not one of the newest steps: revive_recent keeps them)
        again = u in lay.dropped_units and shown_in[u] == 1 and u not in sel.recent
        if again:
            room += lay.revival_cost(u) - (sel.runs.add_delta(u) if lay.runs.run_of(u) is not None else 0)
        if _best_gain(s, value, spare, low, room, pairs) <= 0.0:
            continue  # screened on lower bounds of the costs beside sel (exact but for the results of s's step's run)
        if not again:
            costs = here = sel.candidate_costs() if here is None else here
        else:
            state = lay.selection()
            state.adopt_recent(sel)
            state.revived = sel.revived - {u}
            costs = state.candidate_costs()
        fit = spare[costs[spare] <= room]
        options: list[tuple[float, list[int]]] = []
        for a in fit[:pairs].tolist():
            options.append((float(value[a] - value[s]), [a]))
            left = fit[(costs[fit] <= room - costs[a]) & (fit != a)]
            if len(left):
                options.append((float(value[a] + value[left[0]] - value[s]), [a, int(left[0])]))
        for gain, add in sorted(options, key=lambda o: -o[0]):
            if gain <= (best[0] if best else 0.0):
                break
            trial = lay.selection()  # the rest as it stands, then the exchange taken on top of it
            trial.adopt_recent(sel)
            trial.revived = sel.revived - {u} if shown_in[u] == 1 and u not in sel.recent else set(sel.revived)
            trial.used, trial.shown = used - room, {q: f for q, f in sel.shown.items() if q != p}
            for i in add:
                trial.take(cands[i])
            if trial.used <= used:
                best = (gain, [i for i in idx if i != s] + add, trial)
                break
    if best is None:
        return taken
    _, shown, trial = best
    sel.used, sel.revived, sel.shown = trial.used, trial.revived, trial.shown
    return [cands[i] for i in shown]


def reuse_values(layout: Layout, prob: np.ndarray, cfg: LearnedConfig) -> np.ndarray:
    """Knapsack value of each candidate of ``layout`` from its reuse probability (both in
    candidate order): 0 below ``min_probability``, times ``excerpt_value`` for an oversized result
    offered as its excerpt."""
    prob = np.asarray(prob, dtype=np.float64)
    value = np.where(prob >= cfg.min_probability, prob, 0.0)
    if layout.excerpts:
        cands = layout.candidates  # ascending, as layout.excerpts
        excerpts = np.array([bisect.bisect_left(cands, p) for p in layout.excerpts], dtype=np.intp)
        value[excerpts] = value[excerpts] * cfg.excerpt_value
    return value


def reserve_layout(layout: Layout, cfg: LearnedConfig) -> Layout | None:
    """``reserve_always``'s second layout of the same history: the steps dropped to the reserve
    (``drop_all``), built only when ``layout`` needs a selection and dropped no step (otherwise the
    two would be the same); ``None`` when there is none to build. Shared by :class:`Learned` and
    the cross-validation benchmark."""
    if not cfg.reserve_always or layout.fits_in_full or layout.dropped_units or not layout.candidates:
        return None
    return Layout(layout.graph, layout.counter, layout.budget, result_reserve=cfg.result_reserve,
                  excerpt_fraction=cfg.oversized_excerpt_fraction, brief_revivals=cfg.brief_revivals,
                  excerpt_focus=cfg.excerpt_focus, drop_all=True, recent_steps=cfg.recent_steps)


def recent_limit(layout: Layout, cfg: LearnedConfig) -> int | None:
    """The most tokens one of the ``recent_calls`` newest steps may add in its compact form
    (``recent_step_share`` of B; ``None``: no limit)."""
    if layout.budget is None or cfg.recent_step_share >= 1.0:
        return None
    return int(cfg.recent_step_share * layout.budget)


def revive_recent(sel: Selection, layout: Layout, cfg: LearnedConfig) -> None:
    """The ``recent_calls`` newest steps in ``sel`` before the selection (``recent_step_share``,
    ``recent_share``, ``recent_brief``; :meth:`~historygraph.render.Selection.revive_recent`)."""
    if not cfg.recent_calls:
        return
    total = None if layout.budget is None or cfg.recent_share >= 1.0 else int(cfg.recent_share * layout.budget)
    sel.revive_recent(cfg.recent_calls, recent_limit(layout, cfg), total, cfg.recent_brief)


def select_results(layout: Layout, prob: np.ndarray, cfg: LearnedConfig,
                   alt: Layout | None = None) -> tuple[Layout, np.ndarray, Selection, list[int]]:
    """The knapsack and the exchange on ``layout`` (``prob``: reuse probabilities in candidate
    order); with ``alt`` (the same candidates, the steps dropped to the reserve: ``reserve_always``)
    the selection of the two worth more, a tie to ``layout``. Returns the layout, its knapsack
    values, the filled selection and the positions shown. Shared by :class:`Learned` and the
    cross-validation benchmark, so both score the same rule."""
    value = reuse_values(layout, prob, cfg)
    sel = layout.selection()
    revive_recent(sel, layout, cfg)
    taken = swap_pass(sel, knapsack_select(layout.candidates, value, sel, cfg.cost_exponent), value, cfg.swap_pairs)
    if alt is not None and alt.candidates == layout.candidates:
        alt_value = reuse_values(alt, prob, cfg)
        alt_sel = alt.selection()
        revive_recent(alt_sel, alt, cfg)
        alt_taken = swap_pass(alt_sel, knapsack_select(alt.candidates, alt_value, alt_sel, cfg.cost_exponent),
                              alt_value, cfg.swap_pairs)
        if _worth(alt_taken, alt.candidates, alt_value) > _worth(taken, layout.candidates, value):
            return alt, alt_value, alt_sel, alt_taken
    return layout, value, sel, taken


def _worth(taken: list[int], cands: list[int], value: np.ndarray) -> float:
    """Summed value of the positions ``taken`` (``value`` in the order of ``cands``)."""
    at = np.searchsorted(np.asarray(cands, dtype=np.intp), np.asarray(taken, dtype=np.intp))
    return float(value[at].sum()) if len(taken) else 0.0


def _alone(sel: Selection, p: int, revived: set[int]) -> int:
    """Cost of ``p`` when nothing else is shown (its step's revival included)."""
    lay = sel.layout
    u = lay.unit_of[p]
    if u not in lay.dropped_units or u in revived:
        return lay.delta[p] + sel.stub_savings.get(p, 0)
    return lay.delta[p] + lay.revival_cost(u) + (lay.runs.remove_delta(u) if u in lay.runs.start else 0)


def _explain(reasons: dict[int, str], layout: Layout, sel: Selection, value: dict[int, float], taken: list[int],
             budget: int, min_probability: float) -> None:
    """The reason of every candidate: its rank and probability when taken, else why it stayed out
    (costs as of the finished selection, all priced at once)."""
    msgs = layout.graph.messages
    cost = dict(zip(layout.candidates, sel.candidate_costs().tolist()))
    chosen = set(taken)
    for rank, p in enumerate(taken, 1):
        kind = "excerpt of oversized result" if layout.form[p] is not msgs[p] else "selected"
        c = cost[p]
        size = f"{c} tokens more than its placeholder" if c >= 0 else f"{-c} tokens fewer than its placeholder"
        reasons[p] = f"{kind} #{rank}: reuse probability {value[p]:.3f}, {size}"
    for p in layout.candidates:
        if p not in chosen:
            why = (f"reuse probability {value[p]:.3f} below min_probability {min_probability:g}"
                   if value[p] == 0 else f"reuse probability {value[p]:.3f}; showing it would add {cost[p]} tokens, "
                   f"{budget - sel.used} of the {budget} tokens it rendered to were left when the selection ended")
            reasons[p] = f"omitted: {why}"


class Learned:
    """The learned selector (see module docstring). The model file is read once per instance.

    Raises:
        historygraph.policies.learned.model.ReuseModelError: the configured model file cannot be used.
    """

    Config = LearnedConfig

    def __init__(self, name: str = "learned", config: LearnedConfig | None = None) -> None:
        self.name = name
        self.config = config or LearnedConfig()
        path = self.config.model or os.environ.get("HISTORYGRAPH_LEARNED_MODEL") or None
        try:
            self.model = ReuseModel.load(path)
        except ReuseModelError as exc:
            if self.config.model or not path:
                raise
            raise ReuseModelError(f"{exc} (named by $HISTORYGRAPH_LEARNED_MODEL)") from None
        #: which model renders (recorded in replay.json): its file and what it was fitted on
        self.model_info = {"file": path or "shipped historygraph/policies/learned/default_model.json", **self.model.meta}

    def with_recent(self, n: int, share: float) -> "Learned":
        """This policy showing the steps of the ``n`` newest assistant messages at every call, their
        text and calls as stored (``recent_brief`` off, no limit per step), as long as together they
        add at most ``share`` of B (``recent_share``): the cache-stable default's ``recent``
        (invariant 10, docs/architecture.md). The model is shared, not read again."""
        cfg = replace(self.config, recent_calls=n, recent_step_share=1.0, recent_share=share, recent_brief=False)
        out = copy.copy(self)
        out.config = cfg
        return out

    def reuse_probabilities(self, graph: ContextGraph, positions: list[int], signals: Signals) -> np.ndarray:
        """The fitted probability that the next invocation reuses each stored tool result at
        ``positions`` (shape ``(len(positions),)``), as :meth:`render` ranks them."""
        if not positions:
            return np.zeros(0)
        return self.model.predict(feature_matrix(graph, positions, signals.counter), np.asarray(positions, dtype=np.intp), graph)

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget, result_reserve=cfg.result_reserve,
                        excerpt_fraction=cfg.oversized_excerpt_fraction, brief_revivals=cfg.brief_revivals,
                        excerpt_focus=cfg.excerpt_focus, recent_steps=cfg.recent_steps)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        assert budget is not None  # with no budget the history always fits (above)
        cands = layout.candidates
        # scores kept per result across this graph's renders (TreeReuseModel.score; the same bits)
        prob = self.model.predict(feature_matrix(graph, cands, signals.counter), np.asarray(cands, dtype=np.intp),
                                  graph) if cands else np.zeros(0)
        layout, value, sel, taken = select_results(layout, prob, cfg, reserve_layout(layout, cfg))
        layout.defer_reasons(lambda reasons: _explain(reasons, layout, sel, dict(zip(cands, value.tolist())), taken,
                                                      budget, cfg.min_probability))
        return layout.assemble(self.name, sel)


register("learned", SOURCE, "Fitted reuse probability per result from render-time signals; knapsack on probability "
         "per token under B.")(Learned)
