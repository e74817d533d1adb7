"""Tables, JSON, CSV and a plot from replay results.

Every figure in the printed table is also in the JSON and CSV files. Rows are per trace and per
source (the reader's format name, e.g. ``mini-swe-agent``), plus an ``ALL`` row per policy.
Token figures are rendered *history* tokens (what B caps); render times are per invocation.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from .recall import AGE_BINS
from .replay import PolicyStats, TraceResult
from .steps_metrics import COLUMNS as STEPS_COLUMNS

COLUMNS = ["scope", "source", "trace_id", "policy", "traces", "invocations", "events", "recall"] + \
    [f"recall_age_{b}" for b in AGE_BINS] + [f"events_age_{b}" for b in AGE_BINS] + \
    ["mean_history_tokens", "max_history_tokens", "mean_input_tokens", "render_ms_median", "render_ms_p95",
     "budget_errors", "invariant_violations",
     "compactions", "selection_ms_mean", "attention_s_mean", "graph_kb_session", "revival_pct", "model_calls", "model_input_tokens", "model_output_tokens",
     "model_seconds"] + STEPS_COLUMNS


def _pct(hits: int, events: int) -> float | None:
    return round(100.0 * hits / events, 2) if events else None


def row(scope: str, source: str, trace_id: str, policy: str, st: PolicyStats, traces: int, invocations: int) -> dict[str, Any]:
    ms = np.array(st.render_seconds) * 1000.0
    r: dict[str, Any] = {
        "scope": scope, "source": source, "trace_id": trace_id, "policy": policy, "traces": traces,
        "invocations": invocations, "events": st.events, "recall": _pct(st.hits, st.events),
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


def summarize(results: list[TraceResult]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(per_trace_rows, per_source_rows)``; per-source rows include ``source == "ALL"``."""
    per_trace, groups = [], defaultdict(lambda: defaultdict(PolicyStats))
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for res in results:
        counts[res.source][0] += 1
        counts[res.source][1] += res.invocations
        counts["ALL"][0] += 1
        counts["ALL"][1] += res.invocations
        for policy, st in res.stats.items():
            per_trace.append(row("trace", res.source, res.trace_id, policy, st, 1, res.invocations))
            groups[res.source][policy].merge(st)
            groups["ALL"][policy].merge(st)
    per_source = [row("source", src, "", policy, st, *counts[src])
                  for src in sorted(groups, key=lambda s: (s == "ALL", s)) for policy, st in groups[src].items()]
    return per_trace, per_source


def write_outputs(out_dir: Path, results: list[TraceResult], meta: dict[str, Any]) -> dict[str, Path]:
    """Write ``replay.json``, ``replay.csv`` and (when matplotlib is installed) ``recall_by_age.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    per_trace, per_source = summarize(results)
    paths = {"json": out_dir / "replay.json", "csv": out_dir / "replay.csv"}
    violations = {f"{r.source}/{r.trace_id}/{p}": st.violations for r in results for p, st in r.stats.items() if st.violations}
    paths["json"].write_text(json.dumps({"meta": meta, "per_source": per_source, "per_trace": per_trace,
                                         "invariant_violations": violations}, indent=2))
    with paths["csv"].open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(per_source + per_trace)
    png = plot_recall_by_age(per_source, out_dir / "recall_by_age.png")
    if png:
        paths["plot"] = png
    return paths


def plot_recall_by_age(per_source: list[dict[str, Any]], path: Path) -> Path | None:
    """Grouped bars: recall by result age, one panel per source. Returns None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sources = list(dict.fromkeys(r["source"] for r in per_source))
    policies = list(dict.fromkeys(r["policy"] for r in per_source))
    if not sources:  # nothing replayed (an interrupt before the first trace finished)
        return None
    ncols = min(3, len(sources))
    nrows = -(-len(sources) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows), squeeze=False, sharey=True)
    flat = list(axes.flat)
    for ax in flat[len(sources):]:
        ax.set_visible(False)
    width = 0.8 / max(1, len(policies))
    for ax, src in zip(flat, sources):
        for i, pol in enumerate(policies):
            r = next((x for x in per_source if x["source"] == src and x["policy"] == pol), None)
            if r is None:
                continue
            vals = [r[f"recall_age_{b}"] or 0.0 for b in AGE_BINS]
            ax.bar(np.arange(len(AGE_BINS)) + i * width, vals, width, label=pol)
        first = next(x for x in per_source if x["source"] == src)  # every policy sees the same events
        labels = [f"{b}\nn={first[f'events_age_{b}']}" for b in AGE_BINS]  # n=0: no event, not 0 % recall
        ax.set_xticks(np.arange(len(AGE_BINS)) + width * (len(policies) - 1) / 2, labels)
        ax.set_title(src, fontsize=9)
        ax.set_xlabel("result age (turns)")
    for row in axes:
        row[0].set_ylabel("Later-Used Result Recall (%)")
    handles, names = flat[0].get_legend_handles_labels()  # one legend under the panels: never over a bar
    fig.legend(handles, names, loc="lower center", ncols=min(len(names), 6), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * ((len(names) - 1) // 6), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
