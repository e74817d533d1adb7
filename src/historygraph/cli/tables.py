"""The replay's console tables: the summary table per budget (main columns, or every column with
``--wide``), cut to the terminal's width with notes saying what each column means and which were
left out (``historygraph replay``; replay.csv and the report have every column)."""

from __future__ import annotations

from typing import Sequence

from rich.console import Console
from rich.table import Table

from historygraph.cli.common import console
from historygraph.eval.prices import label
from historygraph.eval.recall import AGE_BINS
from historygraph.eval.sessions_view import ratio

def _fmt(v: object, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


# the columns a replay prints by default (``--wide``: every column; replay.csv and the report keep all)
COMPACT_COLUMNS = ("source", "trace_id", "policy", "traces", "invocations", "events", "recall", "pct_of_oracle",
                   "recall_age_>25", "recent5_median", "recent5_min", "recent5_all", "mean_history_tokens", "bill_vs_recorded_simulated", "render_ms_median",
                   "budget_errors", "model_calls")
# what the default table leaves out, in this order, when it is wider than the terminal (then the cost
# with each price model's cache, the last model first); source, trace, policy and recall always stay
NARROW_DROPS = ("render_ms_median", "recent5_median", "recent5_min", "recent5_all", "traces", "invocations", "events", "model_calls", "budget_errors", "recall_age_>25",
                "pct_of_oracle", "mean_history_tokens")
HEADS = {"pct_of_oracle": "% of\noracle", "value_recall": "value\nrecall %", "prefix_reuse_pct": "prefix\nreuse %",
         "norm_cost": "cost\n(Full ρ)", "norm_cost_own": "cost\n(own ρ)", "cost_traces": "cost\ntraces",
         "selection_ms_mean": "selection\nms", "attention_s_mean": "attention\ns", "graph_kb_session": "graph\nKB",
         "revival_pct": "revival\n%", "recall": "recall\n%", "mean_history_tokens": "history\ntokens", "max_history_tokens": "history\ntok max",
         "render_ms_median": "render\nms p50", "render_ms_p95": "render\nms p95", "invocations": "calls", "events": "reuse\nevents",
         "read_repeats_exposed": "re-reads\nexposed", "old_full_share": "old\nfull %",
         "model_calls": "model\ncalls", "model_input_tokens": "model\ntok in", "model_output_tokens": "model\ntok out",
         "model_seconds": "model\ns", "budget_errors": "budget\nerrors", "bill_vs_recorded": "bill ÷\npaid", "bill_vs_recorded_simulated": "bill ÷\nown",
         "recent5_median": "last 5\nshown p50", "recent5_min": "last 5\nworst", "recent5_all": "last 5\nall %", "recent10_median": "last 10\nshown p50",
         "recent10_min": "last 10\nworst"}
HEADS.update({f"recall_age_{b}": f"age\n{b}" for b in AGE_BINS})


def print_table(rows: list[dict], title: str, trace_col: bool = False, wide: bool = False, cache_models: Sequence[str] = (),
                notes: bool = True) -> None:
    """One summary table of a replay. By default the main columns (:data:`COMPACT_COLUMNS` and the cost
    with each price model's cache) with one-line headers; when that is wider than the console, headers
    on two or three lines, then fewer columns (:data:`NARROW_DROPS` in order, then cost columns, named
    under the table) until it fits. With ``wide`` every column with one-line headers. Numbers are never
    cut: a table that cannot fit prints wider than the console. ``notes``: what the columns mean under
    the table (a replay prints them once, under its last table); the columns left out are always named."""
    cache = [f"cost_cache_{m}" for m in cache_models]  # cost with each price model's prompt cache, Full = 1
    cols = ["source"] + (["trace_id"] if trace_col else []) + ["policy"] + ([] if trace_col else ["traces"]) + ["invocations", "events", "recall", "pct_of_oracle", "value_recall"] + \
        [f"recall_age_{b}" for b in AGE_BINS] + ["recent5_median", "recent5_min", "recent5_all", "recent10_median", "recent10_min"] + cache + \
        [f"bound_cache_{m}" for m in cache_models] + ["bill_vs_recorded_simulated", "bill_vs_recorded", "prefix_reuse_pct", "norm_cost", "norm_cost_own", "cost_traces", "mean_history_tokens", "max_history_tokens", "render_ms_median", "render_ms_p95",
                                        "read_repeats_exposed", "old_full_share"] + \
        ["budget_errors", "model_calls", "model_input_tokens", "model_output_tokens", "model_seconds",
         "compactions", "selection_ms_mean", "attention_s_mean", "graph_kb_session", "revival_pct"]
    heads = {**HEADS, **{f"cost_cache_{m}": "cost\n" + (label(m) if len(label(m)) <= 8 else label(m).replace("-", "-\n")) for m in cache_models},
             **{f"bound_cache_{m}": "bound\n" + (label(m) if len(label(m)) <= 8 else label(m).replace("-", "-\n")) for m in cache_models}}
    # columns that say nothing for these rows (all empty, or all zero like model calls of policies
    # that call no model) are left out of the printed table; JSON and CSV keep every column
    # recall 0.0 is a result, not an empty column: recall and its age bins stay whenever they have a value
    always = ("source", "trace_id", "policy", "recall")
    cols = [c for c in cols if (wide or c in COMPACT_COLUMNS or c in cache) and (c in always or any(r.get(c) not in ((None,) if c.startswith("recall") else (None, 0, 0.0))
                                                  for r in rows))]
    dropped: list[str] = []
    empty = any(r.get("recall") is None for r in rows)
    flat = {c: _flat(h) for c, h in heads.items()}
    t = _table(rows, cols, flat, title, _notes(cols, cache, wide, dropped, empty, notes))  # headers on one line when that fits
    if not wide and table_width(t) > console.width:
        t = _table(rows, cols, heads, title, _notes(cols, cache, wide, dropped, empty, notes))
    for c in () if wide else [c for c in NARROW_DROPS + tuple(reversed(cache)) if c in cols]:
        if table_width(t) <= console.width:
            break
        cols.remove(c)
        dropped.append(flat.get(c, c))
        t = _table(rows, cols, heads, title, _notes(cols, cache, wide, dropped, empty, notes))
    # never cut numbers: print at the table's natural width even when the terminal is narrower
    Console(width=max(console.width, table_width(t)), force_terminal=console.is_terminal).print(t)


def _flat(head: str) -> str:
    """A header of several lines (:data:`HEADS`) on one line."""
    return head.replace("-\n", "-").replace("\n", " ")


def table_width(t: Table) -> int:
    return Console(width=10_000).measure(t).maximum


def _table(rows: list[dict], cols: list[str], heads: dict[str, str], title: str, notes: list[str]) -> Table:
    t = Table(title=title, header_style="bold", caption="\n".join(notes) or None)
    for c in cols:
        t.add_column(heads.get(c, c), justify="left" if c in ("source", "trace_id", "policy") else "right", no_wrap=True)
    for r in rows:
        t.add_row(*[ratio(r.get(c)) if c.startswith("bill_vs_recorded") else
                    _fmt(r.get(c), 3 if c.startswith(("norm_cost", "cost_cache_")) else 0 if c == "mean_history_tokens" else 1) for c in cols])
    return t


def _notes(cols: list[str], cache: list[str], wide: bool, dropped: list[str], no_events: bool = False,
           meanings: bool = True) -> list[str]:
    """The table's caption: what its less obvious columns mean (unless not ``meanings``), and where the
    others are (``no_events``: some row has no reuse event, so its recall is –)."""
    if not meanings:
        return [f"left out to fit {console.width} columns: {', '.join(dropped)} (a wider terminal or COLUMNS shows them)"] if dropped else []
    notes = []
    if no_events:
        notes.append("recall –: no later call reused a value first seen in a result of these traces, so there is nothing to recall")
    if "pct_of_oracle" in cols:
        notes.append("% of oracle: recall ÷ the oracle's recall (the clairvoyant selector under the same B); "
                     "– where the oracle shows none (e.g. every reused result is larger than B) or the policy went over B (full)")
    if any(c.startswith("recall_age_") for c in cols):
        notes.append("age N: recall % of the reuses whose source result was N turns (model calls) old, >25: more than 25 "
                     "(ContextRender Table 2's bins)")
    if any(c in cols for c in cache):
        notes.append("cost M: cost with price model M's simulated prompt cache (cache reads, writes, uncached input, output), "
                     "Full history = 1, ratio of means over the traces whose Full history exceeds B; a ratio, not dollars"
                     + ("; CR-eq3: ContextRender eq. 3's reference prices, the price model 'contextrender'"
                        if "cost_cache_contextrender" in cols else "") + " (docs/evaluator.md, Price models)")
    if any(c.startswith("bound_cache_") for c in cols):
        notes.append("bound M: the least any rendering keeping the invariants could cost at the row's recall with M's cache "
                     "(every message sent once uncached or written, each reused result not shown anyway read once more), "
                     "Full history = 1, as cost M; a lower bound, not an achievable cost (docs/evaluator.md, The bill bound)")
    if "recent5_median" in cols or "recent5_min" in cols:
        notes.append("last 5: how many of the agent's 5 newest assistant messages the rendering shows with their text and tool "
                     "calls, median and worst call, and all %: the share of calls that show all 5 (calls with at least 5 before them; "
                     "docs/evaluator.md, What is measured)")
    if "bill_vs_recorded_simulated" in cols or "bill_vs_recorded" in cols:
        notes.append("bill ÷ own: the row's cost with the recorded model's prompt cache (Claude: anthropic-style, GPT: openai-style; "
                     "system prompt and tools estimated from the first call) ÷ the same for what the agent itself sent (the recorded "
                     "row: its own context management, after its compactions), like for like; bill ÷ paid (--wide): ÷ what the "
                     "recorded calls were billed, which includes the simulation's own error (the recorded row's bill ÷ paid, "
                     "'check' above); the recorded row's cost M columns, like every row's, cover only the sessions whose Full "
                     "history exceeds B (docs/evaluator.md, Real sessions)")
    if "norm_cost" in cols:
        notes.append("cost (Full ρ): input cost by ContextRender eq. 3, Full history = 1, priced with Full's prefix-cache share ρ "
                     "(C.2); a ratio, not dollars")
    if dropped:
        notes.append(f"left out to fit {console.width} columns: {', '.join(dropped)} (a wider terminal or COLUMNS shows them)")
    if not wide:
        notes.append("more columns (value recall, every age bin, prefix reuse, costs, p95, model use): --wide, replay.csv, historygraph report")
    return notes

