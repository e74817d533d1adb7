"""Tables, JSON, CSV and a plot from replay results.

Every figure in the printed table is also in the JSON and CSV files. Rows are per budget, per
trace and per source (the reader's format name, e.g. ``mini-swe-agent``), plus an ``ALL`` row per
policy and budget. Token figures are rendered *history* tokens (what B caps); render times are per
invocation. Cost columns (:mod:`.cost`): ``cost_usd`` is eq. 3 with ρ of Full history on the
source's cost-comparison traces, ``norm_cost`` the C.1 ratio of mean costs (Full history = 1),
``*_own`` the same priced with the policy's own measured prefix-cache fraction
(``prefix_reuse_pct``, :mod:`.cache`). ``cost_cache_M`` is the normalised cost with price model
``M``'s simulated prompt cache (:mod:`.cache_cost`; one set of columns per model, every loaded model in
the JSON and CSV). ``value_recall`` is :mod:`.recall`'s value recall.
``timelines.json.gz`` holds what every policy showed of every result at every invocation.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from historygraph.eval import plots
from historygraph.eval import cache_cost
from historygraph.eval.cost import Prices, TraceCost, Usage, full_fraction, normalise, trace_cost
from historygraph.eval.recall import AGE_BINS
from historygraph.eval.prices import PriceModel, default_price_models
from historygraph.eval.recorded import RECORDED, cache_check, one_hour_tokens, recorded_bill_tokens
from historygraph.eval.replay import PolicyStats, TraceResult
from historygraph.eval.recent import COLUMNS as RECENT_COLUMNS
from historygraph.eval.steps_metrics import COLUMNS as STEPS_COLUMNS

COLUMNS = ["scope", "budget", "source", "trace_id", "session", "policy", "traces", "invocations", "events", "recall", "pct_of_oracle",
           "value_recall", "prefix_reuse_pct", "input_tokens_P", "output_tokens_O", "embedding_tokens_E", "rho_full",
           "cost_usd", "cost_usd_own", "norm_cost", "norm_cost_own", "cost_traces"] + \
    [f"recall_age_{b}" for b in AGE_BINS] + [f"events_age_{b}" for b in AGE_BINS] + \
    ["mean_history_tokens", "max_history_tokens", "mean_input_tokens", "render_ms_median", "render_ms_p95",
     "budget_errors", "invariant_violations",
     "compactions", "selection_ms_mean", "attention_s_mean", "graph_kb_session", "revival_pct", "model_calls", "model_input_tokens", "model_output_tokens",
     "model_seconds"] + STEPS_COLUMNS + RECENT_COLUMNS + ["recorded_price_model", "cache_1h", "recorded_bill_usd", "bill_vs_recorded",
                                                              "bill_vs_recorded_simulated"]


def _pct(hits: int, events: int) -> float | None:
    """A percentage to 4 decimals: shown to one, it is rounded once (84.946 → 84.9, where 2 decimals,
    84.95, printed 85.0)."""
    return round(100.0 * hits / events, 4) if events else None


def row(scope: str, source: str, trace_id: str, policy: str, st: PolicyStats, traces: int, invocations: int,
        budget: int | None = None, session: str = "") -> dict[str, Any]:
    ms = np.array(st.render_seconds) * 1000.0
    u = st.usage
    r: dict[str, Any] = {
        "scope": scope, "budget": budget, "source": source, "trace_id": trace_id, "session": session, "policy": policy,
        "traces": traces, "invocations": invocations, "events": st.events, "recall": _pct(st.hits, st.events),
        "value_recall": _pct(st.value_hits, st.events),
        "prefix_reuse_pct": round(100.0 * u.own_fraction, 2) if u.P else None,
        "input_tokens_P": u.P, "output_tokens_O": u.O, "embedding_tokens_E": u.E,
        **cache_cost.token_columns(st.prompt_cache),
    }
    for b in AGE_BINS:
        r[f"recall_age_{b}"] = _pct(st.by_age[b][1], st.by_age[b][0])
        r[f"events_age_{b}"] = st.by_age[b][0]
    r["mean_history_tokens"] = round(float(np.mean(st.history_tokens)), 1) if st.history_tokens else None
    r["max_history_tokens"] = max(st.history_tokens) if st.history_tokens else None
    r["mean_input_tokens"] = round(float(np.mean(st.input_tokens)), 1) if st.input_tokens else None
    r["render_ms_median"] = round(float(np.median(ms)), 3) if len(ms) else None
    r["render_ms_p95"] = round(float(np.percentile(ms, 95)), 3) if len(ms) else None
    r["budget_errors"] = st.budget_errors
    r.update(compaction_figures(st.extra))
    r["invariant_violations"] = len(st.violations)
    r.update(st.steps.columns())
    r.update(st.recent.columns())
    r["model_calls"] = st.model_calls
    r["model_input_tokens"] = st.model_input_tokens
    r["model_output_tokens"] = st.model_output_tokens
    r["model_seconds"] = round(st.model_seconds, 2)
    return r


def compaction_figures(extra: dict[str, list[float]]) -> dict[str, Any]:
    """Figures of policies that report compactions in ``Rendering.stats`` (ReCAP, §5.2 and C.2):
    compactions, mean selection time (ms) and proxy attention time (s) per compaction, mean over
    sessions of the peak graph-state size (KB), and the share of compaction transitions that
    revive at least one block omitted by the previous compaction (%). ``None`` when not reported."""
    def mean(key: str, scale: float = 1.0) -> float | None:
        v = extra.get(key)
        return round(float(np.mean(v)) * scale, 3) if v else None
    comp = extra.get("compaction")
    return {"compactions": int(sum(comp)) if comp else None, "selection_ms_mean": mean("selection_s", 1000.0),
            "attention_s_mean": mean("attention_s"), "graph_kb_session": mean("graph_bytes_session", 1 / 1000),
            "revival_pct": mean("revived", 100.0)}


def _rhos(results: list[TraceResult]) -> dict[tuple[int | None, str], float]:
    """ρ of Full history per (budget, source) and (budget, ``ALL``) over the cost-comparison traces
    (ContextRender C.2: one fraction per setting, used to price every policy)."""
    groups: dict[tuple[int | None, str], list[Usage]] = defaultdict(list)
    for res in results:
        if res.compared and res.reference is not None:  # (compared implies a reference)
            groups[(res.budget, res.source)].append(res.reference.usage)
            groups[(res.budget, "ALL")].append(res.reference.usage)
    return {k: full_fraction(v) for k, v in groups.items()}


def references(results: list[TraceResult]) -> dict[str, dict[str, Any]]:
    """Full history's output tokens and tokens through each price model's cache, per trace and
    budget (``"{budget}|{session}"``, :mod:`.cache_cost`)."""
    return {f"{r.budget}|{r.session_id}": cache_cost.reference_entry(r.reference.usage.O, r.reference.prompt_cache, r.bound)
            for r in results if r.reference is not None}


def summarize(results: list[TraceResult], prices: Prices = Prices(),
              price_models: dict[str, PriceModel] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(per_trace_rows, per_source_rows)``; per-source rows include ``source == "ALL"``, one set
    per budget. ``prices``: eq. 3 prices (USD per million tokens); ``price_models``: the models the
    replay simulated (default: the shipped ones), priced by :func:`.cache_cost.add_cache_costs`."""
    per_trace = []
    groups: dict[tuple, dict[str, PolicyStats]] = defaultdict(lambda: defaultdict(PolicyStats))
    costs: dict[tuple, dict[str, list[TraceCost]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    rhos = _rhos(results)
    for res in results:
        rho = rhos.get((res.budget, res.source))
        for key in ((res.budget, res.source), (res.budget, "ALL")):
            counts[key][0] += 1
            counts[key][1] += res.invocations
        for policy, st in res.stats.items():
            r = row("trace", res.source, res.trace_id, policy, st, 1, res.invocations, res.budget, res.session_id)
            if res.reference is not None:
                r["rho_full"] = round(rho, 4) if rho is not None else None
                if rho is not None and not st.budget_errors:
                    r["cost_usd"] = round(trace_cost(st.usage, rho, prices), 6)
                    r["cost_usd_own"] = round(trace_cost(st.usage, st.usage.own_fraction, prices), 6)
                    full_cost = trace_cost(res.reference.usage, rho, prices)
                    r["norm_cost"] = round(r["cost_usd"] / full_cost, 4) if full_cost else None
                r["cost_traces"] = int(res.compared)
            per_trace.append(r)
            for key in ((res.budget, res.source), (res.budget, "ALL")):
                groups[key][policy].merge(st)
                if res.reference is not None and rho is not None:
                    costs[key][policy].append(TraceCost(st.usage, res.reference.usage, rho, res.compared, st.budget_errors > 0))
    per_source = []
    for key in sorted(groups, key=lambda k: (k[0] or 0, k[1] == "ALL", k[1])):
        budget, src = key
        for policy, st in groups[key].items():
            traces, invocations = counts[key]
            r = row("source", src, "", policy, st, traces, invocations, budget=budget)
            if key in costs:
                n = normalise(costs[key][policy], prices)
                rho = rhos.get(key)
                r.update(rho_full=round(rho, 4) if rho is not None else None, cost_traces=n.traces,
                         cost_usd=_round(n.mean_cost, 6), norm_cost=_round(n.normalised, 4),
                         cost_usd_own=_round(n.mean_cost_own, 6), norm_cost_own=_round(n.normalised_own, 4))
            per_source.append(r)
    _of_oracle(per_trace, ("budget", "source", "trace_id"))
    _of_oracle(per_source, ("budget", "source"))
    models = default_price_models() if price_models is None else price_models
    cache_cost.add_cache_costs(per_trace, per_source, references(results), models)
    add_recorded_bills(per_trace, per_source, results, models)
    return per_trace, per_source


def add_recorded_bills(per_trace: list[dict[str, Any]], per_source: list[dict[str, Any]], results: list[TraceResult],
                       models: dict[str, PriceModel]) -> None:
    """On traces with recorded usage (Claude Code, Codex logs; :mod:`.recorded`): ``recorded_bill_usd``,
    what the recorded calls cost under the price model of the recorded model
    (``recorded_price_model``), and ``bill_vs_recorded``, each row's simulated cost with that model's
    cache (``cost_cache_usd_M``) divided by it; per source, the ratio of the sums over the traces
    where the row has a cost, and the mean recorded bill per trace. For the ``recorded`` row itself
    the ratio checks the cache simulation against what was billed (docs/evaluator.md).
    ``bill_vs_recorded_simulated``: the row's cost over the ``recorded`` row's simulated cost, like for
    like (the same tokenizer, estimate of the system prompt and cache simulation on both sides).
    ``cache_1h``: the session's agent wrote its prompt cache with the 1-hour TTL, so the replay
    simulated breakpoint caches (anthropic-style) with that TTL (:func:`.recorded.uses_one_hour_cache`)."""
    sim_recorded = {(r.get("budget"), r.get("session")): r for r in per_trace if r["policy"] == RECORDED}
    bills: dict[tuple, tuple[str, float, bool]] = {}
    for res in results:
        if res.recorded is not None and res.home_model in models:
            bills[(res.budget, res.session_id)] = (res.home_model, recorded_bill_tokens(res.recorded, models[res.home_model]),
                                                   one_hour_tokens(res.recorded[0]))
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0.0])  # Σ cost, Σ paid, n, Σ recorded simulated
    for r in per_trace:
        got = bills.get((r.get("budget"), r.get("session")))
        if got is None:
            continue
        home, paid, one_hour = got
        r["recorded_price_model"], r["recorded_bill_usd"], r["cache_1h"] = home, round(paid, 6), one_hour
        cost = r.get(f"cost_cache_usd_{home}")
        sim = sim_recorded.get((r.get("budget"), r.get("session")), {}).get(f"cost_cache_usd_{home}")
        if cost is not None and paid and sim:
            r["bill_vs_recorded"] = round(cost / paid, 4)
            r["bill_vs_recorded_simulated"] = round(cost / sim, 4)
            for src in (r["source"], "ALL"):
                s = sums[(r.get("budget"), src, r["policy"])]
                s[0] += cost
                s[1] += paid
                s[2] += 1
                s[3] += sim
    for r in per_source:
        tot = sums.get((r.get("budget"), r["source"], r["policy"]))
        if tot:
            r["recorded_bill_usd"] = round(tot[1] / tot[2], 6)
            r["bill_vs_recorded"] = round(tot[0] / tot[1], 4) if tot[1] else None
            r["bill_vs_recorded_simulated"] = round(tot[0] / tot[3], 4) if tot[3] else None


