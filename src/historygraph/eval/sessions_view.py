"""What a replay of real session logs answers first (Claude Code, Codex): the user's own sessions.

Two views built from a replay's rows (:mod:`.report`), shared by ``historygraph replay``'s printed
summary and ``historygraph report``:

* :func:`project_table`: per project and overall, what the recorded calls cost, how much of what
  the agent later reused its own compactions kept (the ``recorded`` row's recall), and what the
  default policy keeps and costs at each budget;
* :func:`recommend_vs_own`: per budget, the policy with the most recall among those that keep at least
  as much as the agent's own context management for no more than its bill (the same ratio);
* :func:`equal_cost`: each policy at the budget where its bill equals what the agent's own context
  management cost, and the recall it has there, beside the ``recorded`` row's. The budget is
  interpolated linearly between the replayed budgets on the like-for-like ratio
  (``bill_vs_recorded_simulated``: both bills simulated with the same tokenizer, system-prompt
  estimate and cache rule, so that the simulation's own error cancels, docs/evaluator.md, "Real
  sessions"); recall is interpolated the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from historygraph.eval.recorded import RECORDED

DEFAULT_POLICY = "learned-stable"  # the default of the proxy and the library (docs/proxy.md)
RATIO = "bill_vs_recorded_simulated"
NOT_DEPLOYABLE = (RECORDED, "full", "oracle")  # not a choice: the reference, the whole history, the bound reading the future


def default_policy(policies: list[str]) -> str:
    """The policy the per-project view shows: the proxy's and library's default when replayed, else
    the first replayed."""
    return DEFAULT_POLICY if DEFAULT_POLICY in policies else policies[0]


def project_table(rows: list[dict[str, Any]], budgets: list[int], policy: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the per-project view from ``per_project`` rows (:func:`.report.project_rows`):
    per project, sessions, calls, what was paid, the recall the agent's own compactions kept, the
    simulation's check on the agent's own requests (simulated ÷ paid), and at each budget the
    policy's recall and its bill like for like (÷ the agent's own, both simulated)."""
    at = {(r["budget"], r["project"], r["policy"]): r for r in rows}
    head = ["project", "sessions", "calls", "paid USD", "kept %", "check: simulated ÷ paid"]
    for b in budgets:
        head += [f"{policy} B={_k(b)} recall %", "bill ÷ own"]
    out = []
    for p in dict.fromkeys(r["project"] for r in rows):
        rec = at.get((budgets[0], p, RECORDED))
        if rec is None:
            continue
        cells = [p, str(rec["sessions"]), str(rec["calls"]), f"{rec['paid_usd']:.2f}", _num(rec["recall"]),
                 ratio(rec.get("bill_vs_recorded"))]
        for b in budgets:
            r = at.get((b, p, policy), {})
            cells += [_num(r.get("recall")), ratio(r.get(RATIO))]
        out.append(cells)
    return head, out


CHECK_OFF = 0.2
"""A project whose check (simulated ÷ paid) is further than this from 1 is named under the table."""


def off_checks(rows: list[dict[str, Any]], budget: int) -> list[tuple[str, float]]:
    """``(project, check)`` of the ``per_project`` rows whose simulation of the agent's own requests is
    off what was paid by more than :data:`CHECK_OFF` (as a share), ALL left out."""
    return [(r["project"], r["bill_vs_recorded"]) for r in rows
            if r["policy"] == RECORDED and r["budget"] == budget and r["project"] != "ALL"
            and r.get("bill_vs_recorded") is not None and abs(r["bill_vs_recorded"] - 1.0) > CHECK_OFF]


