"""``historygraph report RUN_DIR``: one self-contained HTML page and a Markdown summary of a replay.

Reads what ``historygraph replay`` wrote into ``RUN_DIR`` (``replay.json``, ``timelines.json.gz``)
and writes ``report.html`` (every figure embedded as a PNG data URI, a small inline script that
sorts and filters the per-trace table; nothing is fetched at view time) and ``report.md`` with its
figures as PNG files in ``report-files/``.

Contents: first the recommended policy per budget and price model (:mod:`.recommend`: how it was
chosen, in a paragraph, and a small table), then the plot that decides, recall against the cost with each price model's prompt cache
(:mod:`.cache_cost`; ``report --prices FILE`` reprices the run with a user's models of the same
cache rules), then recall against normalised cost per source (ContextRender Figure 4), recall by result age
(Table 2), recall, tokens and cost against B when several budgets ran (Figure 5; the summary
tables of the other budgets follow the headline's), measured
prefix-cache reuse with both cost variants, ``% of oracle`` when a policy named ``oracle`` ran,
the per-source summary, the per-trace table, and one trace's timeline (what each policy showed of
each result at each call, with the reuse events). The headline budget is 6000 when it ran (B.1),
else the first budget; the timeline trace is the compared trace with the most reuse events unless
one is named.
"""

from __future__ import annotations

import base64
import gzip
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from historygraph.eval import cache_cost, plots
from historygraph.eval.prices import PriceModelError, label, read_price_file
from historygraph.eval.recommend import explanation, recommend, table_rows
from historygraph.eval.recorded import RECORDED
from historygraph.eval.report import recall_by_age_title, table_sources, trace_set
from historygraph.eval.sessions_view import (agent_sources, default_policy, equal_cost, project_table, ratio,
                                             recommend_vs_own, sessions_only, ttl_note)

SUMMARY_COLUMNS = [("policy", "policy"), ("traces", "traces"), ("events", "reuse events"), ("recall", "recall %"),
                   ("value_recall", "value recall %"), ("pct_of_oracle", "% of oracle"),
                   ("prefix_reuse_pct", "prefix reuse %"), ("norm_cost", "cost (Full ρ)"),
                   ("norm_cost_own", "cost (own ρ)"), ("cost_traces", "cost traces"),
                   ("recent5_median", "last 5 shown p50"), ("recent5_min", "last 5 worst"), ("recent5_all", "last 5 all %"),
                   ("mean_history_tokens", "history tokens mean"), ("budget_errors", "budget errors")]
TRACE_COLUMNS = [("source", "source"), ("trace_id", "trace"), ("policy", "policy"), ("invocations", "calls"),
                 ("events", "reuse events"), ("recall", "recall %"), ("value_recall", "value recall %"),
                 ("pct_of_oracle", "% of oracle"), ("prefix_reuse_pct", "prefix reuse %"), ("norm_cost", "cost vs Full"), ("cost_usd", "cost USD"),
                 ("mean_history_tokens", "history tokens mean"), ("max_history_tokens", "history tokens max"),
                 ("budget_errors", "budget errors")]


class ReportError(ValueError):
    """The run folder lacks what the report needs (the message names the file and what to run)."""


@dataclass
class Run:
    meta: dict[str, Any]
    per_source: list[dict[str, Any]]
    per_trace: list[dict[str, Any]]
    timelines: dict[str, Any]
    references: dict[str, Any] = field(default_factory=dict)
    per_project: list[dict[str, Any]] = field(default_factory=list)  # session logs (report.project_rows)

    @property
    def price_models(self) -> list[str]:
        """The price models whose cost with the cache the rows hold."""
        return [m for m in self.meta.get("price_models") or {} if any(f"cost_cache_{m}" in r for r in self.per_source)]

    @property
    def policies(self) -> list[str]:
        return list(self.meta.get("policies") or dict.fromkeys(r["policy"] for r in self.per_source))

    @property
    def budgets(self) -> list[int]:
        return sorted({r["budget"] for r in self.per_source if r.get("budget") is not None})