def _of_oracle(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    """Add ``pct_of_oracle`` (recall as a percentage of the ``oracle`` policy's recall in the same
    group) to every row whose group has an oracle row with non-zero recall, except rows of a policy
    that went over the budget (``max_history_tokens`` > ``budget``, as ``full`` does): the oracle is
    the limit under B, so such a share (over 100 for ``full``) compares nothing."""
    ref = {tuple(r.get(k) for k in keys): r.get("recall") for r in rows if r.get("policy") == "oracle"}
    for r in rows:
        o = ref.get(tuple(r.get(k) for k in keys))
        over = (r.get("max_history_tokens") or 0) > (r.get("budget") or float("inf"))
        if o and r.get("recall") is not None and not over:
            r["pct_of_oracle"] = round(100.0 * r["recall"] / o, 1)


def project_rows(per_trace: list[dict[str, Any]], results: list[TraceResult]) -> list[dict[str, Any]]:
    """Per budget, project of session logs (:func:`.recorded.project_of`; and ``ALL``) and row (every
    policy and ``recorded``): sessions, model calls, reuse events, recall (%), what the recorded calls
    were billed (``paid_usd``, Σ over the sessions, the recorded model's price model), the row's
    simulated bill with that model's cache (``bill_usd``) and their ratio (``bill_vs_recorded``), and
    like for like, over the ``recorded`` row's simulated bill (``bill_vs_recorded_simulated``).
    Needs :func:`add_recorded_bills` on ``per_trace`` first; ``[]`` without session logs."""
    project: dict[tuple[Any, Any], str] = {(r.budget, r.session_id): r.project for r in results if r.project}
    own = {(r.get("budget"), r.get("session")): r.get(f"cost_cache_usd_{r.get('recorded_price_model')}")
           for r in per_trace if r["policy"] == RECORDED}
    sums: dict[tuple, dict[str, Any]] = {}
    for r in per_trace:
        p = project.get((r.get("budget"), r.get("session")))
        if p is None:
            continue
        for key in ((r.get("budget"), p, r["policy"]), (r.get("budget"), "ALL", r["policy"])):
            s = sums.setdefault(key, {"sessions": 0, "calls": 0, "events": 0, "hits": 0.0, "paid": 0.0, "bill": 0.0, "priced": 0.0,
                                      "own": 0.0})
            s["sessions"] += 1
            s["calls"] += r.get("invocations") or 0
            s["events"] += r.get("events") or 0
            s["hits"] += (r.get("recall") or 0.0) * (r.get("events") or 0) / 100.0
            paid = r.get("recorded_bill_usd") or 0.0
            s["paid"] += paid
            home = r.get("recorded_price_model")
            cost = r.get(f"cost_cache_usd_{home}") if home else None
            sim = own.get((r.get("budget"), r.get("session")))
            if cost is not None and paid and sim:
                s["bill"] += cost
                s["priced"] += paid
                s["own"] += sim
    rows = []
    for (budget, proj, policy), s in sorted(sums.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] == "ALL", kv[0][1])):
        rows.append({"budget": budget, "project": proj, "policy": policy, "sessions": s["sessions"], "calls": s["calls"],
                     "events": s["events"], "recall": _pct(round(s["hits"]), s["events"]), "paid_usd": round(s["paid"], 4),
                     "bill_usd": round(s["bill"], 4) if s["priced"] else None,
                     "bill_vs_recorded": round(s["bill"] / s["priced"], 4) if s["priced"] else None,
                     "bill_vs_recorded_simulated": round(s["bill"] / s["own"], 4) if s["own"] else None})
    return rows