@dataclass(frozen=True)
class EqualCost:
    """``policy`` on ``source`` at the recorded bill: ``budget`` (tokens, interpolated; ``None`` when its
    bill is below the recorded one at every replayed budget or above it at every one, ``side`` says
    which), its ``recall`` there, and the ``recorded`` row's recall."""

    source: str
    policy: str
    budget: int | None
    recall: float | None
    recorded_recall: float | None
    side: str = ""  # "below" / "above" when no replayed budget brackets the recorded bill; "fits": the history fits them all
    ratio: float | None = None  # with a side: the bill ÷ the agent's own at the edge budget
    edge: int | None = None  # with a side: that budget (the largest or smallest at which the history does not fit)

    def line(self, budgets: list[int]) -> str:
        rec = f"the agent's own context keeps {_num(self.recorded_recall)} %"
        if self.budget is not None:
            return f"{self.policy}: at B ≈ {self.budget:,} tokens it costs what the agent's own context management cost and keeps {_num(self.recall)} % ({rec})"
        if self.side == "fits":
            return f"{self.policy}: the whole history fits every budget replayed, so it shows everything, as the agent did"
        one = len(budgets) == 1
        if self.side == "below":
            where = "at" if one else "cheaper than the agent's own wherever the history passes B; at the largest such budget replayed,"
            return (f"{self.policy}: {where} B = {self.edge or budgets[-1]:,}, it costs "
                    f"{ratio(self.ratio)}× the agent's own bill and keeps {_num(self.recall)} % ({rec})")
        where = "at" if one else "dearer than the agent's own wherever the history passes B; at the smallest such budget replayed,"
        return (f"{self.policy}: {where} B = {self.edge or budgets[0]:,}, it costs "
                f"{ratio(self.ratio)}× the agent's own bill and keeps {_num(self.recall)} % ({rec})")


def equal_cost(per_source: list[dict[str, Any]], source: str = "ALL") -> list[EqualCost]:
    """Each policy of ``source`` at the budget where its bill equals the recorded one (module
    docstring); ``[]`` when the rows have no ``recorded`` row."""
    rows = [r for r in per_source if r.get("source") == source and r.get(RATIO) is not None and r.get("budget")]
    rec = next((r for r in rows if r["policy"] == RECORDED), None)
    if rec is None:
        return []
    whole = _fits(per_source, source)
    out = []
    for policy in dict.fromkeys(r["policy"] for r in rows if r["policy"] not in NOT_DEPLOYABLE):
        pts = sorted((r["budget"], r[RATIO], r.get("recall")) for r in rows if r["policy"] == policy and r["budget"] not in whole)
        if not pts:
            out.append(EqualCost(source, policy, None, None, rec.get("recall"), "fits"))
            continue
        found = None
        for (b0, c0, r0), (b1, c1, r1) in zip(pts, pts[1:]):
            if (c0 - 1.0) * (c1 - 1.0) <= 0 and c0 != c1:
                f = (1.0 - c0) / (c1 - c0)
                recall = r0 + f * (r1 - r0) if r0 is not None and r1 is not None else None
                found = EqualCost(source, policy, int(round(b0 + f * (b1 - b0), -2)), recall, rec.get("recall"))
                break
        if found is None:
            below = all(c < 1.0 for _, c, _ in pts)
            b, c, r = pts[-1] if below else pts[0]
            found = EqualCost(source, policy, None, r, rec.get("recall"), "below" if below else "above", c, b)
        out.append(found)
    return out


