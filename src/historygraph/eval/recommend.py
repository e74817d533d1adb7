"""Which policy to use at each budget: the recommendation that opens the report and ends a replay.

For every budget B, price model M and source (the agent or trace format a summary row is for,
:func:`.report.summarize`) it reads that source's summary rows and picks (one recommendation for all
sources, from the ``ALL`` rows, when the replay had one source):

* the **choice**: among the policies whose cost with M's simulated prompt cache is below Full
  history's (``cost_cache_M`` < 1; Full history is 1 by construction, :mod:`.cache_cost`), the one
  with the highest Later-Used Result Recall (ContextRender B.4), the cheaper on a tie. When no policy
  is cheaper than Full history the choice is ``full`` itself (sending the whole history costs least
  with that cache); when no trace's Full history exceeds B there is nothing to choose between
  (every policy then shows the whole history) and the choice is ``None``, as it is when budget errors
  left every such trace out of every policy's cost (``Recommendation.unpriced`` says which);
* the **thrifty** pick: among the same policies, the cheapest whose recall is within ``tolerance``
  percentage points of the choice's (:data:`TOLERANCE` by default), when that is another policy.

``oracle`` (the clairvoyant selector of the replay) is never recommended: it reads the future.
The rule is a reading aid chosen for this report, not a paper's: the figures it reads are the
replay's own (recall %, cost with the cache as a ratio to Full history's, over the traces whose
Full history exceeds B). It is made per source because pooled figures mislead: where most traces of
one source never exceed B, the pooled recall of a policy is near 100 % while the agent whose
histories do exceed B gets far less.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from historygraph.eval.prices import label

TOLERANCE = 2.0  # percentage points of recall a cheaper policy may lose and still be named (the thrifty pick)
NOT_DEPLOYABLE = ("oracle", "recorded")  # the exact bound reads the future; recorded is the agent's own compaction


@dataclass(frozen=True)
class Pick:
    """One policy's figures at a budget: recall (%) and cost with a price model's cache (Full history = 1)."""

    policy: str
    recall: float
    cost: float


# why a budget has no choice (Recommendation.unpriced)
NOTHING_TO_SAVE = "no trace's Full history exceeds B; every policy shows the whole history"
BUDGET_ERRORS = ("no policy is priced: on every trace whose Full history exceeds B, each policy had calls whose "
                 "protected history B could not hold (budget errors, which leave a trace out of the cost); raise B")


@dataclass(frozen=True)
class Recommendation:
    """What to use at ``budget`` when paying by ``price_model``: ``choice`` (``None`` when no policy
    is priced there, for the reason in ``unpriced``: no trace's Full history exceeds the budget, so
    there is nothing to save, or budget errors left every such trace out of every policy's cost) and
    ``thrifty`` (a cheaper policy within the tolerance of the choice's recall, or ``None``)."""

    budget: int
    price_model: str
    choice: Pick | None
    thrifty: Pick | None
    unpriced: str = NOTHING_TO_SAVE
    source: str = "ALL"

    @property
    def none_cheaper(self) -> bool:
        """No policy costs less than Full history with this price model's cache (the choice is ``full``)."""
        return self.choice is not None and self.choice.cost >= 1.0


def recommend(per_source: Iterable[dict[str, Any]], price_models: Sequence[str],
              tolerance: float = TOLERANCE) -> list[Recommendation]:
    """One :class:`Recommendation` per budget (ascending), source (sorted; the ``ALL`` rows alone
    when the rows hold one source) and price model (in the order given), from the summary rows of
    :func:`.report.summarize` (``recall`` in %, ``cost_cache_M`` with Full = 1).

    Raises:
        ValueError: ``tolerance`` is negative (percentage points of recall).
    """
    if tolerance < 0:
        raise ValueError(f"tolerance {tolerance}: give percentage points of recall >= 0")
    rows = [r for r in per_source if r.get("policy") not in NOT_DEPLOYABLE
            and r.get("recall") is not None and r.get("budget") is not None]
    sources = sorted({str(r.get("source")) for r in rows} - {"ALL"})
    if len(sources) <= 1:
        sources = ["ALL"]
    out = []
    for b in sorted({r["budget"] for r in rows}):
        for src in sources:
            at = [r for r in rows if r["budget"] == b and r.get("source") == src]
            if not at:
                continue
            for m in price_models:
                priced = [Pick(r["policy"], r["recall"], r[f"cost_cache_{m}"]) for r in at if r.get(f"cost_cache_{m}") is not None]
                rec = _pick(b, m, priced, tolerance)
                if not priced and any(r.get("budget_errors") for r in at):
                    rec = Recommendation(b, m, None, None, BUDGET_ERRORS)
                out.append(dataclasses.replace(rec, source=src))
    return out


def _pick(budget: int, model: str, priced: list[Pick], tolerance: float) -> Recommendation:
    """:func:`recommend` at one budget and price model, over the policies priced there."""
    cheaper = [p for p in priced if p.cost < 1.0]
    if not cheaper:
        full = next((p for p in priced if p.policy == "full"), None)
        if full is None and priced:  # full did not run: its reference still costs 1 and, showing every
            full = Pick("full", 100.0, 1.0)  # result whole, has recall 100 % by B.4's definition
        return Recommendation(budget, model, full, None)
    choice = max(cheaper, key=lambda p: (p.recall, -p.cost))
    thrifty = min((p for p in cheaper if p.recall >= choice.recall - tolerance), key=lambda p: (p.cost, -p.recall))
    return Recommendation(budget, model, choice, None if thrifty.policy == choice.policy else thrifty)


def explanation(tolerance: float = TOLERANCE) -> str:
    """The paragraph that says how the recommendation was chosen (the report's first words)."""
    return ("Recommended policy per budget B, source (agent or trace format: pooled figures hide the agent whose "
            "histories exceed B) and price model: among the policies whose cost with that provider's "
            "simulated prompt cache is below Full history's (cost < 1, Full history = 1, over the traces whose Full "
            "history exceeds B), the one with the highest Later-Used Result Recall; 'cheapest within "
            f"{tolerance:g} points' is the cheapest of those whose recall is at most {tolerance:g} percentage points "
            "lower. When no policy is cheaper than Full history with that cache, Full history is the recommendation. "
            "The oracle (it reads the future) is never recommended.")


def _fig(v: float | None, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def table_rows(recs: Iterable[Recommendation], tolerance: float = TOLERANCE) -> tuple[list[str], list[list[str]]]:
    """The recommendation as a small table: header and rows of text (B, the source where there are
    several, price model, choice, its recall % and cost, the cheapest within the tolerance, its
    recall % and cost)."""
    recs = list(recs)
    by_source = any(r.source != "ALL" for r in recs)
    head = ["B"] + (["source"] if by_source else []) + ["price model", "recommended", "recall %", "cost",
                                                       f"cheapest within {tolerance:g} points", "recall %", "cost"]
    rows = []
    for r in recs:
        c, t = r.choice, r.thrifty
        rows.append([str(r.budget)] + ([r.source] if by_source else []) + [label(r.price_model),
                     f"– ({r.unpriced.split(';')[0]})" if c is None else c.policy + (" (none cheaper)" if r.none_cheaper else ""),
                     _fig(None if c is None else c.recall, 1), _fig(None if c is None else c.cost, 3),
                     "–" if t is None else t.policy, _fig(None if t is None else t.recall, 1), _fig(None if t is None else t.cost, 3)])
    return head, rows


def one_line(recs: Sequence[Recommendation], tolerance: float = TOLERANCE) -> str:
    """The recommendation at one budget and source in a line (the console after a replay): each chosen
    policy with its recall and the price models it is chosen for, then the cheaper picks within the
    tolerance."""
    if not recs:
        return ""
    b = f"B = {recs[0].budget}" + ("" if recs[0].source == "ALL" else f", {recs[0].source}")
    if all(r.choice is None for r in recs):
        return f"{b}: {recs[0].unpriced}"
    parts = []
    for policy, group in _by_policy(recs, lambda r: r.choice).items():
        recall = group[0].choice.recall  # type: ignore[union-attr]  # (grouped by a choice that is set)
        why = " (no policy is cheaper than Full history with the cache)" if group[0].none_cheaper else ""
        parts.append(f"{policy} (recall {recall:.1f} %) for {_models(group, recs)}{why}")
    line = f"{b}: " + "; ".join(parts)
    thrifty = _by_policy(recs, lambda r: r.thrifty)
    if thrifty:
        line += f"; cheapest within {tolerance:g} points: " + "; ".join(
            f"{policy} (recall {group[0].thrifty.recall:.1f} %) for {_models(group, recs)}"  # type: ignore[union-attr]
            for policy, group in thrifty.items())
    return line


def _by_policy(recs: Sequence[Recommendation], get) -> dict[str, list[Recommendation]]:  # noqa: ANN001
    """The recommendations grouped by the policy ``get`` picks from each (those where it is ``None`` left out)."""
    out: dict[str, list[Recommendation]] = {}
    for r in recs:
        p = get(r)
        if p is not None:
            out.setdefault(p.policy, []).append(r)
    return out


def _models(group: list[Recommendation], recs: Sequence[Recommendation]) -> str:
    """The price models of ``group``: 'every price model' when it is all of them."""
    if len(group) == len(recs) and len(recs) > 1:
        return "every price model"
    return ", ".join(label(r.price_model) for r in group)


def groups(recs: Sequence[Recommendation]) -> list[list[Recommendation]]:
    """``recs`` grouped by budget and source, in their order: what :func:`one_line` prints a line for."""
    out: dict[tuple[int, str], list[Recommendation]] = {}
    for r in recs:
        out.setdefault((r.budget, r.source), []).append(r)
    return list(out.values())