def load_run(run_dir: Path) -> Run:
    """Read ``replay.json`` (required) and ``timelines.json.gz`` (optional) from ``run_dir``.

    Raises:
        ReportError: no such folder, no ``replay.json``, or one written before costs were recorded.
    """
    path = run_dir / "replay.json"
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such folder (give the --out folder of 'historygraph replay')")
    if not path.is_file():
        if any(f.is_file() and f.name != "replay.csv" for f in run_dir.iterdir()):  # a folder of traces, not a replay's output
            raise ReportError(f"{path}: not found: {run_dir} is not the --out folder of a replay; to report on the traces "
                              f"in it, run 'historygraph replay {run_dir} --out replay-results', then "
                              f"'historygraph report replay-results'")
        raise ReportError(f"{path}: not found; run 'historygraph replay ... --out {run_dir}' first")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: not valid JSON ({exc}); run the replay again") from None
    per_source = data.get("per_source")
    if not isinstance(per_source, list) or (per_source and "norm_cost" not in per_source[0]):
        raise ReportError(f"{path}: written by an older replay without cost figures; run the replay again")
    tl_path = run_dir / "timelines.json.gz"
    timelines = {}
    if tl_path.is_file():
        with gzip.open(tl_path, "rt", encoding="utf-8") as fh:
            timelines = json.load(fh)
    return Run(data.get("meta") or {}, per_source, data.get("per_trace") or [], timelines, data.get("references") or {},
               data.get("per_project") or [])


def reprice_run(run: Run, path: Path) -> None:
    """Add the price models of the TOML file at ``path`` to the run's rows (:func:`.cache_cost.reprice`).

    Raises:
        ReportError: the file fails its checks, the run has no cache figures, or a model's cache rule
            was not simulated in the run.
    """
    try:
        models = read_price_file(path)
        if not run.meta.get("price_models") or not run.references:
            raise PriceModelError(f"{path}: the run has no prompt-cache figures (replayed before price models); run the replay again")
        cache_cost.reprice(run.meta["price_models"], run.per_trace, run.per_source, run.references, models)
    except PriceModelError as exc:
        raise ReportError(f"--prices: {exc}") from None
    run.meta["price_models"] = {**run.meta["price_models"], **{n: m.to_json() for n, m in models.items()}}


def headline_budget(run: Run, budget: int | None = None) -> int | None:
    """``budget`` when it ran (else ReportError), else 6000 when it ran, else the first budget."""
    if budget is not None:
        if budget not in run.budgets:
            raise ReportError(f"--budget {budget} did not run; the run has B = {', '.join(map(str, run.budgets))}")
        return budget
    return 6000 if 6000 in run.budgets else (run.budgets[0] if run.budgets else None)


def pick_timeline(run: Run, budget: int | None, trace: str | None = None) -> str | None:
    """The timelines key (``"{budget}|{session}"``) to draw: ``trace`` (a session id or a trace id
    ending exactly one session) at ``budget``, else the compared trace with the most reuse events.

    Raises:
        ReportError: ``trace`` names no trace of the run, or several.
    """
    keys = [k for k in run.timelines if k.split("|", 1)[0] == str(budget)]
    if trace is not None:
        hits = [k for k in keys if k.split("|", 1)[1] == trace] or \
            [k for k in keys if k.split("|", 1)[1].endswith(":" + trace)]
        if len(hits) != 1:
            raise ReportError(f"--trace {trace!r} matches {len(hits)} traces of the run at B = {budget}" +
                              (f": {', '.join(h.split('|', 1)[1] for h in hits[:5])}" if hits else ""))
        return hits[0]
    compared = {r["session"] for r in run.per_trace if r.get("budget") == budget and r.get("cost_traces")}
    best = sorted(((len(run.timelines[k]["events"]), len(run.timelines[k]["results"]), k) for k in keys
                   if k.split("|", 1)[1] in compared and len(run.timelines[k]["results"]) <= 120), reverse=True)
    if not best:
        best = sorted(((len(run.timelines[k]["events"]), 0, k) for k in keys), reverse=True)
    return best[0][2] if best else None