@dataclass(frozen=True)
class OwnPick:
    """What to use at ``budget`` instead of the agent's own context management: the policy with the
    most recall among those that keep at least as much as the agent's own for at most its bill (like
    for like); ``None`` when none does."""

    budget: int
    policy: str | None
    recall: float | None
    ratio: float | None
    recorded_recall: float | None
    fits: bool = False  # the whole history of every session fits in B: every policy shows it all
    cheaper: tuple[str, float, float] | None = None  # with no pick: (policy, recall, ratio), the most recall below the bill
    dearer: tuple[str, float, float] | None = None  # with no pick: (policy, recall, ratio), the cheapest keeping as much
    better: tuple[int, str, float, float] | None = None  # with no pick: (budget, policy, recall, ratio), the best pick at another budget

    def line(self) -> str:
        rec = f"the agent's own context keeps {_num(self.recorded_recall)} %"
        if self.fits:
            return f"B = {self.budget:,}: the whole history fits, so no policy changes anything"
        if self.policy is None:
            whole = (self.recorded_recall or 0.0) >= 100.0  # e.g. an agent that never compacted
            line = (f"B = {self.budget:,}: the agent's own context kept all it later reused (100 %), which no policy "
                    f"matches for no more than its bill" if whole else
                    f"B = {self.budget:,}: no policy keeps as much as the agent's own context management for no more than its "
                    f"bill ({rec})")
            near = self.dearer is not None and self.dearer[2] <= NEAR_TIE  # a slightly smaller B matches the bill
            if self.better is not None:
                b, name, recall, share = self.better
                line += (f" at this budget; at B = {b:,}, {name} does: {_num(recall)} % for {ratio(share)}× its bill, the best "
                         "pick of these budgets" if share <= 1.0 else
                         f" at this budget; at B = {b:,}, {name} keeps {_num(recall)} % for {ratio(share)}× its bill, so a "
                         "slightly smaller budget costs what it cost (each policy at the agent's own bill, below)")
            elif not near:
                line += ": keep it"
            if self.dearer is not None:
                name, recall, share = self.dearer
                line += f"; {name} keeps {_num(recall)} % but costs {ratio(share)}× its bill"
                if near:
                    line += ", so a slightly smaller budget costs what it cost (each policy at the agent's own bill, below)"
            if self.cheaper is not None:
                name, recall, share = self.cheaper
                line += f"; to pay less, {name} keeps {_num(recall)} % for {ratio(share)}× its bill"
            return line
        return (f"B = {self.budget:,}: {self.policy} (recall {_num(self.recall)} %, {ratio(self.ratio)}× the agent's own bill; "
                f"{rec})")


NEAR_TIE = 1.05
"""A policy that keeps as much as the agent's own for at most this many times its bill is a near tie:
the recommendation then points to the budget where it costs the same instead of saying to keep the
agent's own (a bill 0.1 % over read as "keep it" beside a line that keeps more at the same bill)."""


def recommend_vs_own(per_source: list[dict[str, Any]], source: str = "ALL") -> list[OwnPick]:
    """Per budget, the policy to use instead of the agent's own context management (:class:`OwnPick`),
    among those whose like-for-like bill is at most 1 (``[]`` without a ``recorded`` row). A budget with
    no pick names the best pick of the other budgets (``better``), so that its line does not say to
    keep the agent's own where a smaller budget beats it on both recall and bill."""
    rows = [r for r in per_source if r.get("source") == source and r.get("budget")]
    whole = _fits(per_source, source)
    out = []
    for b in sorted({r["budget"] for r in rows}):
        at = [r for r in rows if r["budget"] == b]
        rec = next((r for r in at if r["policy"] == RECORDED), None)
        if rec is None:
            continue
        if b in whole:
            out.append(OwnPick(b, None, None, None, rec.get("recall"), fits=True))
            continue
        ok = [r for r in at if r["policy"] not in NOT_DEPLOYABLE and r.get(RATIO) is not None and r[RATIO] <= 1.0
              and (r.get("recall") or 0.0) >= (rec.get("recall") or 0.0)]
        best = max(ok, key=lambda r: (r.get("recall") or 0.0, -r[RATIO]), default=None)
        # no policy matches it (an agent that never compacted keeps 100 %): the trade-off on offer
        below = [r for r in at if r["policy"] not in NOT_DEPLOYABLE and r.get(RATIO) is not None and r[RATIO] < 1.0]
        alt = max(below, key=lambda r: (r.get("recall") or 0.0, -r[RATIO]), default=None) if best is None else None
        # ... and the cheapest that keeps as much, for more: said beside "keep it", so that a bill shown
        # rounded next to the agent's own does not read as a match left out
        same = [r for r in at if r["policy"] not in NOT_DEPLOYABLE and r.get(RATIO) is not None and r[RATIO] > 1.0
                and (r.get("recall") or 0.0) >= (rec.get("recall") or 0.0)]
        near = min(same, key=lambda r: (r[RATIO], -(r.get("recall") or 0.0)), default=None) if best is None else None
        out.append(OwnPick(b, best["policy"] if best else None, best.get("recall") if best else None,
                           best[RATIO] if best else None, rec.get("recall"),
                           cheaper=None if alt is None else (alt["policy"], alt.get("recall") or 0.0, alt[RATIO]),
                           dearer=None if near is None else (near["policy"], near.get("recall") or 0.0, near[RATIO])))
    picked = [x for x in out if x.policy is not None]
    top = max(picked, key=lambda x: (x.recall or 0.0, -(x.ratio or 0.0)), default=None)
    if top is not None:
        pointer = (top.budget, top.policy or "", top.recall or 0.0, top.ratio or 0.0)
    else:  # no pick anywhere: the best near tie, if any, is what the other budgets point to
        ties = [(x.budget, *x.dearer) for x in out if x.dearer is not None and x.dearer[2] <= NEAR_TIE]
        if not ties:
            return out
        pointer = max(ties, key=lambda t: (t[2], -t[3]))
    return [replace(x, better=pointer) if x.policy is None and not x.fits and x.budget != pointer[0] else x for x in out]


