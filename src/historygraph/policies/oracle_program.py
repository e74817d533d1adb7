"""The integer program behind the exact clairvoyant bound (policy ``oracle``, evaluator only).

Ours, beyond the papers. Given a :class:`~historygraph.render.Layout` in which every unprotected
step is dropped (``result_reserve=1``; each one can be brought back, in brief view with
``brief_revivals``) and the tool results the coming turn reuses (the B.4 events of
"ContextRender: From Execution Dependencies to Agent Context", arXiv:2609.37743, Appendix B.4),
:func:`best_selection` finds, exactly, the most of those results that can be shown complete within
B, and the cheapest way to do it, as a 0-1 program solved by HiGHS through
:func:`scipy.optimize.milp` (https://docs.scipy.org/doc/scipy/reference/generated/scipy.optimize.milp.html).

Variables (all tokens are the layout's own counts, so the program's cost is the renderer's):

* ``v_p``: reused result ``p`` shown complete (a result larger than B, offered only as an excerpt,
  never counts and gets none); ``v_p ≤ r_u`` when its step ``u`` is dropped;
* ``r_u``: dropped unit ``u`` brought back, at :meth:`~historygraph.render.Layout.revival_cost`
  plus the results of it that are cheaper shown than as placeholders (shown with it);
* ``s_k``, ``e_k`` in [0, 1]: a dropped-step marker starts or ends at unit ``k``. Within each run
  of dropped units, ``s_k ≥ d_k − d_{k−1}`` and ``e_k ≥ d_k − d_{k+1}`` with ``d = 1 − r``; a
  marker's tokens split into a part fixed by its first unit (wording, first message number, call
  count) and one by its last (last message number), :class:`~historygraph.render.markers.MarkerPlan`'s
  slot counts. The split is exact when each run's last message numbers rise unit by unit and the
  call-count slot costs the same for every count in the run (checked; where not, the smallest
  count is used, a bound the rendering then checks).

Constraint: the rendered history (the layout's base with every dropped unit as its run's marker,
less those markers, plus the terms above) ≤ B. Objective: the most ``v_p``, then the fewest
tokens. The newest results (invariant §5.9) are the layout's ``required``, shown whatever is
chosen; a reused one counts when its form is complete. Those shown as excerpts are priced at their
smallest excerpt (a policy may show them smaller than the layout's share), and cut only as far as
the chosen selection needs (:class:`~historygraph.policies.oracle.Oracle`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from historygraph.render import Layout


@dataclass(frozen=True)
class Choice:
    """What :func:`best_selection` chose: ``shown`` the candidate results to show (positions,
    ascending), ``revived`` the dropped units to bring back without a shown result (unit indices),
    ``tokens`` the history tokens the program priced, ``hits`` the reused results shown complete
    (newest ones included), ``seconds`` the solver's CPU time (0 when no program was needed),
    ``gap`` the solver's relative gap between ``hits`` and the best it could still prove possible:
    0 when solved to optimality, above 0 when :data:`TIME_LIMIT` stopped it (then ``hits`` is a
    lower bound of the exact figure; 1 when it stopped before any solution, and nothing beyond the
    newest results is shown)."""

    shown: list[int]
    revived: list[int]
    tokens: int
    hits: int
    seconds: float
    gap: float = 0.0


TIME_LIMIT = 30.0
"""Seconds the solver may spend on one call's program before it returns the best selection found
so far with its gap (:attr:`Choice.gap`): a long session's bound never hangs the replay."""


def best_selection(layout: Layout, reused: frozenset[int], time_limit: float = TIME_LIMIT, *, newest_slack: int = 0) -> Choice:
    """The selection on ``layout`` (every unprotected unit dropped, ``budget`` set) that shows the
    most results of ``reused`` (graph positions) complete within B, and among those the cheapest.
    ``newest_slack``: tokens the layout's base may give up (newest results shown as smaller
    excerpts), priced as given up; ``Choice.tokens`` is then that much under the layout's price.

    Raises:
        ValueError: when ``layout`` has no budget, or the solver finds no solution (it always can:
            showing nothing is the layout's own base, within B).
    """
    lay, budget = layout, layout.budget
    if budget is None:
        raise ValueError("best_selection needs a layout with a budget")
    msgs = lay.graph.messages
    required = lay.required
    base_hits = sum(1 for p, m in required.items() if p in reused and m.rendered_as is None)
    runs = lay.selection().runs.end  # every dropped unit is in one run (no unit left out)
    dropped = [u for a, b in sorted(runs.items()) for u in range(a, b + 1)]
    col_r = {u: i for i, u in enumerate(dropped)}
    extra_shown: dict[int, list[int]] = {u: [] for u in dropped}  # results cheaper shown than as placeholders
    const = lay.base_tokens - newest_slack - sum(lay._marker_tokens(a, b) for a, b in runs.items())
    targets: list[int] = []
    kept_extra: list[int] = []
    for p in lay.candidates:
        if p in required:
            continue
        u = lay.unit_of[p]
        if p in reused and lay.form[p] is msgs[p]:
            targets.append(p)
        elif lay.delta[p] < 0:
            if u in col_r:
                extra_shown[u].append(p)
            else:
                kept_extra.append(p)
                const += lay.delta[p]
    revive_cost = [lay.revival_cost(u) + sum(lay.delta[p] for p in extra_shown[u]) for u in dropped]
    if not targets:  # nothing to decide but tokens: show what costs less than its placeholder
        return Choice(sorted(kept_extra), [], const + sum(lay._marker_tokens(a, b) for a, b in runs.items()),
                      base_hits, 0.0)
    return _solve(lay, budget, targets, dropped, col_r, revive_cost, extra_shown, kept_extra, const, base_hits, runs, time_limit)