def cache_checks(results: list[TraceResult]) -> dict[str, dict[str, Any]]:
    """The cache check per source and ``ALL`` (:func:`.recorded.cache_check`): the recorded requests of
    the session logs through the simulated cache of their model's price model against what they were
    billed (the first budget's results: the recorded requests are the same at every budget)."""
    if not results:
        return {}
    first = results[0].budget
    calls: dict[str, list] = defaultdict(list)
    for res in results:
        if res.budget == first and res.cache_calls:
            calls[f"{res.source} ({res.home_model})"] += res.cache_calls
            calls["ALL"] += res.cache_calls
    if len(calls) == 2:  # one source: ALL repeats it
        calls.pop("ALL")
    return {k: cache_check(v) for k, v in sorted(calls.items(), key=lambda kv: (kv[0] == "ALL", kv[0]))}


def _round(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def timelines(results: list[TraceResult]) -> dict[str, Any]:
    """``"{budget}|{session}"`` -> the trace's :class:`~.replay.Timeline` as JSON-able data."""
    out = {}
    for res in results:
        t = res.timeline
        if t is not None:
            out[f"{res.budget}|{res.session_id}"] = {"source": res.source, "trace_id": res.trace_id, "budget": res.budget,
                                                     "results": t.results, "invocations": t.invocations,
                                                     "forms": t.forms, "events": t.events}
    return out


def write_outputs(out_dir: Path, results: list[TraceResult], meta: dict[str, Any],
                  prices: Prices = Prices(), price_models: dict[str, PriceModel] | None = None) -> dict[str, Path]:
    """Write ``replay.json``, ``replay.csv``, ``timelines.json.gz`` and (when matplotlib is installed)
    ``recall_by_age.png`` (at the first budget): everything ``historygraph report`` reads.
    ``price_models``: those the replay simulated (default: the shipped ones).

    Each file is written under a temporary name beside it and the set renamed into place only
    when every file was written, so a failure (a full disk) leaves no truncated file and the
    previous outputs as they were.

    Raises:
        OSError: a file could not be written (``errno.ENOSPC`` for a full disk); nothing was renamed.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    try:
        paths = _write_staged(out_dir, results, meta, prices, price_models, staged)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in staged:
        os.replace(tmp, final)
    return paths


def _write_staged(out_dir: Path, results: list[TraceResult], meta: dict[str, Any], prices: Prices,
                  price_models: dict[str, PriceModel] | None, staged: list[tuple[Path, Path]]) -> dict[str, Path]:
    """:func:`write_outputs`' files, each at a temporary name added to ``staged`` (temporary, final)."""
    def tmp(final: Path) -> Path:
        path = final.with_name(f".{final.name}.partial")
        staged.append((path, final))
        return path

    models = default_price_models() if price_models is None else price_models
    per_trace, per_source = summarize(results, prices, models)
    paths = {"json": out_dir / "replay.json", "csv": out_dir / "replay.csv", "timelines": out_dir / "timelines.json.gz"}
    violations = {f"{r.budget}/{r.source}/{r.trace_id}/{p}": st.violations for r in results for p, st in r.stats.items() if st.violations}
    meta = {**meta, "prices": {"input": prices.input, "cached_input": prices.cached_input, "output": prices.output,
                               "embedding": prices.embedding},
            "price_models": {n: m.to_json() for n, m in models.items()}}
    tmp(paths["json"]).write_text(json.dumps({"meta": meta, "per_source": per_source, "per_trace": per_trace,
                                              "cache_check": cache_checks(results), "per_project": project_rows(per_trace, results),
                                              "references": references(results), "invariant_violations": violations}, indent=2))
    with tmp(paths["csv"]).open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS + cache_cost.columns(models))
        w.writeheader()
        w.writerows(per_source + per_trace)
    with gzip.open(tmp(paths["timelines"]), "wt", encoding="utf-8") as fh:
        json.dump(timelines(results), fh)
    first = per_source[0]["budget"] if per_source else None
    try:
        png = plots.recall_by_age([r for r in per_source if r["budget"] == first], list(dict.fromkeys(r["policy"] for r in per_source)),
                                  recall_by_age_title(first, meta))
    except RuntimeError:  # matplotlib missing
        png = None
    if png:
        paths["plot"] = out_dir / "recall_by_age.png"
        tmp(paths["plot"]).write_bytes(png)
    return paths


def table_sources(sources: Iterable[str]) -> list[str]:
    """The sources of a run's summary rows in order, without ALL when there is one source only (its
    ALL rows repeat that source's): the sources the printed tables and the report show."""
    out = list(dict.fromkeys(sources))
    return [s for s in out if s != "ALL"] if len(set(out) - {"ALL"}) == 1 else out


def trace_set(meta: dict[str, Any]) -> str:
    """The trace set of a replay, as every figure's title names it: how many trajectories it
    replayed (those done, when it was interrupted) and the paths it read (``meta`` of ``replay.json``)."""
    paths = meta.get("paths") or []
    n = meta.get("trajectories_done", meta.get("trajectories"))
    return f"{n} trace{'' if n == 1 else 's'} from {', '.join(paths) if paths else 'the run'}"


def recall_by_age_title(budget: int | None, meta: dict[str, Any]) -> str:
    """The title of the recall-by-age figure (replay's ``recall_by_age.png`` and the report's): B
    and the trace set (:func:`trace_set`)."""
    return f"Later-Used Result Recall by result age at B = {budget}; {trace_set(meta)}"