def sessions_only(per_trace: list[dict[str, Any]]) -> bool:
    """Whether every trace that made a model call is a session log (it has a recorded bill): then the
    replay is compared with the agent's own context management, not with Full history, which the
    agent never paid for."""
    return any(r.get("recorded_price_model") for r in per_trace) and \
        all(r.get("recorded_price_model") for r in per_trace if r.get("invocations"))


def ttl_note(per_trace: list[dict[str, Any]]) -> str:
    """Which cache TTL the breakpoint caches (anthropic-style) were simulated with on session logs:
    their description gives Anthropic's default, 5 minutes, but a session whose agent wrote its cache
    with the 1-hour TTL (``cache_1h``, :func:`.report.add_recorded_bills`) is simulated with 1 hour;
    ``""`` when no session did."""
    one_hour = {r.get("session"): bool(r["cache_1h"]) for r in per_trace if r.get("cache_1h") is not None}
    n = sum(one_hour.values())
    if not n:
        return ""
    which = "the session" if len(one_hour) == 1 else (f"all {len(one_hour)} sessions" if n == len(one_hour)
                                                        else f"{n} of the {len(one_hour)} sessions")
    rest = "" if n == len(one_hour) else "; the others with 5 minutes"
    return (f"cache TTL: {which} wrote the prompt cache with the 1-hour TTL, so anthropic-style is simulated with 1 hour "
            f"there (1-hour writes at 2× input), not the 5 minutes of its description{rest}")


def _fits(per_source: list[dict[str, Any]], source: str) -> set[int]:
    """The budgets at which Full history never passes B on ``source`` (every policy then renders it whole)."""
    return {r["budget"] for r in per_source if r.get("source") == source and r.get("policy") == "full"
            and r.get("budget") and r.get("max_history_tokens") is not None and r["max_history_tokens"] <= r["budget"]}


def agent_sources(per_source: list[dict[str, Any]]) -> list[str]:
    """The sources to compare with the agent's own one by one: each source of session logs when there
    are several (their caches and compactions differ), else ``ALL``."""
    srcs = list(dict.fromkeys(r["source"] for r in per_source if r.get("policy") == RECORDED and r["source"] != "ALL"))
    return srcs if len(srcs) > 1 else ["ALL"]


def _k(b: int) -> str:
    return f"{b // 1000}k" if b % 1000 == 0 else str(b)


def _num(v: Any, digits: int = 1) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def ratio(v: float | None) -> str:
    """A bill ratio (÷ the agent's own, ÷ paid) as printed: 2 decimals, or 3 where 2 would show a
    ratio that is not 1 as "1.00" (1.004 stays 1.004, so a policy dearer than the agent's own bill
    never reads as equal to it; 1.0004 is 1.00); "–" for none."""
    if v is None:
        return "–"
    return f"{v:.3f}" if f"{v:.2f}" == "1.00" and round(v, 3) != 1.0 else f"{v:.2f}"
