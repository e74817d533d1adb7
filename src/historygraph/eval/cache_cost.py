"""Cost with the provider's prompt cache, per price model, in the replay's rows (JSON, CSV, table, report).

For every price model ``m`` (:mod:`.prices`) a row carries the agent input tokens its simulated
cache read, wrote and left uncached (``cache_read_m``, ``cache_write_m``, ``cache_uncached_m``,
:mod:`.prompt_cache`), the cost in USD (``cost_cache_usd_m``: those tokens, the output and
embedding tokens, and the summariser/analyser input as uncached input, :func:`~.prompt_cache.bill`)
the bill bound at the row's recall (``bound_cache_usd_m`` and ``bound_cache_m``, normalised the same
way: the least any rendering keeping the invariants could cost with that recall, :mod:`.bill_bound`),
and the normalised cost ``cost_cache_m``: per trace the ratio to Full history on the same trace
under the same model, per source ContextRender eq. 9's ratio of means over the cost-comparison
traces (Full history exceeds B) where the policy had no budget error, as :func:`.cost.normalise`
does, so Full history = 1. Full history's tokens on each trace are the run's ``references``
(``"{budget}|{session}"`` -> output tokens and tokens per model), kept in ``replay.json`` so that
``historygraph report --prices FILE`` can reprice a run (:func:`reprice`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict
from typing import Any, Iterable

from historygraph.eval.bill_bound import BoundInputs, bill_bound
from historygraph.eval.prices import PriceModel, PriceModelError
from historygraph.eval.prompt_cache import CacheTokens, bill

KINDS = ("read", "write", "uncached", "write_1h")


def columns(models: Iterable[str]) -> list[str]:
    """The row columns of every price model, in order."""
    out = []
    for m in models:
        out += [f"cost_cache_{m}", f"cost_cache_usd_{m}", f"bound_cache_{m}", f"bound_cache_usd_{m}"] + [f"cache_{k}_{m}" for k in KINDS]
    return out


def token_columns(tokens: dict[str, CacheTokens]) -> dict[str, int]:
    """``cache_{read,write,uncached}_m`` of one row."""
    return {f"cache_{k}_{m}": getattr(t, k) for m, t in tokens.items() for k in KINDS}


def row_tokens(row: dict[str, Any], model: str) -> CacheTokens | None:
    """A row's tokens under ``model`` (``None`` when the row has none)."""
    if row.get(f"cache_read_{model}") is None:
        return None
    return CacheTokens(*(int(row.get(f"cache_{k}_{model}") or 0) for k in KINDS))  # (write_1h: absent in older runs)


def reference_entry(output: int, tokens: dict[str, CacheTokens], bound: BoundInputs | None = None) -> dict[str, Any]:
    """Full history's figures on one trace, as ``replay.json``'s ``references`` holds them (with the
    bill bound's inputs, ``bound``, when known)."""
    entry: dict[str, Any] = {"output": output, "cache": {m: asdict(t) for m, t in tokens.items()}}
    if bound is not None:
        entry["bound"] = bound.to_json()
    return entry


def _bound(row: dict[str, Any], ref: dict[str, Any] | None, model: PriceModel) -> float | None:
    """The bill bound (USD) at ``row``'s recall on its trace (``None`` for a run without it)."""
    if not ref or "bound" not in ref or row.get("budget_errors"):
        return None
    return bill_bound(model, BoundInputs(**ref["bound"]), ref.get("output") or 0, row.get("recall") or 0.0)


def _row_cost(row: dict[str, Any], name: str, model: PriceModel) -> float | None:
    t = row_tokens(row, name)
    if t is None or row.get("budget_errors"):
        return None
    model_in = row.get("model_input_tokens") or 0
    return bill(model, t, row.get("output_tokens_O") or 0, row.get("embedding_tokens_E") or 0, model_in)


def _full_cost(ref: dict[str, Any] | None, name: str, model: PriceModel) -> float | None:
    if not ref or name not in ref.get("cache", {}):
        return None
    return bill(model, CacheTokens(**ref["cache"][name]), ref.get("output") or 0)


def add_cache_costs(per_trace: list[dict[str, Any]], per_source: list[dict[str, Any]],
                    references: dict[str, dict[str, Any]], models: dict[str, PriceModel]) -> None:
    """Fill ``cost_cache_usd_m`` and ``cost_cache_m`` of every row for every model (module docstring)."""
    # (budget, source, policy, m) -> [Σ cost, Σ Full, n, Σ bound, n with a bound]
    sums: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0, 0.0, 0])
    for r in per_trace:
        ref = references.get(f"{r.get('budget')}|{r.get('session')}")
        for name, model in models.items():
            cost, full, least = _row_cost(r, name, model), _full_cost(ref, name, model), _bound(r, ref, model)
            r[f"cost_cache_usd_{name}"] = None if cost is None else round(cost, 6)
            r[f"cost_cache_{name}"] = round(cost / full, 4) if cost is not None and full else None
            r[f"bound_cache_usd_{name}"] = None if least is None else round(least, 6)
            r[f"bound_cache_{name}"] = round(least / full, 4) if least is not None and full else None
            if cost is not None and full is not None and r.get("cost_traces"):
                for src in (r["source"], "ALL"):
                    s = sums[(r.get("budget"), src, r["policy"], name)]
                    s[0] += cost
                    s[1] += full
                    s[2] += 1
                    if least is not None:
                        s[3] += least
                        s[4] += 1
    for r in per_source:
        for name in models:
            tot = sums.get((r.get("budget"), r["source"], r["policy"], name))
            r[f"cost_cache_usd_{name}"] = round(tot[0] / tot[2], 6) if tot else None
            r[f"cost_cache_{name}"] = round(tot[0] / tot[1], 4) if tot and tot[1] else None
            whole = tot is not None and tot[4] == tot[2] and tot[1]  # a bound for every trace of the cost
            r[f"bound_cache_usd_{name}"] = round(tot[3] / tot[2], 6) if tot and whole else None
            r[f"bound_cache_{name}"] = round(tot[3] / tot[1], 4) if tot and whole else None


def reprice(run_models: dict[str, dict[str, Any]], per_trace: list[dict[str, Any]], per_source: list[dict[str, Any]],
            references: dict[str, dict[str, Any]], models: dict[str, PriceModel]) -> None:
    """Price a finished run with ``models`` (a user's file): each must have the cache rule of a
    model the run simulated (``run_models``: name -> :meth:`PriceModel.to_json`); its tokens are
    that model's and its columns are added (or replaced) in every row.

    Raises:
        PriceModelError: a model whose rule the run did not simulate (names the rule and the fix).
    """
    simulated = {PriceModel(**spec).rule: name for name, spec in run_models.items()}
    for name, model in models.items():
        source = simulated.get(model.rule)
        if source is None:
            raise PriceModelError(
                f"price model [{name}]: its cache rule (caching, min_tokens, step, ttl_calls, max_breakpoints, lookback_blocks, ttl_seconds = "
                f"{', '.join(map(str, model.rule))}) was not simulated in this run, which has {', '.join(run_models)}; "
                "replay with --prices FILE to simulate it")
        if source != name:
            for r in per_trace + per_source:
                for k in KINDS:
                    r[f"cache_{k}_{name}"] = r.get(f"cache_{k}_{source}")
            for ref in references.values():
                if source in ref.get("cache", {}):
                    ref["cache"][name] = ref["cache"][source]
    add_cache_costs(per_trace, per_source, references, models)