def _fmt(v: Any, key: str = "") -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if key.startswith("bill_vs_recorded"):
            return ratio(v)
        if key.startswith(("cost_cache_usd_", "bound_cache_usd_")) or key == "recorded_bill_usd":
            return f"{v:.4f}"
        return f"{v:.3f}" if key.startswith(("norm_cost", "cost_cache_", "bound_cache_")) and not key.startswith(("cost_cache_usd_", "bound_cache_usd_")) else (f"{v:.4f}" if key == "cost_usd" else f"{v:.1f}")
    return str(v)


def _figures(run: Run, budget: int | None, trace_key: str | None,
             progress: Callable[[str], None] | None = None) -> list[tuple[str, str, bytes]]:
    """``(file stem, caption, png)`` of each figure that has data; ``progress`` is told the name of
    each figure before it is drawn (matplotlib takes seconds per figure)."""
    pols, ts = run.policies, trace_set(run.meta)
    at = [r for r in run.per_source if r.get("budget") == budget]
    own = [RECORDED] if any(r["policy"] == RECORDED for r in at) else []  # session logs: the agent's own, beside
    out = []
    plan = (
        ("recall_vs_cache_cost", f"Recall against the cost with each provider's prompt cache (Full history = 1) at B = {budget}"
         + (" ('historygraph report --budget B' draws another budget of the run)" if len(run.budgets) > 1 else ""),
         lambda rows, p, title: plots.recall_vs_cache_cost(rows, [*p, *own], run.price_models, title), at,
         f"Recall vs cost with the prompt cache at B = {budget}; {ts}"),
        ("recall_vs_cost", "Recall against normalised inference cost, per source (ContextRender Figure 4)",
         plots.recall_vs_cost, at, f"Recall vs normalised cost at B = {budget}; {ts}"),
        ("recall_by_age", "Recall by result age (ContextRender Table 2)", plots.recall_by_age, at,
         recall_by_age_title(budget, run.meta)),
        ("budget_sweep", "Recall, history tokens and cost against the budget (ContextRender Figure 5)",
         plots.budget_sweep, run.per_source, f"All sources, B = {', '.join(map(str, run.budgets))}; {ts}"),
        ("cache_and_cost", "Prefix-cache reuse and both cost variants per policy", plots.cache_and_cost, at,
         f"All sources at B = {budget}; {ts}"),
    )
    sweep = len(run.budgets) > 1  # Figure 5 needs two budgets: not announced (nor drawn) with one
    drawn = [f for f in plan if sweep or f[0] != "budget_sweep"]
    n = len(drawn) + (1 if trace_key else 0)
    for i, (stem, cap, fn, rows, title) in enumerate(drawn, 1):
        if progress:
            progress(f"drawing figure {i} of {n}: {stem}")
        png = fn(rows, pols, title)
        if png:
            out.append((stem, cap, png))
    if trace_key:
        tl = run.timelines[trace_key]
        if progress:
            progress(f"drawing figure {n} of {n}: timeline of {tl['trace_id']}")
        png = plots.timeline(tl, pols, f"{tl['source']} trace {tl['trace_id']} at B = {budget}: "
                                       f"{len(tl['results'])} results, {len(tl['invocations'])} calls, {len(tl['events'])} reuse events")
        if png:
            out.append(("timeline", f"Timeline of {tl['source']} trace {tl['trace_id']}", png))
    return out


