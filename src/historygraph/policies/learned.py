"""``learned``: show the results most likely to be reused, per token of budget (ours, beyond the papers).

1. If the complete history fits in B it is returned unchanged (as ContextRender, arXiv:2609.37743,
   A.1 lines 6–7), under the shared :class:`~historygraph.render.Layout` (budget scope,
   placeholders, step dropping and revival, oversized excerpts).
2. Each candidate result ``r`` gets ``p(r)``, the probability that the next invocation reuses one of
   its values, from a small fitted model (:class:`~historygraph.fit.model.ReuseModel`) over
   render-time features only (:mod:`historygraph.fit.features`: age, observed reuse of Tool-Flow
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
   alone beats the greedy set (the classic guarantee of half the optimum). An oversized result is offered as its
   marked excerpt, valued at ``excerpt_value·p``. Results with ``p < min_probability`` are not shown
   (fewer tokens sent when nothing else is likely to be needed).
4. Layout (ours): non-tool history keeps only the newest steps within ``(1 − result_reserve)·B``
   (0.95: 5 % of B), so old steps that hold nothing worth showing leave room for results; a step
   comes back when one of its results is shown, in brief view (its calls, its text replaced by a
   marker naming the call id; :class:`~historygraph.render.Layout` ``brief_revivals``).
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass

import numpy as np

from ..fit.features import feature_matrix
from ..fit.model import ReuseModel, ReuseModelError
from ..graph import ContextGraph
from ..render import Layout, Rendering, Selection
from .base import Signals, register

SOURCE = "ours: fitted reuse probability (render-time features incl. ContextRender TFA) + knapsack under B"


@dataclass(frozen=True)
class LearnedConfig:
    """``model``: path of a model file written by ``historygraph fit`` (``""``: the file named by the
    environment variable ``HISTORYGRAPH_LEARNED_MODEL``, else the shipped default).
    ``min_probability``: results less likely to be reused are not shown. ``excerpt_value``: the
    value of an oversized result's excerpt relative to the whole result. ``result_reserve``: share of
    B not given to retained non-tool history (:class:`~historygraph.render.Layout`; older steps come
    back only with a result). ``brief_revivals``: such a step shows its calls, not its text.
    ``cost_exponent``: rank by ``p / cost^α``. The defaults of the last three were chosen by grouped
    5-fold cross-validation on the 90 training trajectories at B = 6000 and 3000 (docs/learned.md);
    settings within 0.5 points of each other were tied there."""

    model: str = ""
    min_probability: float = 0.0
    excerpt_value: float = 0.5
    oversized_excerpt_fraction: float = 0.25
    result_reserve: float = 0.95
    brief_revivals: bool = True
    cost_exponent: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_probability < 1.0:
            raise ValueError(f"learned config: min_probability must be in [0, 1), got {self.min_probability}")
        if not 0.0 <= self.excerpt_value <= 1.0:
            raise ValueError(f"learned config: excerpt_value must be in [0, 1], got {self.excerpt_value}")
        if not 0 < self.oversized_excerpt_fraction <= 1:
            raise ValueError("learned config: oversized_excerpt_fraction must be in (0, 1]")
        if not 0.0 <= self.cost_exponent <= 1.0:
            raise ValueError(f"learned config: cost_exponent must be in [0, 1], got {self.cost_exponent}")
        if not 0.0 <= self.result_reserve < 1.0:
            raise ValueError(f"learned config: result_reserve must be in [0, 1), got {self.result_reserve}")


_IDLE_POPS = 64  # pops without a take before knapsack_select checks whether anything left can fit


def knapsack_select(candidates: list[int], value: dict[int, float], sel: Selection, cost_exponent: float = 1.0) -> list[int]:
    """Greedy 0/1 knapsack on ``value[p] / sel.cost(p)`` with the best-single-item swap (see module
    docstring, step 3); fills ``sel`` and returns the positions taken, in selection order. Costs are
    re-read when a revival lowers them (the other results of a revived step become cheaper: they are
    queued again at their new ratio). Items with value ≤ 0 are never taken; costs below one token
    count as one. ``cost_exponent`` ``α`` ranks by ``value / cost^α`` instead (``α = 1``: the knapsack
    ratio; ``α < 1`` favours larger results that are likely to be reused over many small unlikely ones)."""
    items = [p for p in candidates if value[p] > 0]
    a = cost_exponent
    power: dict[int, float] = {}  # max(1, c) ** α per cost c met (costs are few distinct integers)

    def ratio(p: int, c: int) -> float:
        d = power.get(c)
        if d is None:
            d = power[c] = max(1, c) ** a
        return -value[p] / d

    lay = sel.layout
    base_used, base_revived, base_shown = sel.used, set(sel.revived), dict(sel.shown)
    # every candidate priced at once; before anything is revived that is also its cost alone
    cands = lay.candidates
    costs0 = sel.candidate_costs()
    cost0 = dict(zip(cands, costs0.tolist()))
    exact = len(cost0) == len(cands)  # the stopping check below prices candidates only
    for p in items:
        if p not in cost0:
            cost0[p], exact = sel.cost(p), False
    item_costs = [cost0[p] for p in items]
    for c in set(item_costs):
        power[c] = max(1, c) ** a
    heap = [(-value[p] / power[c], p, c) for p, c in zip(items, item_costs)]  # ratio(p, c)
    heapq.heapify(heap)
    cand_arr = np.asarray(cands, dtype=np.intp)  # sorted (Layout keeps candidates in position order)
    item_mask = np.isin(cand_arr, np.asarray(items, dtype=np.intp)) if exact else None
    item_set = set(items)
    unit_of, units = lay.unit_of, lay.units
    taken: list[int] = []
    done: set[int] = set()
    budget, dropped = lay.budget, lay.dropped_units
    table: dict[int, int] = cost0  # costs known in the current state: every one until a revival changes some
    # once no result left can fit, nothing more is taken (costs change only when one is): stop.
    # Checked with every candidate priced after `idle` pops without a take, doubling while it fails
    exact = exact and budget is not None
    idle, since = _IDLE_POPS, 0
    while heap:
        _, p, c = heapq.heappop(heap)
        if p in done:
            continue
        now = table.get(p)
        if now is None:
            now = table[p] = sel.cost(p)
        if now != c:  # its step was revived since it was queued
            heapq.heappush(heap, (ratio(p, now), p, now))
            continue
        if budget is not None and sel.used + now > budget:  # Selection.fits, with the cost in hand
            since += 1
            if exact and since >= idle:
                left = item_mask.copy()
                left[np.searchsorted(cand_arr, np.asarray(taken, dtype=np.intp))] = False  # taken: candidates
                if sel.candidate_costs()[left].min(initial=budget + 1) > budget - sel.used:
                    break
                idle, since = 2 * idle, 0
            continue  # stays out unless its step is revived (then it is queued again)
        u = unit_of[p]
        revives = u in dropped and u not in sel.revived
        sel.take(p)
        taken.append(p)
        done.add(p)
        since = 0
        if revives:
            table = {}
            for q in units[u].positions:  # the other results of the step (push order does not matter)
                if q in item_set and q not in done:
                    cq = table[q] = sel.cost(q)
                    heapq.heappush(heap, (ratio(q, cq), q, cq))
    best: int | None
    if item_mask is not None and not base_revived and lay.budget is not None:  # in bulk: costs0 are costs alone
        fit = item_mask & (base_used + costs0 <= lay.budget)
        best = None
        if fit.any():
            fits = cand_arr[fit]
            vals = np.fromiter(map(value.__getitem__, fits.tolist()), dtype=np.float64, count=len(fits))
            best = int(fits[vals == vals.max()][0])  # the most probable, ties to the older
    else:
        if lay.budget is None:
            fit_alone = items
        else:
            alone = cost0.__getitem__ if not base_revived else (lambda p: _alone(sel, p, base_revived))
            fit_alone = [p for p in items if base_used + alone(p) <= lay.budget]
        best = max(fit_alone, key=lambda p: (value[p], -p), default=None)
    if best is not None and value[best] > sum(value[p] for p in taken):
        sel.used, sel.revived, sel.shown = base_used, set(base_revived), dict(base_shown)
        sel.take(best)
        return [best]
    return taken


def reuse_values(layout: Layout, prob: np.ndarray, cfg: LearnedConfig) -> dict[int, float]:
    """Knapsack value of each candidate of ``layout`` from its reuse probability (``prob`` in
    candidate order): 0 below ``min_probability``, times ``excerpt_value`` for an oversized result
    offered as its excerpt."""
    msgs, form = layout.graph.messages, layout.form
    prob = np.asarray(prob, dtype=np.float64)
    value = dict(zip(layout.candidates, np.where(prob >= cfg.min_probability, prob, 0.0).tolist()))
    for p in [p for p in layout.candidates if form[p] is not msgs[p]]:
        value[p] = value[p] * cfg.excerpt_value
    return value


def _alone(sel: Selection, p: int, revived: set[int]) -> int:
    """Cost of ``p`` when nothing else is shown (its step's revival included)."""
    lay = sel.layout
    u = lay.unit_of[p]
    if u not in lay.dropped_units or u in revived:
        return lay.delta[p]
    return lay.delta[p] + lay.revival_cost(u) + (lay.runs.remove_delta(u) if u in lay.runs.start else 0)


def _explain(reasons: dict[int, str], layout: Layout, sel: Selection, value: dict[int, float], taken: list[int],
             budget: int | None, min_probability: float) -> None:
    """The reason of every candidate: its rank and probability when taken, else why it stayed out
    (costs as of the finished selection, all priced at once)."""
    msgs = layout.graph.messages
    cost = dict(zip(layout.candidates, sel.candidate_costs().tolist()))
    chosen = set(taken)
    for rank, p in enumerate(taken, 1):
        kind = "excerpt of oversized result" if layout.form[p] is not msgs[p] else "selected"
        c = cost[p]
        size = f"{c} tokens" if c >= 0 else f"{-c} tokens fewer than its placeholder"
        reasons[p] = f"{kind} #{rank}: reuse probability {value[p]:.3f}, {size}"
    for p in layout.candidates:
        if p not in chosen:
            why = (f"reuse probability {value[p]:.3f} below min_probability {min_probability:g}"
                   if value[p] == 0 else f"reuse probability {value[p]:.3f}; showing it costs {cost[p]} tokens, "
                   f"{budget - sel.used} were left when selection ended")
            reasons[p] = f"omitted: {why}"


class Learned:
    """The learned selector (see module docstring). The model file is read once per instance.

    Raises:
        historygraph.fit.model.ReuseModelError: the configured model file cannot be used.
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
        self.model_info = {"file": path or "shipped historygraph/fit/default_model.json", **self.model.meta}

    def render(self, graph: ContextGraph, budget: int | None, signals: Signals) -> Rendering:
        cfg = self.config
        layout = Layout(graph, signals.counter, budget, result_reserve=cfg.result_reserve,
                        excerpt_fraction=cfg.oversized_excerpt_fraction, brief_revivals=cfg.brief_revivals)
        if layout.fits_in_full:
            return layout.assemble_full(self.name)
        cands = layout.candidates
        prob = self.model.predict(feature_matrix(graph, cands, signals.counter)) if cands else np.zeros(0)
        value = reuse_values(layout, prob, cfg)
        sel = layout.selection()
        taken = knapsack_select(cands, value, sel, cfg.cost_exponent)
        layout.defer_reasons(lambda reasons: _explain(reasons, layout, sel, value, taken, budget, cfg.min_probability))
        return layout.assemble(self.name, sel)


register("learned", SOURCE, "Fitted reuse probability per result from render-time signals; knapsack on probability "
         "per token under B.")(Learned)
