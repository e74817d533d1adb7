"""``historygraph replay`` (recorded traces through policies, in one process or several, with the
summary table) and ``historygraph report`` (the HTML and Markdown report of a replay's folder)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sys
import time
from functools import partial
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from historygraph import __version__
from historygraph.cli.common import (ParamOption, ParamsFileOption, console, err, example_trace_path, fail,
                                     load_policy_params, parse_budgets, read_all, store_name, unknown_policy, warn)
from historygraph.cli.progress import TimeLeftColumn, advance, heartbeat
from historygraph.cli.tables import print_table, table_width
from historygraph.eval.cost import Prices
from historygraph.eval.prices import PriceModelError, load_price_models, select
from historygraph.eval.recommend import groups, one_line, recommend
from historygraph.eval.sessions_view import (CHECK_OFF, agent_sources, default_policy, equal_cost, off_checks, project_table, ratio,
                                            recommend_vs_own, sessions_only, ttl_note)
from historygraph.eval.replay import replay_budgets, replay_trace
from historygraph.eval.report import cache_checks, project_rows, summarize, table_sources, write_outputs
from historygraph.models.chat import ModelError
from historygraph.policies import REGISTRY, PolicyError, Signals, create
from historygraph.signals.embeddings import DEFAULT_EMBEDDER, EMBEDDERS, create_embedder
from historygraph.signals.tokens import DEFAULT_ENCODING, ENCODINGS, TokenCounter
from historygraph.store import open_store
from historygraph.traces import READERS


PricesOption = Annotated[Optional[Path], typer.Option("--prices", help="TOML file of price models (provider prices and prompt-cache rules) added to the shipped ones, a table of the same name replacing it (docs/evaluator.md, Price models).")]


def _peak_rss_mb() -> float | None:
    """Peak resident memory of this process and its children in MB (``None`` where the platform
    has no ``resource`` module, i.e. Windows)."""
    try:
        import resource
    except ImportError:
        return None
    kb = max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return kb / (1024 * 1024) if sys.platform == "darwin" else kb / 1024  # bytes on macOS, KB elsewhere


def _check_out(out: Path) -> None:
    """Fail before any work when ``--out`` cannot hold the results (an existing file, no permission)."""
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: is an existing file; give a folder for replay.json, replay.csv and the plots "
             "(it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {out}: cannot create the folder: {exc.strerror or exc}")
    if not os.access(out, os.W_OK):
        fail(f"--out {out}: folder is not writable")


RESEARCH_BUDGETS = [6000]
EXAMPLE_BUDGETS = [3000]
"""The shipped example trace's default budget: at 6000 every policy keeps all that its calls reuse,
so the example shows no difference; at 3000 its history passes B early (as in the README's main job)."""
SESSION_BUDGETS = [16000, 32000, 64000]
SESSION_SOURCES = ("claude-code", "codex")


def default_budgets(traces: list) -> list[int]:
    """The budgets of a replay without ``--budget``: 16k, 32k and 64k tokens for the session logs of
    the agents people run (Claude Code, Codex: 100k+ token sessions), 6000 for research traces
    (ContextRender B.1); a mix of both gets 6000 and a note (their scales differ by ten)."""
    sessions = sum(1 for t in traces if t.source in SESSION_SOURCES)
    if sessions == len(traces):
        return list(SESSION_BUDGETS)
    if sessions:
        warn(f"{sessions} of the {len(traces)} traces are Claude Code or Codex session logs, replayed at B = 6000 like the "
             f"research traces; replay them on their own for their default budgets ({', '.join(map(str, SESSION_BUDGETS))}), "
             "or give --budget")
    return list(RESEARCH_BUDGETS)


WORK_EXPONENT = 1.2  # _replay_work: renders grow a little faster than calls × results


def _replay_work(trace) -> float:  # noqa: ANN001
    """The work of replaying ``trace``, for the time left: (model calls × (tool results + 1))^1.2,
    since each call renders over every earlier result and a longer history costs a little more per
    result. The exponent was chosen on the progress lines of one cold replay of the 287 shared
    trajectories (one job, 411 s): the time left after 3–14 finished trajectories was off by a
    factor of e^0.25 on average with 1.2 against e^0.58 with 1 (e.g. after 232 s, 159 s left
    against 179 real, where 1 said 227); weighting by messages or texts to embed was worse."""
    calls = sum(1 for m in trace.messages if m.role == "assistant")
    results = sum(1 for m in trace.messages if m.role == "tool")
    return max(1.0, calls * (results + 1)) ** WORK_EXPONENT


def replay(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Trace files or folders (searched recursively). Default: the shipped example trace.")] = None,
    policy: Annotated[list[str], typer.Option("--policy", "-p", help="Policy to run (repeatable, or a comma-separated list as -b takes: -p learned,prune); 'all' runs every registered policy.")] = ["learned", "learned-stable", "contextrender", "prune", "full"],
    budget: Annotated[Optional[str], typer.Option("--budget", "-b", help="History budget B in tokens (32k = 32000); a comma-separated list sweeps several in one run, e.g. 2000,3000,6000,12000. Default: 16000,32000,64000 when every trace is a Claude Code or Codex session log, else 6000 (ContextRender B.1); 3000 for the shipped example.")] = None,
    encoding: Annotated[str, typer.Option(help=f"Tokenizer: {', '.join(ENCODINGS)}.")] = DEFAULT_ENCODING,
    store: Annotated[Optional[str], typer.Option(help="SQLite file for sessions and the embedding cache; ':memory:' for none. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    out: Annotated[Path, typer.Option(help="Folder for replay.json, replay.csv, timelines.json.gz and recall_by_age.png, what 'historygraph report' reads (created if missing; must not be a file).")] = Path("replay-results"),
    price: Annotated[list[str], typer.Option("--price", help="Eq. 3 price in USD per million tokens, KEY=VALUE (repeatable; keys input, cached_input, output, embedding; defaults 2, 0.5, 8, 0.13 from ContextRender §4.2).")] = [],
    prices_file: PricesOption = None,
    price_model: Annotated[list[str], typer.Option("--price-model", help="Price model whose cost with the cache the table shows (repeatable; default: every loaded model; replay.json and replay.csv have all).")] = [],
    fmt: Annotated[Optional[str], typer.Option("--format", help="Force a trace format instead of detecting it.")] = None,
    per_trace: Annotated[bool, typer.Option(help="Also print one row per trace.")] = False,
    wide: Annotated[bool, typer.Option(help="Print every column (about 30) instead of the main dozen; replay.csv and the report have all of them either way.")] = False,
    jobs: Annotated[int, typer.Option(min=1, help="Worker processes, each replaying whole traces (results are identical; wall time differs).")] = 1,
    strict: Annotated[bool, typer.Option(help="Stop at the first unreadable trace file (default: skip it with a warning, exit 1 at the end).")] = False,
    param: ParamOption = [],
    params_file: ParamsFileOption = None,
    embedder: Annotated[str, typer.Option(help=f"Sentence embedder of the policies that embed: {', '.join(EMBEDDERS)} (docs/evaluator.md, Embedders; 'static' needs historygraph\\[static], 'wordllama' historygraph\\[wordllama]).")] = DEFAULT_EMBEDDER,
) -> None:
    """Replay recorded traces through policies and report recall, tokens and render time.

    Unreadable trace files are skipped with a warning naming each (exit status 1 at the end). On
    Ctrl-C or SIGTERM (timeout, kill), or when a summarising policy's model fails, the traces
    finished so far are written (``meta.interrupted`` in replay.json) before the command exits."""
    # (over 80 lines: its typer signature declares every option, one per line; the work is in the helpers below)
    policy = [n.strip() for p in policy for n in p.split(",") if n.strip()]  # -p a,b as -p a -p b
    names = sorted(REGISTRY) if "all" in policy else list(dict.fromkeys(policy))
    for n in names:
        if n not in REGISTRY:
            unknown_policy(n)
    if encoding not in ENCODINGS:
        fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if fmt is not None and fmt not in READERS:
        fail(f"unknown --format {fmt!r}; choose one of {', '.join(READERS)}")
    params = load_policy_params(param, params_file, names)
    budgets = parse_budgets(budget) if budget is not None else []
    if embedder not in EMBEDDERS:
        fail(f"unknown --embedder {embedder!r}; choose one of {', '.join(EMBEDDERS)}")
    try:
        prices = Prices.parse(price)
    except ValueError as exc:
        fail(f"--price: {exc}")
    try:
        models = load_price_models(prices_file)
        shown = list(select(models, price_model))
    except PriceModelError as exc:
        fail(f"--prices: {exc}" if prices_file else str(exc))
    example = not paths
    paths = paths or [example_trace_path()]
    for p in paths:
        if not p.exists():
            fail(f"{p}: no such file or folder")
    t_start = time.perf_counter()
    traces, skipped = _read_into(paths, fmt, strict, out)
    budgets = budgets or (list(EXAMPLE_BUDGETS) if example else default_budgets(traces))
    try:
        db = open_store(store)
    except Exception as exc:  # an unwritable path, a corrupt database file
        fail(f"cannot open store {store or 'default'}: {exc}")
    signals = Signals(counter=TokenCounter(encoding), store=db, embedder_factory=partial(create_embedder, embedder))
    try:
        policies = {n: create(n, replay=True, **params.get(n, {})) for n in names}
    except (PolicyError, ValueError) as exc:
        fail(str(exc))
    console.print(f"Replaying {len(traces)} {'trajectory' if len(traces) == 1 else 'trajectories'} from {len(paths)} path(s) through {', '.join(names)} "
                  f"at B = {', '.join(map(str, budgets))} tokens ({encoding}); store: {store_name(db)}",
                  markup=False, highlight=False, soft_wrap=True)  # one line, whatever its length: scripts grep it
    if example:
        console.print(f"no PATH given: replaying the example trace shipped with the package ({paths[0].name}) into "
                      f"{out}; name your traces' files or folders to replay them", markup=False, highlight=False, soft_wrap=True)
    _print_models(policies)
    jobs = min(jobs, len(traces))  # (a worker process for no trace would only load the models)
    done, embedded, stopped = _run(traces, names, budgets, policies, signals, db, encoding, store, jobs, params, embedder, models)
    results = [done[i][k] for k in range(len(budgets)) for i in sorted(done)]  # budget by budget, traces in order
    wall = time.perf_counter() - t_start
    peak_mb = _peak_rss_mb()
    meta = {"version": __version__, "command": " ".join(["historygraph"] + sys.argv[1:]), "budget": budgets[0],
            "budgets": budgets,
            "encoding": encoding, "policies": names, "paths": [str(p) for p in paths], "trajectories": len(traces), "jobs": jobs,
            "wall_seconds": round(wall, 1), "peak_rss_mb": None if peak_mb is None else round(peak_mb, 1),
            "texts_embedded": embedded + _embedded(signals), "embedder": embedder, "skipped_files": skipped,
            "interrupted": stopped is not None, "trajectories_done": len(done),
            "models": {n: p.model_info for n, p in policies.items() if hasattr(p, "model_info")}}
    earlier = _earlier_paths(out)
    try:
        written = write_outputs(out, results, meta, prices, models)
    except OSError as exc:  # nothing was renamed into place: the previous outputs are as they were
        what = "disk full" if exc.errno == errno.ENOSPC else f"cannot write ({exc.strerror or exc})"
        fail(f"{what} while writing the replay's outputs to {out}: no output there was replaced; free some space "
             f"or give --out another folder, and run the replay again")
    _remove_stale_report(out)
    if earlier is not None and earlier != meta["paths"]:
        err.print(f"replaced the earlier replay in {out} (of {', '.join(earlier) or 'the example trace'}); give --out another "
                  "folder to keep both", markup=False, highlight=False, soft_wrap=True)
    db.close()
    if stopped:
        fail(f"{stopped}: wrote the {len(done)} of {len(traces)} trajectories finished so far to "
             + ", ".join(str(p) for p in written.values()),
             code=130 if stopped.startswith("interrupted") else 143 if stopped.startswith("terminated") else 2)
    _print_results(results, prices, models, shown, budgets, meta, written, out, skipped, wall, peak_mb, per_trace=per_trace, wide=wide)


def _earlier_paths(out: Path) -> list[str] | None:
    """The trace paths of the replay already in ``out`` (its ``replay.json``), ``None`` when none is there."""
    try:
        return list(json.loads((out / "replay.json").read_text()).get("meta", {}).get("paths") or [])
    except (OSError, ValueError, AttributeError):
        return None


def _remove_stale_report(out: Path) -> None:
    """Remove the report of an earlier replay from ``out`` (``historygraph report`` wrote it from the
    files just replaced, so it would contradict them), saying so."""
    stale = [p for p in (out / "report.html", out / "report.md", out / "report-files") if p.exists()]
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if stale:
        err.print(f"removed the earlier replay's report from {out} ({', '.join(p.name for p in stale)}): "
                  f"'historygraph report {out}' writes this replay's", markup=False, highlight=False, soft_wrap=True)


def _read_into(paths: list[Path], fmt: str | None, strict: bool, out: Path) -> tuple[list, list[dict[str, str]]]:
    """The traces under ``paths`` and the files skipped (:func:`read_all`), once ``--out`` is checked;
    exits when none is readable, leaving no empty ``--out`` folder behind."""
    created = not out.exists()
    _check_out(out)
    try:
        traces, skipped = read_all(paths, fmt, strict)
        if not traces:
            fail(f"no readable traces in {', '.join(map(str, paths))}" + (f" ({len(skipped)} file(s) skipped)" if skipped else
                 " (no *.json, *.jsonl, *.traj or *.traj.json file there; docs/usage.md lists the trace formats)"))
    except typer.Exit:  # nothing was replayed: leave no empty --out folder behind
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    return traces, skipped


def _print_models(policies: dict) -> None:
    """One line per policy with a reuse model: its file and what it was fitted on."""
    for n, p in policies.items():
        if hasattr(p, "model_info"):
            info = p.model_info
            console.print(f"{n}: reuse model {info['file']}" + (f" (fitted on {info['traces']} trajectories of "
                          f"{', '.join(info.get('fitted_on') or ['?'])})" if "traces" in info else ""))


def _run(traces: list, names: list[str], budgets: list[int], policies: dict, signals: Signals, db, encoding: str,  # noqa: ANN001
         store: str | None, jobs: int, params: dict[str, dict], embedder: str, models: dict) -> tuple[dict[int, list], int, str | None]:
    """Replay ``traces`` under a progress bar, in this process or in ``jobs`` worker processes: the
    results of each finished trace (trace index -> one result per budget), the texts the workers
    embedded, and why the replay stopped early (Ctrl-C, a model that failed) or ``None``."""
    done: dict[int, list] = {}
    embedded = [0]
    stopped: str | None = None
    previous = signal.signal(signal.SIGTERM, _terminated)
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeLeftColumn(), console=err, transient=False,
                  disable=not err.is_terminal) as bar:  # not a terminal: the plain lines of advance only
        task = bar.add_task("replay", total=len(traces))
        with heartbeat(bar, task, "replay", work=([_replay_work(tr) for tr in traces], done)):
            try:
                if jobs > 1:
                    _replay_parallel(traces, names, budgets, encoding, store, jobs, done, embedded, lambda: advance(bar, task, "replay"), params,
                                     embedder, models)
                for i, tr in enumerate(traces if jobs == 1 else ()):
                    bar.update(task, description=f"{tr.source}:{tr.trace_id}"[:48])
                    if len(budgets) == 1:
                        done[i] = [replay_trace(tr, policies, budgets[0], signals, db, price_models=models)]
                    else:
                        done[i] = replay_budgets(tr, names, budgets, signals, db, params=params, price_models=models)
                    advance(bar, task, "replay")
            except KeyboardInterrupt:
                stopped = "interrupted (Ctrl-C)"
            except Terminated:
                stopped = "terminated (SIGTERM)"
            except ModelError as exc:  # a summarising policy whose model is unavailable after its retries
                stopped = f"{exc} (needed by a summarising policy; configure an endpoint or drop those policies)"
            finally:
                signal.signal(signal.SIGTERM, previous)
    return done, embedded[0], stopped


class Terminated(BaseException):
    """SIGTERM during a replay (``timeout``, ``kill``, a job scheduler): handled as Ctrl-C is, the
    traces finished so far are written. A BaseException, so that no ``except Exception`` swallows it."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated()


def _print_results(results: list, prices: Prices, models: dict, shown: list[str], budgets: list[int], meta: dict, written: dict, out: Path,
                   skipped: list[dict[str, str]], wall: float, peak_mb: float | None, per_trace: bool, wide: bool) -> None:
    """The tables of a finished replay (per source, and per trace with ``per_trace``), its warnings and
    closing lines; exits with status 1 on an invariant violation or a skipped file."""
    per_trace_rows, per_source_rows = summarize(results, prices, models)
    _print_projects(project_rows(per_trace_rows, results), per_source_rows, budgets, meta["policies"])
    shown_sources = table_sources(r["source"] for r in per_source_rows)  # replay.json and .csv keep every row
    for b in budgets:  # what the columns mean: once, under the last table
        last = b == budgets[-1]
        print_table([r for r in per_source_rows if r["budget"] == b and r["source"] in shown_sources],
                     f"Later-Used Result Recall and history tokens at B = {b}", wide=wide, cache_models=shown,
                     notes=last and not per_trace)
        if per_trace:
            print_table([r for r in per_trace_rows if r["budget"] == b], f"Per trace at B = {b}", trace_col=True, wide=wide,
                         cache_models=shown, notes=last)
    _print_cache_check(cache_checks(results))
    if ttl_note(per_trace_rows):
        console.print(ttl_note(per_trace_rows), markup=False, highlight=False, soft_wrap=True)
    recs = [] if sessions_only(per_trace_rows) else recommend(per_source_rows, shown)  # session logs: against the agent's own, above
    if recs:
        console.print("recommended: most recall for less than Full's cost with the cache (docs/evaluator.md, Recommendation):",
                      markup=False, highlight=False, soft_wrap=True)
        for group in groups(recs):
            console.print("  " + one_line(group), markup=False, highlight=False, soft_wrap=True)
    bad = sum(r["invariant_violations"] for r in per_source_rows if r["source"] == "ALL")
    for r in per_source_rows:
        if r["source"] == "ALL" and r["budget_errors"]:
            err.print(f"[yellow]warning:[/] {r['policy']}: B = {r['budget']} tokens could not hold the protected history "
                      f"(first user message, latest assistant turn) in {r['budget_errors']} of {r['invocations']} "
                      "invocations; those renderings count as showing nothing (raise --budget)", soft_wrap=True)
    console.print(f"wall time {wall:.1f} s, peak memory {'n/a' if peak_mb is None else f'{peak_mb:.0f} MB'}, {meta['texts_embedded']} texts embedded; "
                  f"invariant violations: {bad}")
    console.print("wrote " + ", ".join(str(p) for p in written.values()), markup=False, highlight=False, soft_wrap=True)
    console.print(f"report (HTML and Markdown): {_this_command()} report {out}", markup=False, highlight=False, soft_wrap=True)
    if skipped:
        warn(f"{len(skipped)} trace file(s) not read in full: "
             + ", ".join(s["path"] + (f" ({s['line']} skipped, its other lines replayed)" if "line" in s else " (skipped)")
                         for s in skipped))
    if bad or skipped:
        raise typer.Exit(1)


def _print_projects(rows: list[dict], per_source: list[dict], budgets: list[int], names: list[str]) -> None:
    """The user's own answer, for session logs (:mod:`historygraph.eval.sessions_view`): per project and
    overall, what the recorded calls cost, how much of what the agent later reused its own compactions
    kept, the default policy's recall and bill at each budget; then each policy at the recorded bill."""
    if not rows:
        return
    policy = default_policy(names)
    head, body = project_table(rows, budgets, policy)
    what = f"{policy} at B = {budgets[0]}" if len(budgets) == 1 else f"{policy} at each budget"
    t = Table(title=f"Your sessions: what you paid, what your agent's compactions kept, and {what}", header_style="bold",
              caption="project: the folder each session ran in (its logged working directory; a git worktree counts as its repository); "
                      "paid: the recorded usage priced by the recorded model's price model (Claude: anthropic-style, GPT: openai-style; "
                      "--prices FILE for your model's prices); kept: Later-Used Result Recall of what the agent itself sent (after its "
                      "compactions); check: the agent's own requests through the simulated prompt cache ÷ paid (the simulation's own "
                      f"error: tokenizer, system prompt estimated from the first call); {policy} B: its recall % and its bill ÷ the "
                      "agent's own, both simulated (like for like); every policy below (docs/evaluator.md, Real sessions)")
    for h in head:
        t.add_column(h.replace(" recall %", "\nrecall %").replace(" ÷ ", " ÷\n").replace("check: ", "check:\n"),
                     justify="left" if h == "project" else "right", no_wrap=True)
    for cells in body:
        t.add_row(*cells)
    Console(width=max(console.width, table_width(t)), force_terminal=console.is_terminal).print(t)
    off = off_checks(rows, budgets[0])
    if off:
        console.print("check far from 1 (" + ", ".join(f"{p} {ratio(c)}" for p, c in off) + "): the simulated bill of the "
                      f"agent's own requests there is off what was paid by more than {round(100 * CHECK_OFF)} %, so read its bills ÷ own (both "
                      "simulated, like for like) rather than against what was paid (the cache check below says where it "
                      "differs; docs/evaluator.md, Real sessions)", markup=False, highlight=False, soft_wrap=True)
    for src in agent_sources(per_source):  # per agent: their caches and compactions differ
        of = "" if src == "ALL" else f" ({src})"
        picks = recommend_vs_own(per_source, src)
        if picks:
            console.print(f"recommended instead of your agent's own context management{of}: the most recall among the policies that "
                          "keep at least as much for no more than its bill, like for like:", markup=False, highlight=False, soft_wrap=True)
            for pick in picks:
                console.print("  " + pick.line(), markup=False, highlight=False, soft_wrap=True)
        lines = equal_cost(per_source, src)
        if lines:
            console.print(f"each policy at the agent's own bill{of}, like for like:", markup=False, highlight=False, soft_wrap=True)
            for e in lines:
                console.print("  " + e.line(budgets), markup=False, highlight=False, soft_wrap=True)


def _print_cache_check(checks: dict[str, dict]) -> None:
    """One line per source of session logs: the cache simulation against the recorded bills."""
    if not checks:
        return
    console.print("cache check: the recorded requests through the simulated prompt cache against their recorded usage "
                  "(docs/evaluator.md, Real sessions):", markup=False, highlight=False, soft_wrap=True)
    for src, c in checks.items():
        console.print(f"  {src}: {c['calls']} calls with recorded usage; read from the cache {c['read_share_simulated']:.1f} % of the input simulated, "
                      f"{c['read_share_recorded']:.1f} % recorded; simulated input tokens ÷ recorded {c['input_ratio']:.2f} "
                      f"(tokens, not dollars: the sessions table's check compares the bills); "
                      f"per call the read share differs by {c['read_share_error_median']:.1f} points (median), "
                      f"{c['read_share_error_mean']:.1f} (mean)", markup=False, highlight=False, soft_wrap=True)


def _this_command() -> str:
    """How to run this CLI again from here: ``historygraph`` when that is the program on PATH, else
    the path this process was started by (e.g. ``.venv/bin/historygraph`` in a clone whose
    environment is not activated); ``python -m historygraph`` when started so."""
    me = Path(sys.argv[0])
    if me.name == "__main__.py":
        return "python -m historygraph"
    found = shutil.which("historygraph")
    if me.name != "historygraph" or (found is not None and Path(found).resolve() == me.resolve()):
        return "historygraph"
    try:
        return str(me.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(me)


_worker: tuple = ()


def _worker_init(names: list[str], budgets: list[int], encoding: str, store: str | None,
                 params: dict[str, dict] | None = None, threads: int = 1, embedder: str = DEFAULT_EMBEDDER,
                 models: dict | None = None) -> None:
    """Per worker process: its store connection and signals; its embedder gets ``threads``
    intra-op threads (the cores divided among the workers, so that they do not compete). Ctrl-C
    is the parent's to handle (it ends the workers, :func:`_replay_parallel`): a worker ignores it,
    and dies of the SIGTERM the parent ends it with (a forked worker would otherwise inherit the
    parent's handler, :func:`_terminated`, and go on to its next trace)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    global _worker
    db = open_store(store)
    signals = Signals(counter=TokenCounter(encoding), store=db, embedder_factory=partial(create_embedder, embedder, threads))
    _worker = (signals, names, budgets, db, params, models)


def _embedded(signals: Signals) -> int:
    """Texts embedded so far through ``signals`` (not counting cache hits)."""
    return signals._embedder.calls if signals._embedder else 0


def _worker_replay(trace):  # noqa: ANN001, ANN202 - runs in a worker process
    signals, names, budgets, db, params, models = _worker
    before = _embedded(signals)
    return replay_budgets(trace, names, budgets, signals, db, params=params, price_models=models), _embedded(signals) - before


def _replay_parallel(traces: list, names: list[str], budgets: list[int], encoding: str, store: str | None, jobs: int,
                     done: dict, embedded: list[int], advance, params: dict[str, dict] | None = None,
                     embedder: str = DEFAULT_EMBEDDER, models: dict | None = None) -> None:  # noqa: ANN001
    """Replay whole traces in ``jobs`` processes (largest first), putting each finished trace's
    results (one per budget) into ``done`` (trace index -> results) and adding the texts the workers
    embedded to ``embedded[0]``, so that an interrupt keeps what is finished. On any exception
    (Ctrl-C among them) pending traces are cancelled and the workers ended at once, not waited for
    (a long trace takes tens of seconds): the command stops within a second or two."""
    from concurrent.futures import ProcessPoolExecutor, as_completed

    order = sorted(range(len(traces)), key=lambda i: -len(traces[i].messages))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    pool = ProcessPoolExecutor(jobs, initializer=_worker_init, initargs=(names, budgets, encoding, store, params, threads, embedder, models))
    try:
        futures = {pool.submit(_worker_replay, traces[i]): i for i in order}
        for fut in as_completed(futures):
            done[futures[fut]], n = fut.result()
            embedded[0] += n
            advance()
    except BaseException:
        procs = list((getattr(pool, "_processes", None) or {}).values())  # (no public API ends a busy worker)
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(2)
        pool.shutdown(wait=True)  # the workers are gone: the pool's own thread ends at once
        raise
    pool.shutdown(wait=True)



def report(
    run_dir: Annotated[Path, typer.Argument(help="The --out folder of 'historygraph replay'.")] = Path("replay-results"),
    budget: Annotated[Optional[int], typer.Option("--budget", "-b", help="Budget of the headline figures and tables (default 6000 when it ran, else the first).")] = None,
    trace: Annotated[Optional[str], typer.Option(help="Session or trace id for the timeline (default: the compared trace with the most reuse events).")] = None,
    prices_file: PricesOption = None,
) -> None:
    """Write RUN_DIR/report.html (self-contained: plots embedded, sortable tables), RUN_DIR/report.md and its figures in RUN_DIR/report-files/."""
    from historygraph.eval.html_report import ReportError, write_report

    try:
        paths = write_report(run_dir, budget, trace, progress=lambda step: err.print(step + " …", markup=False, highlight=False, soft_wrap=True),
                             prices=prices_file)
    except ReportError as exc:
        fail(str(exc))
    except RuntimeError as exc:  # matplotlib missing
        fail(str(exc))
    console.print(f"wrote {paths['html']}, {paths['markdown']} and its figures as PNG files in {paths['figures']}/",
                  markup=False, highlight=False, soft_wrap=True)