def _html_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]], table_id: str) -> str:
    head = "".join(f'<th data-key="{k}" title="click to sort">{html.escape(lab)}</th>' for k, lab in cols)
    body = []
    for r in rows:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            num = f' data-v="{v}"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
            cells.append(f"<td{num}>{html.escape(_fmt(v, k))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="{table_id}" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _text_table(head: list[str], rows: list[list[str]]) -> str:
    """A small HTML table of text cells (not sortable), e.g. the recommendation."""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{''.join(f'<th>{html.escape(h)}</th>' for h in head)}</tr></thead><tbody>{cells}</tbody></table>"


def _md_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    lines = ["| " + " | ".join(lab for _, lab in cols) + " |", "|" + "|".join("---" if k == "policy" else "---:" for k, _ in cols) + "|"]
    lines += ["| " + " | ".join(_fmt(r.get(k), k) for k, _ in cols) + " |" for r in rows]
    return "\n".join(lines)


SCRIPT = """
function sortTable(th) {
  const table = th.closest('table'), body = table.tBodies[0], idx = th.cellIndex;
  const asc = th.dataset.dir !== 'asc';
  for (const h of table.tHead.rows[0].cells) { delete h.dataset.dir; }
  th.dataset.dir = asc ? 'asc' : 'desc';
  const rows = Array.from(body.rows);
  const key = r => { const c = r.cells[idx]; return c.dataset.v !== undefined ? parseFloat(c.dataset.v) : null; };
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    let d;
    if (x !== null || y !== null) { d = (x === null) - (y === null) || (x - y); if (x === null || y === null) return d; }
    else { d = a.cells[idx].textContent.localeCompare(b.cells[idx].textContent); }
    return asc ? d : -d;
  });
  for (const r of rows) body.appendChild(r);
}
function filterTable(input) {
  const q = input.value.toLowerCase(), table = document.getElementById(input.dataset.table);
  for (const r of table.tBodies[0].rows) { r.hidden = q && !r.textContent.toLowerCase().includes(q); }
}
document.querySelectorAll('table.sortable th').forEach(th => th.addEventListener('click', () => sortTable(th)));
document.querySelectorAll('input.filter').forEach(i => i.addEventListener('input', () => filterTable(i)));
"""

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1400px;color:#222;padding:0 1em}
table{border-collapse:collapse;font-size:12px;margin:.5em 0 1.5em}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f1f3f5;cursor:pointer;position:sticky;top:0}
th[data-dir=asc]::after{content:" ▲"} th[data-dir=desc]::after{content:" ▼"}
td:nth-child(-n+3){text-align:left}
img{max-width:100%;border:1px solid #eee}
.note{color:#555;font-size:13px;max-width:75em}
"""


def write_report(run_dir: Path, budget: int | None = None, trace: str | None = None,
                 progress: Callable[[str], None] | None = None, prices: Path | None = None) -> dict[str, Path]:
    """Write ``report.html``, ``report.md`` and ``report-files/*.png`` into ``run_dir``; returns the
    paths by kind. ``progress`` (optional) is told each step before it runs: reading the run, then
    each figure; ``prices``: a price-model file to reprice the run with (:func:`reprice_run`).
    Raises :class:`ReportError` (see :func:`load_run`, :func:`pick_timeline`, :func:`reprice_run`)."""
    if progress and (run_dir / "replay.json").is_file():  # a missing run: load_run's error alone
        progress(f"reading {run_dir / 'replay.json'}")
    run = load_run(run_dir)
    if prices is not None:
        reprice_run(run, prices)
    b = headline_budget(run, budget)
    key = pick_timeline(run, b, trace)
    figs = _figures(run, b, key, progress)
    files = run_dir / "report-files"
    files.mkdir(exist_ok=True)
    for stem, _, png in figs:
        (files / f"{stem}.png").write_bytes(png)
    ts = trace_set(run.meta)
    summary = [r for r in run.per_source if r.get("budget") == b]  # pct_of_oracle comes from the replay's summary
    cols = [c for c in SUMMARY_COLUMNS if c[0] != "pct_of_oracle" or any(r.get("pct_of_oracle") is not None for r in summary)]
    if any(r.get("bill_vs_recorded") is not None for r in summary):  # session logs: the bill against what was paid
        cols[-2:-2] = [("bill_vs_recorded", "bill ÷ paid"), ("bill_vs_recorded_simulated", "bill ÷ own")]  # as the terminal names them
    cols[4:4] = [(f"cost_cache_{m}", f"cost {label(m)}") for m in run.price_models]  # cost with each prompt cache, after recall
    if any(r.get(f"bound_cache_{m}") is not None for r in summary for m in run.price_models):  # the bill bound (eval.bill_bound)
        cols[4 + len(run.price_models):4 + len(run.price_models)] = [(f"bound_cache_{m}", f"bound {label(m)}") for m in run.price_models]
    sources = table_sources(r["source"] for r in summary)
    unit_prices = run.meta.get("prices") or {}
    note = ("Recall: ContextRender B.4 Later-Used Result Recall (a reused result counts only when shown complete). "
            "Value recall: the reused values appear anywhere in the rendering (full result, excerpt, summary, marker). "
            "Prefix reuse: share of prompt tokens equal to a prefix of the previous call's prompt. "
            "Cost M: the cost with price model M's simulated prompt cache (" +
            "; ".join(f"{label(m)}: {(run.meta['price_models'][m].get('description') or '')}" for m in run.price_models) +
            "), Full history = 1 (ratio of mean costs over the traces whose Full history exceeds B). "
            "Bound M: the least any rendering keeping the invariants could cost at the row's recall with M's cache, "
            "normalised the same way (a lower bound, not an achievable cost; docs/evaluator.md, The bill bound). "
            "Cost (Full ρ / own ρ): ContextRender eq. 3 with prices " + ", ".join(f"{k} {v}" for k, v in unit_prices.items()) +
            " USD per million tokens, normalised as the ratio of mean costs over the traces whose Full history exceeds B "
            "(Full history = 1); 'Full ρ' prices every policy with Full history's cache fraction (C.2), 'own ρ' with its own prefix reuse. "
            "Last 5 shown: how many of the agent's 5 newest assistant messages the rendering shows with their text and tool calls "
            "(median, worst call).")
    if any(r.get("bill_vs_recorded") is not None for r in summary):
        note += (" Session logs: 'bill ÷ paid' is the row's simulated bill with the recorded model's prompt cache over what the "
                 "recorded calls were billed; 'bill ÷ own' over the recorded row's own simulated bill (like for like: the simulation's "
                 "error cancels). The recorded row is what the agent itself sent after its own compactions; its cost columns "
                 "(Full history = 1) cover only the sessions whose Full history exceeds B, so they change with B although its "
                 "requests do not.")
    if ttl_note(run.per_trace):  # the price models' descriptions give the 5-minute TTL
        note += " " + ttl_note(run.per_trace)[0].upper() + ttl_note(run.per_trace)[1:] + "."
    cmd = run.meta.get("command", "")
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>historygraph replay report</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>historygraph replay report</h1><p class=note>{html.escape(ts)}; policies: {html.escape(', '.join(run.policies))}; "
             f"B = {', '.join(map(str, run.budgets))} tokens ({html.escape(str(run.meta.get('encoding', '')))}); "
             f"command: <code>{html.escape(cmd)}</code></p>"]
    md = ["# historygraph replay report", "", f"{ts}; B = {', '.join(map(str, run.budgets))}; command: `{cmd}`", ""]
    if run.per_project:  # session logs: the user's own sessions come first
        policy = default_policy(run.policies)
        head, prows = project_table(run.per_project, run.budgets, policy)
        srcs = agent_sources(run.per_source)
        picks = [("" if src == "ALL" else f"{src}: ") + x.line() for src in srcs for x in recommend_vs_own(run.per_source, src)]
        lines = [("" if src == "ALL" else f"{src}: ") + e.line(run.budgets) for src in srcs for e in equal_cost(run.per_source, src)]
        intro = (f"What the recorded calls cost (paid: their recorded usage priced by the recorded model's price model), how much "
                 f"of what the agent later reused its own compactions kept (kept %), the simulation's check on the agent's own "
                 f"requests (simulated ÷ paid), and {policy}'s recall and bill ÷ the agent's own (both simulated, like for like) "
                 f"at each budget (docs/evaluator.md, Real sessions).")
        parts.append(f"<h2>Your sessions</h2><p class=note>{html.escape(intro)}</p>" + _text_table(head, prows))
        md += ["## Your sessions", "", intro, "", "| " + " | ".join(head) + " |",
               "|" + "|".join("---" if h == "project" else "---:" for h in head) + "|"]
        md += ["| " + " | ".join(r) + " |" for r in prows] + [""]
        for title, items in (("Recommended instead of your agent's own context management (the most recall among the policies "
                              "that keep at least as much for no more than its bill)", picks),
                             ("Each policy at the agent's own bill", lines)):
            if items:
                sub = title + " (like for like: both bills simulated)"
                parts.append(f"<h3>{html.escape(sub)}</h3><ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in items) + "</ul>")
                md += [sub + ":", ""] + [f"- {x}" for x in items] + [""]
    recs = [] if sessions_only(run.per_trace) else recommend(run.per_source, run.price_models)  # session logs: against the agent's own, above
    if recs:  # the first screen: which policy to use, and how that was chosen
        rec_head, rec_rows = table_rows(recs)
        parts.append(f"<h2>Recommended policy</h2><p class=note>{html.escape(explanation())}</p>" + _text_table(rec_head, rec_rows))
        md += ["## Recommended policy", "", explanation(), "", "| " + " | ".join(rec_head) + " |",
               "|" + "|".join("---:" if h in ("B", "recall %", "cost") else "---" for h in rec_head) + "|"]
        md += ["| " + " | ".join(r) + " |" for r in rec_rows] + [""]
    parts.append(f"<p class=note>{html.escape(note)}</p>")
    md += [note, ""]
    if run.meta.get("interrupted"):
        warn = f"Interrupted run: {run.meta.get('trajectories_done')} of {run.meta.get('trajectories')} trajectories."
        parts.append(f"<p><b>{html.escape(warn)}</b></p>")
        md += [f"**{warn}**", ""]
    def figure(stem: str, cap: str, png: bytes) -> None:
        data = base64.b64encode(png).decode()
        parts.append(f"<h2>{html.escape(cap)}</h2><img alt=\"{html.escape(cap)}\" src=\"data:image/png;base64,{data}\">")
        md.extend([f"## {cap}", "", f"![{cap}](report-files/{stem}.png)", ""])

    for fig in figs[:1] if figs and figs[0][0] == "recall_vs_cache_cost" else ():  # the plot that decides: before the tables
        figure(*fig)
    for src in sources:
        rows = [r for r in summary if r["source"] == src]
        parts.append(f"<h2>{html.escape(src)} at B = {b}</h2>" + _html_table(rows, cols, f"summary-{src}"))
        md += [f"## {src} at B = {b}", "", _md_table(rows, cols), ""]
    for other in (x for x in run.budgets if x != b):  # the other budgets of a sweep: their summary tables after the headline's
        at = [r for r in run.per_source if r.get("budget") == other]
        for src in table_sources(r["source"] for r in at):
            rows = [r for r in at if r["source"] == src]
            parts.append(f"<h2>{html.escape(src)} at B = {other}</h2>" + _html_table(rows, cols, f"summary-{src}-{other}"))
            md += [f"## {src} at B = {other}", "", _md_table(rows, cols), ""]
    for fig in figs:
        if fig[0] != "recall_vs_cache_cost":
            figure(*fig)
    traces = [r for r in run.per_trace if r.get("budget") == b]
    trace_cols = [c for c in TRACE_COLUMNS if c[0] != "pct_of_oracle" or any(r.get(c[0]) is not None for r in traces)]
    # the bill per trace in dollars of each price model, its bound, and for a session log what was paid
    trace_cols += [c for m in run.price_models for c in ((f"cost_cache_usd_{m}", f"bill USD {label(m)}"),
                                                        (f"bound_cache_usd_{m}", f"bound USD {label(m)}"))]
    trace_cols += [c for c in (("recorded_bill_usd", "paid USD"), ("bill_vs_recorded", "bill ÷ paid"))
                   if any(r.get(c[0]) is not None for r in traces)]
    parts.append(f"<h2>Per trace at B = {b} ({len(traces)} rows)</h2><p class=note>Click a column to sort; type to filter. "
                 "Bill USD M: the trace's simulated bill with price model M's prompt cache, in dollars; bound USD M: the least "
                 "any rendering keeping the invariants could cost at that recall; paid USD: what a session log's recorded "
                 "calls were billed (its recorded model's price model).</p>"
                 f"<input class=filter data-table=per-trace placeholder=filter size=40>" + _html_table(traces, trace_cols, "per-trace"))
    md += [f"Per-trace figures ({len(traces)} rows) are in report.html and replay.csv.", ""]
    parts.append(f"<script>{SCRIPT}</script></body></html>")
    paths = {"html": run_dir / "report.html", "markdown": run_dir / "report.md", "figures": files}
    paths["html"].write_text("".join(parts), encoding="utf-8")
    paths["markdown"].write_text("\n".join(md), encoding="utf-8")
    return paths