def _solve(lay: Layout, budget: int, targets: list[int], dropped: list[int], col_r: dict[int, int], revive_cost: list[int],
           extra_shown: dict[int, list[int]], kept_extra: list[int], const: int, base_hits: int, runs: dict[int, int],
           time_limit: float) -> Choice:
    """The program of :func:`best_selection` (module docstring), solved within ``time_limit`` seconds."""
    starts, ends = _marker_terms(lay, runs)
    n_t, n_r = len(targets), len(dropped)
    # columns: v (targets), r (dropped units), s, e (one per dropped unit each)
    n = n_t + 3 * n_r
    cost = np.zeros(n)
    cost[:n_t] = [lay.delta[p] for p in targets]
    cost[n_t:n_t + n_r] = revive_cost
    cost[n_t + n_r:n_t + 2 * n_r] = [starts[u] for u in dropped]
    cost[n_t + 2 * n_r:] = [ends[u] for u in dropped]
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], lb: float, ub: float) -> None:
        k = len(lo)
        for c, v in entries:
            rows.append(k)
            cols.append(c)
            vals.append(v)
        lo.append(lb)
        hi.append(ub)

    for i, p in enumerate(targets):
        u = lay.unit_of[p]
        if u in col_r:
            row([(i, 1.0), (n_t + col_r[u], -1.0)], -np.inf, 0.0)  # v_p ≤ r_u
    for a, b in runs.items():
        for k in range(a, b + 1):
            r_k, s_k, e_k = n_t + col_r[k], n_t + n_r + col_r[k], n_t + 2 * n_r + col_r[k]
            # s_k ≥ d_k − d_{k−1} and e_k ≥ d_k − d_{k+1}, with d = 1 − r (d = 0 outside the run)
            row([(s_k, 1.0), (r_k, 1.0)] + ([(r_k - 1, -1.0)] if k > a else []), 0.0 if k > a else 1.0, np.inf)
            row([(e_k, 1.0), (r_k, 1.0)] + ([(r_k + 1, -1.0)] if k < b else []), 0.0 if k < b else 1.0, np.inf)
    row([(c, float(cost[c])) for c in range(n) if cost[c]], -np.inf, float(budget - const))
    weight = 0.5 / (1.0 + float(np.abs(cost).sum()))  # fewer tokens only breaks ties: all of it is under one result
    objective = weight * cost
    objective[:n_t] -= 1.0
    integrality = np.zeros(n)
    integrality[:n_t + n_r] = 1
    A = coo_array((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    t0 = time.process_time()
    res = milp(objective, integrality=integrality, bounds=Bounds(0, 1),
               constraints=LinearConstraint(A, lo, hi), options={"mip_rel_gap": 1e-9, "time_limit": time_limit})
    seconds = time.process_time() - t0
    if res.x is None:
        if res.status != 1:  # 1: the time limit; anything else is a program that cannot be (showing nothing fits)
            raise ValueError(f"the oracle's integer program found no solution: {res.message}")
        return Choice(sorted(kept_extra), [], const + sum(lay._marker_tokens(a, b) for a, b in runs.items()),
                      base_hits, seconds, 1.0)
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0) if res.status == 1 else 0.0
    x = np.round(res.x).astype(int)
    shown = [p for i, p in enumerate(targets) if x[i]]
    back = [u for u in dropped if x[n_t + col_r[u]]]
    with_result = {lay.unit_of[p] for p in shown}
    shown += kept_extra + [p for u in back for p in extra_shown[u]]
    tokens = const + int(cost[:n_t + n_r] @ x[:n_t + n_r]) + _markers(lay, runs, set(back))
    return Choice(sorted(shown), [u for u in back if u not in with_result and not extra_shown[u]], tokens,
                  base_hits + int(x[:n_t].sum()), seconds, gap)


def _marker_terms(lay: Layout, runs: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """Per dropped unit, the tokens of a marker starting there and those of one ending there
    (see the module docstring); their sum over a run's first and last unit is the marker's."""
    lo, hi, _top, ncalls, _pre = lay._unit_facts()  # (a marker's last number is the highest of its units': hi[k] when they rise)
    plan = lay._plan
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for a, b in runs.items():
        if plan is None:  # markers counted whole: a unit's own marker, split evenly (a bound; checked)
            for k in range(a, b + 1):
                whole = lay._marker_tokens(k, k)
                starts[k], ends[k] = whole - whole // 2, whole // 2
            continue
        n_slot = min(plan.number("n", v) for v in range(sum(ncalls[a:b + 1]) + 1))
        for k in range(a, b + 1):
            starts[k] = plan.const + plan.number("first", lo[k]) + n_slot
            ends[k] = plan.number("last", hi[k])
    return starts, ends


def _markers(lay: Layout, runs: dict[int, int], back: set[int]) -> int:
    """Tokens of the markers left when the units ``back`` are brought back: one per stretch of
    each run still dropped."""
    total = 0
    for a, b in runs.items():
        k = a
        while k <= b:
            if k in back:
                k += 1
                continue
            j = k
            while j + 1 <= b and j + 1 not in back:
                j += 1
            total += lay._marker_tokens(k, j)
            k = j + 1
    return total
