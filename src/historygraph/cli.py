"""The ``historygraph`` command: replay traces through policies, list policies, inspect the store, serve the proxy."""

from __future__ import annotations

import difflib
import inspect
import json
import os
import re
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Iterator, Optional, Sequence

import typer
import typer.rich_utils
from rich.console import Console
from rich.text import Text
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from historygraph import __version__
from historygraph.eval.recall import AGE_BINS
from historygraph.eval.cost import Prices
from historygraph.eval.prices import PriceModelError, load_price_models, select
from historygraph.eval.replay import replay_budgets, replay_trace
from historygraph.eval.report import summarize, write_outputs
from historygraph.traces import READERS, TraceFormatError, list_trace_files, read_traces
from historygraph.history.graph import MESSAGE_SPAN, ContextGraph
from historygraph.models.chat import ModelError
from historygraph.policies import DEFAULT_POLICY, REGISTRY, PolicyError, Signals, config_fields, create
from historygraph.policies import params as policy_params
from historygraph.render import BudgetTooSmallError
from historygraph.signals.embeddings import DEFAULT_EMBEDDER, EMBEDDERS, SERVE_EMBEDDER, create_embedder
from historygraph.signals.tokens import DEFAULT_ENCODING, ENCODINGS, TokenCounter
from historygraph.store import StoreError, open_store

app = typer.Typer(help="historygraph: render agent histories under a token budget, chosen by evidence.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _piped_width() -> int:
    """Width of piped output: a whole $COLUMNS ≥ 40 the user set, else 170 columns (read once, at start)."""
    try:
        return max(40, int(os.environ["COLUMNS"]))
    except (KeyError, ValueError):
        return 170


console = Console(width=None if Console().is_terminal else _piped_width())
if not Console().is_terminal and "COLUMNS" not in os.environ and typer.rich_utils.MAX_WIDTH is None:
    typer.rich_utils.MAX_WIDTH = 120  # --help piped or logged: rich's 80 columns cut option help to a few words
err = Console(stderr=True)

EXAMPLE = "dinner_bill.json"


def example_trace_path() -> Path:
    """The small example trace shipped with the package (the dinner-bill scenario of ContextRender §2)."""
    return Path(str(files("historygraph") / "examples" / EXAMPLE))


def _unknown_policy(name: str) -> None:
    close = difflib.get_close_matches(name, list(REGISTRY), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    _fail(f"unknown policy {name!r}; {hint}run 'historygraph policies' to list them")


ParamOption = Annotated[list[str], typer.Option(
    "--param", "-P", help="Policy parameter name=value, or policy.name=value for one policy (repeatable; "
                          "'historygraph policies' lists them). Overrides --params.")]
ParamsFileOption = Annotated[Optional[Path], typer.Option(
    "--params", help="TOML file of policy parameters, one \\[policy-name] table per policy.")]
SessionArgument = Annotated[str, typer.Argument(help="Session id, or a replayed trace's whole id (the part of the session id "
                                                      "after its last ':') when one session has it ('historygraph sessions' "
                                                      "lists them).")]


def _policy_params(items: list[str], path: Path | None, names: list[str]) -> dict[str, dict]:
    """Parameters per policy from ``--params`` then ``-P`` (exits naming the field on an error)."""
    try:
        out = policy_params.load_file(path) if path is not None else {}
        for name, values in policy_params.parse_cli(items, names).items():
            out[name] = {**out.get(name, {}), **values}
    except PolicyError as exc:
        _fail(str(exc))
    return out


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


def _fail(msg: str, code: int = 2) -> None:
    err.print("[bold red]error:[/] ", end="")
    err.print(msg, markup=False, highlight=False, soft_wrap=True)  # paths and ids stay whole, copyable
    raise typer.Exit(code)


def _warn(msg: str) -> None:
    err.print("[yellow]warning:[/] ", end="")
    err.print(msg, markup=False, highlight=False, soft_wrap=True)


def _check_out(out: Path) -> None:
    """Fail before any work when ``--out`` cannot hold the results (an existing file, no permission)."""
    if out.exists() and not out.is_dir():
        _fail(f"--out {out}: is an existing file; give a folder for replay.json, replay.csv and the plots "
              "(it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"--out {out}: cannot create the folder: {exc.strerror or exc}")
    if not os.access(out, os.W_OK):
        _fail(f"--out {out}: folder is not writable")


def _read_all(paths: list[Path], fmt: str | None, strict: bool) -> tuple[list, list[dict[str, str]]]:
    """Every readable trace under ``paths`` and the files skipped (``{"path", "error"}``), each
    named in a warning; with ``strict`` the first unreadable file ends the command."""
    traces, skipped = [], []
    for p in paths:
        for f in list_trace_files(p):
            try:
                traces.extend(read_traces(f, format=fmt))
            except (TraceFormatError, OSError, UnicodeDecodeError) as exc:
                why = exc.what if isinstance(exc, TraceFormatError) else f"{type(exc).__name__}: {exc}"
                if strict:
                    _fail(f"{exc if isinstance(exc, TraceFormatError) else f'{f}: {why}'} (--strict stops at the "
                          "first unreadable file)")
                where = f" (field {exc.field})" if isinstance(exc, TraceFormatError) and exc.field is not None else ""
                _warn(f"skipped {f}{where}: {why}")
                skipped.append({"path": str(f), "error": f"{why}{where}"})
    return traces, skipped


PLAIN_PROGRESS_SECONDS = 10.0  # when stderr is not a terminal, a progress line at most this often
HEARTBEAT_SECONDS = 30.0       # ... and at least this often, while a long trajectory is being worked on
_last_line: dict[int, float] = {}
_work: dict[int, tuple[list[float], dict]] = {}  # task -> (work per trajectory, the dict of those finished)
_finished_at: dict[int, float] = {}  # task -> its elapsed seconds when a trajectory last finished (_advance)


def _time_left(t: Task) -> float | None:
    """Seconds left for task ``t``: the time until the last trajectory finished per unit of work
    finished, times the work left, less the time spent since then on the trajectories in progress
    (but never below the time of the work left without the largest unfinished trajectory, nor
    below 0: a long one in progress makes the estimate fall, not grow). The work of a trajectory
    is what the task registered in :data:`_work` (for replay :func:`_replay_work`: trajectories
    differ in cost by 1,000×, so a count of them misleads), else its count (rich's own estimate
    counts trajectories, and lapses when nothing finishes for half a minute). ``None`` before
    anything finished and once all did."""
    weights, finished = _work.get(t.id, ([], {}))
    done_w = sum(weights[i] for i in finished) if weights else t.completed
    total_w = sum(weights) if weights else (t.total or 0)
    if not done_w or not total_w or t.finished:
        return None
    now = t.elapsed or 0.0
    then = min(_finished_at.get(t.id, now), now)
    rate = then / done_w
    if then == now:
        return rate * (total_w - done_w)
    largest = max((w for i, w in enumerate(weights) if i not in finished), default=0)
    return max(rate * (total_w - done_w) - (now - then), rate * (total_w - done_w - largest), 0.0)


class _TimeLeftColumn(ProgressColumn):
    """The bar's time left, by :func:`_time_left`."""

    def render(self, task: Task) -> Text:
        left = 0.0 if task.finished else _time_left(task)
        return Text("-:--:--" if left is None else f"~{timedelta(seconds=round(left))} left", style="progress.remaining")


def _plain_line(bar: Progress, task: TaskID, label: str) -> None:
    """One plain progress line, with the time left by :func:`_time_left`."""
    t = bar.tasks[task]
    _last_line[task] = time.monotonic()
    left = _time_left(t)
    err.print(f"{label} {t.completed:.0f}/{t.total:.0f} trajectories, {t.elapsed or 0.0:.0f} s"
              + ("" if left is None else f", about {left:.0f} s left"), highlight=False)


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


def _advance(bar: Progress, task: TaskID, label: str) -> None:
    """Advance ``task``; when stderr is not a terminal (a log file, CI), where rich draws no live
    bar, also print a plain line every :data:`PLAIN_PROGRESS_SECONDS` and at the end."""
    bar.advance(task)
    t = bar.tasks[task]
    _finished_at[task] = t.elapsed or 0.0
    if err.is_terminal:
        return
    if t.finished or time.monotonic() - _last_line.get(task, 0.0) >= PLAIN_PROGRESS_SECONDS:
        _plain_line(bar, task, label)


@contextmanager
def _heartbeat(bar: Progress, task: TaskID, label: str, work: tuple[list[float], dict] | None = None) -> Iterator[None]:
    """When stderr is not a terminal, print the plain progress line every
    :data:`HEARTBEAT_SECONDS` even if no trajectory finishes (one can take minutes). ``work``: the
    work per trajectory and the dict of those finished, for the time left (:data:`_work`), while
    the block runs."""
    stop = threading.Event()
    _finished_at.pop(task, None)  # (task ids restart at 0 in every progress bar)
    if work is not None:
        _work[task] = work

    def beat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS / 3):
            if time.monotonic() - _last_line.get(task, 0.0) >= HEARTBEAT_SECONDS and not bar.tasks[task].finished:
                _plain_line(bar, task, label)

    _last_line[task] = time.monotonic()
    thread = threading.Thread(target=beat, daemon=True) if not err.is_terminal else None
    if thread:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        _work.pop(task, None)
        _finished_at.pop(task, None)


@app.command()
def replay(
    paths: Annotated[Optional[list[Path]], typer.Argument(help="Trace files or folders (searched recursively). Default: the shipped example trace.")] = None,
    policy: Annotated[list[str], typer.Option("--policy", "-p", help="Policy to run (repeatable); 'all' runs every registered policy.")] = ["learned", "contextrender", "prune", "full"],
    budget: Annotated[str, typer.Option("--budget", "-b", help="History budget B in tokens (ContextRender B.1 uses 6000); a comma-separated list sweeps several in one run, e.g. 2000,3000,6000,12000.")] = "6000",
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
    Ctrl-C, or when a summarising policy's model fails, the traces finished so far are written
    (``meta.interrupted`` in replay.json) before the command exits."""
    names = sorted(REGISTRY) if "all" in policy else list(dict.fromkeys(policy))
    for n in names:
        if n not in REGISTRY:
            _unknown_policy(n)
    if encoding not in ENCODINGS:
        _fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if fmt is not None and fmt not in READERS:
        _fail(f"unknown --format {fmt!r}; choose one of {', '.join(READERS)}")
    params = _policy_params(param, params_file, names)
    budgets = _budgets(budget)
    if embedder not in EMBEDDERS:
        _fail(f"unknown --embedder {embedder!r}; choose one of {', '.join(EMBEDDERS)}")
    try:
        prices = Prices.parse(price)
    except ValueError as exc:
        _fail(f"--price: {exc}")
    try:
        models = load_price_models(prices_file)
        shown = list(select(models, price_model))
    except PriceModelError as exc:
        _fail(f"--prices: {exc}" if prices_file else str(exc))
    paths = paths or [example_trace_path()]
    for p in paths:
        if not p.exists():
            _fail(f"{p}: no such file or folder")
    created = not out.exists()
    _check_out(out)
    t_start = time.perf_counter()
    try:
        traces, skipped = _read_all(paths, fmt, strict)
        if not traces:
            _fail(f"no readable traces in {', '.join(map(str, paths))}" + (f" ({len(skipped)} file(s) skipped)" if skipped else ""))
    except typer.Exit:  # nothing was replayed: leave no empty --out folder behind
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    try:
        db = open_store(store)
    except Exception as exc:  # an unwritable path, a corrupt database file
        _fail(f"cannot open store {store or 'default'}: {exc}")
    signals = Signals(counter=TokenCounter(encoding), store=db, embedder_factory=partial(create_embedder, embedder))
    try:
        policies = {n: create(n, replay=True, **params.get(n, {})) for n in names}
    except (PolicyError, ValueError) as exc:
        _fail(str(exc))
    console.print(f"Replaying {len(traces)} {'trajectory' if len(traces) == 1 else 'trajectories'} from {len(paths)} path(s) through {', '.join(names)} "
                  f"at B = {', '.join(map(str, budgets))} tokens ({encoding}); store: {_store_name(db)}",
                  markup=False, highlight=False, soft_wrap=True)  # one line, whatever its length: scripts grep it
    for n, p in policies.items():
        if hasattr(p, "model_info"):
            info = p.model_info
            console.print(f"{n}: reuse model {info['file']}" + (f" (fitted on {info['traces']} trajectories of "
                          f"{', '.join(info.get('fitted_on') or ['?'])})" if "traces" in info else ""))
    jobs = min(jobs, len(traces))  # (a worker process for no trace would only load the models)
    done: dict[int, object] = {}
    embedded = [0]
    stopped: str | None = None
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), _TimeLeftColumn(), console=err, transient=False,
                  disable=not err.is_terminal) as bar:  # not a terminal: the plain lines of _advance only
        task = bar.add_task("replay", total=len(traces))
        with _heartbeat(bar, task, "replay", work=([_replay_work(tr) for tr in traces], done)):
            try:
                if jobs > 1:
                    _replay_parallel(traces, names, budgets, encoding, store, jobs, done, embedded, lambda: _advance(bar, task, "replay"), params,
                                     embedder, models)
                for i, tr in enumerate(traces if jobs == 1 else ()):
                    bar.update(task, description=f"{tr.source}:{tr.trace_id}"[:48])
                    if len(budgets) == 1:
                        done[i] = [replay_trace(tr, policies, budgets[0], signals, db, price_models=models)]
                    else:
                        done[i] = replay_budgets(tr, names, budgets, signals, db, params=params, price_models=models)
                    _advance(bar, task, "replay")
            except KeyboardInterrupt:
                stopped = "interrupted (Ctrl-C)"
            except ModelError as exc:  # a summarising policy whose model is unavailable after its retries
                stopped = f"{exc} (needed by a summarising policy; configure an endpoint or drop those policies)"
    results = [done[i][k] for k in range(len(budgets)) for i in sorted(done)]  # budget by budget, traces in order
    wall = time.perf_counter() - t_start
    peak_mb = _peak_rss_mb()
    meta = {"version": __version__, "command": " ".join(["historygraph"] + sys.argv[1:]), "budget": budgets[0],
            "budgets": budgets,
            "encoding": encoding, "policies": names, "paths": [str(p) for p in paths], "trajectories": len(traces), "jobs": jobs,
            "wall_seconds": round(wall, 1), "peak_rss_mb": None if peak_mb is None else round(peak_mb, 1),
            "texts_embedded": embedded[0] + _embedded(signals), "embedder": embedder, "skipped_files": skipped,
            "interrupted": stopped is not None, "trajectories_done": len(done),
            "models": {n: p.model_info for n, p in policies.items() if hasattr(p, "model_info")}}
    written = write_outputs(out, results, meta, prices, models)
    db.close()
    if stopped:
        _fail(f"{stopped}: wrote the {len(done)} of {len(traces)} trajectories finished so far to "
              + ", ".join(str(p) for p in written.values()), code=130 if stopped.startswith("interrupted") else 2)
    per_trace_rows, per_source_rows = summarize(results, prices, models)
    for b in budgets:
        _print_table([r for r in per_source_rows if r["budget"] == b], f"Later-Used Result Recall and history tokens at B = {b}", wide=wide,
                     cache_models=shown)
        if per_trace:
            _print_table([r for r in per_trace_rows if r["budget"] == b], f"Per trace at B = {b}", trace_col=True, wide=wide,
                         cache_models=shown)
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
        _warn(f"{len(skipped)} unreadable file(s) skipped: " + ", ".join(s["path"] for s in skipped))
    if bad or skipped:
        raise typer.Exit(1)


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


def _budgets(text: str, hint: str = " (give one, or a comma-separated list)") -> list[int]:
    """``6000`` or ``2000,3000,6000``: distinct whole numbers >= 1, in the order given."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            if re.fullmatch(r"\d{1,3}(,\d{3})+", text.strip()):
                _fail(f"--budget {text!r}: write {text.strip().replace(',', '')} without a thousands separator "
                      "(a comma separates budgets, e.g. 2000,6000)")
            _fail(f"--budget {text!r}: {part!r} is not a whole number of tokens >= 1{hint}")
        if int(part) not in out:
            out.append(int(part))
    return out


def _one_budget(text: str) -> int:
    """``--budget`` of a command that takes one budget, checked as replay checks its list."""
    budgets = _budgets(text, hint="")
    if len(budgets) > 1:
        _fail(f"--budget {text!r}: give one budget here (replay sweeps a comma-separated list)")
    return budgets[0]


_worker: tuple = ()


def _worker_init(names: list[str], budgets: list[int], encoding: str, store: str | None,
                 params: dict[str, dict] | None = None, threads: int = 1, embedder: str = DEFAULT_EMBEDDER,
                 models: dict | None = None) -> None:
    """Per worker process: its store connection and signals; its embedder gets ``threads``
    intra-op threads (the cores divided among the workers, so that they do not compete)."""
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
    embedded to ``embedded[0]``, so that an interrupt keeps what is finished. Pending traces are
    cancelled on any exception."""
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
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _fmt(v: object, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


# the columns a replay prints by default (``--wide``: every column; replay.csv and the report keep all)
COMPACT_COLUMNS = ("source", "trace_id", "policy", "traces", "invocations", "events", "recall", "pct_of_oracle",
                   "recall_age_>25", "mean_history_tokens", "render_ms_median", "budget_errors", "model_calls")


def _print_table(rows: list[dict], title: str, trace_col: bool = False, wide: bool = False, cache_models: Sequence[str] = ()) -> None:
    cache = [f"cost_cache_{m}" for m in cache_models]  # cost with each price model's prompt cache, Full = 1
    cols = ["source"] + (["trace_id"] if trace_col else []) + ["policy"] + ([] if trace_col else ["traces"]) + ["invocations", "events", "recall", "pct_of_oracle", "value_recall"] + \
        [f"recall_age_{b}" for b in AGE_BINS] + cache + ["prefix_reuse_pct", "norm_cost", "norm_cost_own", "cost_traces", "mean_history_tokens", "max_history_tokens", "render_ms_median", "render_ms_p95",
                                        "read_repeats_exposed", "old_full_share"] + \
        ["budget_errors", "model_calls", "model_input_tokens", "model_output_tokens", "model_seconds",
         "compactions", "selection_ms_mean", "attention_s_mean", "graph_kb_session", "revival_pct"]
    heads = {"pct_of_oracle": "% of oracle", "value_recall": "value recall %", "prefix_reuse_pct": "prefix reuse %", "norm_cost": "cost (Full ρ)",
             "norm_cost_own": "cost (own ρ)", "cost_traces": "cost traces",
             "selection_ms_mean": "selection ms", "attention_s_mean": "attention s", "graph_kb_session": "graph KB",
             "revival_pct": "revival %","recall": "recall %", "mean_history_tokens": "history tokens mean", "max_history_tokens": "history tokens max",
             "render_ms_median": "render ms p50", "render_ms_p95": "render ms p95", "invocations": "calls", "events": "reuse events",
             "read_repeats_exposed": "re-reads exposed", "old_full_share": "old full %",
             "model_calls": "model calls", "model_input_tokens": "model tok in", "model_output_tokens": "model tok out",
             "model_seconds": "model s", "budget_errors": "budget errors"}
    heads.update({f"recall_age_{b}": f"age {b}" for b in AGE_BINS})
    heads.update({f"cost_cache_{m}": f"cost {m}" for m in cache_models})
    # columns that say nothing for these rows (all empty, or all zero like model calls of policies
    # that call no model) are left out of the printed table; JSON and CSV keep every column
    # recall 0.0 is a result, not an empty column: recall and its age bins stay whenever they have a value
    always = ("source", "trace_id", "policy", "recall")
    cols = [c for c in cols if (wide or c in COMPACT_COLUMNS or c in cache) and (c in always or any(r.get(c) not in ((None,) if c.startswith("recall") else (None, 0, 0.0))
                                                  for r in rows))]
    notes = []
    if "pct_of_oracle" in cols:
        notes.append("% of oracle: recall ÷ the oracle's recall (the clairvoyant selector under the same B); "
                     "– where the oracle shows none (e.g. every reused result is larger than B) or the policy went over B (full)")
    if any(c.startswith("recall_age_") for c in cols):
        notes.append("age N: recall % of the reuses whose source result was N turns (model calls) old (ContextRender Table 2's bins)")
    if any(c in cols for c in cache):
        notes.append("cost M: cost with price model M's simulated prompt cache (cache reads, writes, uncached input, output), "
                     "Full history = 1, ratio of means over the traces whose Full history exceeds B; a ratio, not dollars "
                     "(docs/evaluator.md, Price models)")
    if "norm_cost" in cols:
        notes.append("cost (Full ρ): input cost by ContextRender eq. 3, Full history = 1, priced with Full's prefix-cache share ρ "
                     "(C.2); a ratio, not dollars")
    if not wide:
        notes.append("more columns (value recall, every age bin, prefix reuse, costs, p95, model use): --wide, replay.csv, historygraph report")
    t = Table(title=title, header_style="bold", caption="\n".join(notes) or None)
    for c in cols:
        t.add_column(heads.get(c, c), justify="left" if c in ("source", "trace_id", "policy") else "right", no_wrap=True)
    for r in rows:
        t.add_row(*[_fmt(r.get(c), 3 if c.startswith(("norm_cost", "cost_cache_")) else 1) for c in cols])
    # never cut numbers: print at the table's natural width even when the terminal is narrower
    width = max(console.width, Console(width=10_000).measure(t).maximum)
    Console(width=width, force_terminal=console.is_terminal).print(t)


@app.command()
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
        _fail(str(exc))
    except RuntimeError as exc:  # matplotlib missing
        _fail(str(exc))
    console.print(f"wrote {paths['html']}, {paths['markdown']} and its figures as PNG files in {paths['figures']}/",
                  markup=False, highlight=False, soft_wrap=True)


@app.command()
def policies(as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False) -> None:
    """List the registered policies with their parameters and paper sources."""
    rows = [{"name": n, "source": s.source, "summary": s.summary, "parameters": config_fields(n)}
            for n, s in sorted(REGISTRY.items())]
    if as_json:
        console.print_json(json.dumps(rows))
        return
    t = Table(title="Policies", header_style="bold", show_lines=True)
    for c in ("name", "source", "what it does", "parameters (defaults)"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], r["source"], r["summary"], ", ".join(f"{k}={v}" for k, v in r["parameters"].items()) or "–")
    console.print(t)


def _existing_store(store: str | None):  # noqa: ANN202
    """Open a store for reading; a SQLite file that does not exist is an error, not a new empty store."""
    try:
        return open_store(store, must_exist=True)
    except StoreError as exc:
        _fail(f"{exc}: pass the --store you replayed or served with (nothing was created)")
    except Exception as exc:  # a corrupt database file, an unreachable server
        _fail(f"cannot open store {store or 'default'}: {exc}")


def _store_name(db) -> str:  # noqa: ANN001
    return str(getattr(db, "path", ":memory:"))


def _session_graph(db, session: str) -> tuple[str, ContextGraph]:  # noqa: ANN001
    """The stored graph of ``session``: its full id, or a trace id that ends exactly one session id
    (``openhands:output.jsonl:ISSUE`` can be named ``ISSUE``). Exits with a message naming the store."""
    sid = session
    if not db.has_session(session):
        matches = [s for s in db.sessions() if s.endswith(":" + session)]
        if len(matches) != 1:
            hint = (f"it ends {len(matches)} session ids: {', '.join(matches[:5])}" if matches else
                    f"give a session id or its whole trace id (the part after its last ':'); "
                    f"list them with: historygraph sessions --store {_store_name(db)}")
            _fail(f"no session {session!r} in store {_store_name(db)}; {hint}")
        sid = matches[0]
    try:
        return sid, db.graph(sid)
    except (KeyError, StoreError) as exc:
        _fail(exc.args[0] if exc.args else str(exc))


@app.command()
def sessions(store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None) -> None:
    """List the sessions in a store with their event counts."""
    db = _existing_store(store)
    t = Table(title=f"Sessions in {_store_name(db)}", header_style="bold")
    for c in ("session", "events", "tool results"):
        t.add_column(c)
    for info in db.session_infos():
        t.add_row(info.id, str(info.events), str(info.tool_results))
    console.print(t)


@app.command()
def show(session: SessionArgument, result: Annotated[Optional[str], typer.Option(help="Print one stored tool result by its id.")] = None,
         message: Annotated[Optional[str], typer.Option(help="Print stored messages by number or span, as a "
                                                             "dropped-step marker names them: '16' or '16-23'.")] = None,
         store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None) -> None:
    """Print a stored session as OpenAI messages, one complete tool result by id, or the messages a
    dropped-step marker stands for."""
    db = _existing_store(store)
    session, g = _session_graph(db, session)
    if message:
        if not MESSAGE_SPAN.fullmatch(message):
            _fail(f"--message {message!r}: give a message number or span, e.g. 16 or 16-23")
        try:
            sys.stdout.write(g.recall_text(message) + "\n")
        except KeyError as exc:
            _fail(exc.args[0])
    elif result:
        try:
            sys.stdout.write(g.result_by_id(result).content)  # byte for byte: no wrapping, no added newline
        except KeyError as exc:
            _fail(f"{exc.args[0]}; 'historygraph render {session} --store {_store_name(db)}' lists its tool call ids")
    else:
        console.print_json(json.dumps([m.to_openai() for m in g.messages]))


@app.command()
def render(
    session: SessionArgument,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Policy to render with.")] = DEFAULT_POLICY,
    budget_text: Annotated[str, typer.Option("--budget", "-b", help="History budget B in tokens (a whole number >= 1).")] = "6000",
    at: Annotated[Optional[int], typer.Option(min=1, help="Render messages 0..AT-1 only (for an assistant message AT: the "
                                                          "input of the call that produced it). Default: all, the next call.")] = None,
    encoding: Annotated[str, typer.Option(help=f"Tokenizer: {', '.join(ENCODINGS)}.")] = DEFAULT_ENCODING,
    store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rendered OpenAI messages instead of the table.")] = False,
    param: ParamOption = [],
    params_file: ParamsFileOption = None,
) -> None:
    """Show what a policy keeps of a stored session under B: each message's form, tokens and reason,
    and the ids of the omitted tool results (fetch one with 'show SESSION --result ID')."""
    budget = _one_budget(budget_text)
    if policy not in REGISTRY:
        _unknown_policy(policy)
    if encoding not in ENCODINGS:
        _fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    params = _policy_params(param, params_file, [policy]).get(policy, {})
    db = _existing_store(store)
    session, full = _session_graph(db, session)
    if at is not None and at > len(full):
        _fail(f"--at {at}: session {session!r} has only {len(full)} messages")
    graph = ContextGraph(session, full.messages[:at]) if at is not None else full
    signals = Signals(counter=TokenCounter(encoding), store=db)
    try:
        r = create(policy, **params).render(graph, budget, signals)
    except PolicyError as exc:
        _fail(str(exc))
    except BudgetTooSmallError as exc:
        _fail(f"{exc} (raise --budget)")
    except ModelError as exc:
        _fail(f"{exc} (needed by policy {policy}; configure an endpoint or choose another policy)")
    if as_json:
        console.print_json(json.dumps(r.to_openai()))
        return
    shown = {p: m for m, p in zip(r.messages, r.positions) if p is not None}
    synthetic: dict[int, list] = {}  # graph position -> synthetic messages rendered right after it
    last = -1
    for m, p in zip(r.messages, r.positions):
        if p is None:
            synthetic.setdefault(last, []).append(m)
        else:
            last = p
    t = Table(title=f"{policy} at B = {budget}: session {session} ({len(graph)} messages) in {_store_name(db)}",
              header_style="bold")
    for c in ("pos", "role", "tool call id", "form", "tokens", "reason"):
        t.add_column(c, justify="right" if c in ("pos", "tokens") else "left")
    for p, m in enumerate(graph.messages):
        out = shown.get(p)
        form = "dropped" if out is None else (out.rendered_as or "full")
        tokens = "–" if out is None else str(signals.counter.count_message(out))
        t.add_row(str(p), m.role, m.tool_call_id or "", form, tokens, Text(r.reasons.get(p, "")))  # Text: no markup
        for extra in synthetic.get(p, ()):
            t.add_row("+", extra.role, extra.tool_call_id or "", extra.rendered_as or "synthetic",
                      str(signals.counter.count_message(extra)), Text("added by the policy: " + extra.content[:120]))
    console.print(t)
    ids = [graph.messages[p].tool_call_id for p in r.omitted]
    console.print(f"history {r.history_tokens} / {budget} tokens (whole input {r.input_tokens}); "
                  f"{len(r.full)} tool results full, {len(ids)} omitted")
    if ids:
        console.print("omitted result ids: " + " ".join(ids), markup=False, highlight=False, soft_wrap=True)
        console.print(f"fetch one with: historygraph show {session} --result {ids[0]} --store {_store_name(db)}",
                      markup=False, highlight=False, soft_wrap=True)


@app.command()
def serve(
    upstream: Annotated[str, typer.Option(help="OpenAI-compatible upstream base URL, with /v1.")] = "https://api.openai.com/v1",
    anthropic_upstream: Annotated[str, typer.Option(help="Anthropic upstream base URL (/v1/messages is appended).")] = "https://api.anthropic.com",
    host: Annotated[str, typer.Option(help="Address to bind; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8642,
    store: Annotated[Optional[str], typer.Option(help="SQLite path, ':memory:' or postgresql://… URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="Default policy (header X-HistoryGraph-Policy overrides).")] = DEFAULT_POLICY,
    budget_text: Annotated[str, typer.Option("--budget", "-b", help="Default history budget in tokens, a whole number >= 1 (header X-HistoryGraph-Budget overrides).")] = "6000",
    auth_token: Annotated[Optional[str], typer.Option(envvar="HISTORYGRAPH_AUTH_TOKEN", help="Bearer token required by the session API (/api/...).")] = None,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Larger request bodies get 413.")] = 20_000_000,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the upstream (connect and between bytes); then 502.")] = 600.0,
    encoding: Annotated[str, typer.Option(help=f"Tokenizer for the budget: {', '.join(ENCODINGS)}.")] = DEFAULT_ENCODING,
    log_format: Annotated[str, typer.Option(help="Log lines on stderr: 'json' (one object per line) or 'text'.")] = "json",
    log_level: Annotated[str, typer.Option(help="Log level: DEBUG, INFO (one line per request), WARNING, ERROR.")] = "INFO",
    param: ParamOption = [],
    params_file: ParamsFileOption = None,
    recall: Annotated[bool, typer.Option("--recall", help="Offer the model a tool that fetches omitted results (answered by the proxy; header X-HistoryGraph-Recall: on/off overrides). Default: off.")] = False,
    recall_rounds: Annotated[int, typer.Option(min=1, help="Recall calls answered per request at most.")] = 3,
    calibration: Annotated[bool, typer.Option("--calibration/--no-calibration", help="Render at B shrunk by the median provider-reported / estimated prompt tokens (GET /api/calibration shows it).")] = True,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes sharing the store (a SQLite file or PostgreSQL, not ':memory:'); each accepts a new connection only while it holds no more open connections than the others, so connections spread evenly (on Windows uvicorn's multi-process mode). One per core uses every core. Each worker keeps its own warm sessions and catches a session up from the store by its length when another worker appended to it; appends are checked against the stored length inside the store's write transaction.")] = 1,
    embedder: Annotated[str, typer.Option(help=f"Sentence embedder of the policies that embed: {', '.join(EMBEDDERS)} (docs/proxy.md, docs/evaluator.md Embedders; the proxy's default is wordllama, the replays' minilm; 'static' needs historygraph\\[static], 'wordllama' historygraph\\[wordllama]).")] = SERVE_EMBEDDER,
    session_cache: Annotated[int, typer.Option(min=0, help="Open sessions each worker keeps warm (their graphs, the client messages last stored and, for /v1/messages, the wire turns last converted, so a re-sent history is recognised by its bytes without parsing it); least recently used dropped first; 0: no messages or turns remembered.")] = 256,
) -> None:
    """Run the OpenAI/Anthropic-compatible proxy and the session API (needs the 'server' extra)."""
    budget = _one_budget(budget_text)
    try:
        import uvicorn

        from historygraph.server import ServerConfig, create_app
        from historygraph.server.logs import configure as configure_logs
    except ImportError as exc:
        _fail(f"the server needs the 'server' extra (pip install 'historygraph[server]'): {exc}")
    if encoding not in ENCODINGS:
        _fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if log_format not in ("json", "text"):
        _fail(f"--log-format must be 'json' or 'text', got {log_format!r}")
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        _fail(f"--log-level must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")
    configure_logs(log_level, json=log_format == "json")
    dotted = [k.partition("=")[0].rpartition(".")[0] for k in param]
    params = _policy_params(param, params_file, list(dict.fromkeys([policy] + [d for d in dotted if d])))
    try:
        config = ServerConfig(upstream=upstream, anthropic_upstream=anthropic_upstream, store=store, policy=policy,
                              budget=budget, auth_token=auth_token, max_body_bytes=max_body_bytes, encoding=encoding,
                              timeout=timeout, policy_params=params, recall=recall, recall_rounds=recall_rounds,
                              calibrate=calibration, session_cache=session_cache, embedder=embedder,
                              # each worker's embedder gets its share of the cores (none competes for all of them)
                              embed_threads=max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None)
        application = create_app(config)
    except (PolicyError, ValueError) as exc:
        _fail(str(exc))
    except Exception as exc:  # an unreachable database, an unwritable path
        _fail(f"cannot open store {store or 'default'}: {type(exc).__name__}: {exc}")
    err.print(f"historygraph proxy on http://{host}:{port} → {upstream} | {anthropic_upstream}; policy {policy}, "
              f"budget {budget}; store {getattr(application.state.proxy.store, 'path', ':memory:')}")
    if workers == 1:
        from historygraph.server.app import tune_gc

        tune_gc()
        uvicorn.run(application, host=host, port=port, log_level="warning")
        return
    if store == ":memory:":
        _fail("--workers > 1 needs a store the workers share (a SQLite file or postgresql://…), not ':memory:'")
    import dataclasses

    from historygraph.server.app import CONFIG_ENV, LOG_ENV

    application.state.proxy.store.close()  # each worker opens its own connection
    os.environ[CONFIG_ENV] = json.dumps(dataclasses.asdict(config))
    os.environ[LOG_ENV] = json.dumps({"level": log_level, "json": log_format == "json"})
    from historygraph.server.workers import BALANCED, run_workers

    if not BALANCED:  # uvicorn's supervisor (historygraph.server.workers)
        uvicorn.run("historygraph.server.app:create_app_from_env", factory=True, workers=workers, host=host, port=port,
                    log_level="warning")
        return
    try:
        status = run_workers("historygraph.server.app:create_app_from_env", workers, host, port)
    except OSError as exc:
        _fail(f"cannot listen on {host}:{port}: {exc}")
    if status:
        raise typer.Exit(status)


def _version(value: bool) -> None:
    if value:
        console.print(__version__)
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """historygraph: render agent histories under a token budget, chosen by evidence."""


@app.command()
def fit(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders (searched recursively) of your own agent.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model file to write (JSON, a few KB; about 170 KB with "
                                      "--objective lambdarank or blend); refuses to overwrite without --force.")] = Path("model.json"),
    objective: Annotated[str, typer.Option(help="'blend' (the shipped recipe: 0.25 × a logistic regression "
                                           "+ 0.75 × LightGBM LambdaRank trees, each with its own label; needs "
                                           "LightGBM), 'logistic' (the logistic regression alone, the earlier default) "
                                           "or 'lambdarank' (the trees alone, ordering each call's candidates, "
                                           "calibrated to probabilities; slightly lower on τ-bench at B = 3000): "
                                           "docs/learned.md.")] = "blend",
    c: Annotated[float, typer.Option("--C", help="Inverse L2 regularisation strength of the logistic regression (--objective logistic).")] = 1.0,
    label: Annotated[str, typer.Option(help="What counts as reuse at the next call: 'reuse-or-named' (a Tool-Flow "
                                       "Analysis value or a code identifier the result first held; the shipped "
                                       "recipe), 'values-or-named' (TFA values other than file names, or "
                                       "identifiers) and 'named' (identifiers alone): higher recall on coding "
                                       "agents, slightly lower on agents that repeat order numbers or IDs; "
                                       "'reuse' (TFA values alone); 'fresh' ('values-or-named' counting only "
                                       "what no user or assistant message wrote before the result).")] = "reuse-or-named",
    encoding: Annotated[str, typer.Option(help=f"Tokenizer: {', '.join(ENCODINGS)}.")] = DEFAULT_ENCODING,
    fmt: Annotated[Optional[str], typer.Option("--format", help="Force a trace format instead of detecting it.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out if it exists.")] = False,
    strict: Annotated[bool, typer.Option(help="Stop at the first unreadable trace file.")] = False,
) -> None:
    """Fit the learned selector's reuse model on recorded traces and write it as JSON.

    Label: observed reuse (Tool-Flow Analysis, ContextRender §3.2, and code identifiers,
    ContextWeaver §3.1) at the next model call (--label); features: render-time signals only. Use the model with HISTORYGRAPH_LEARNED_MODEL=FILE (or the policy
    parameter model=FILE) and replay to measure it. Needs scikit-learn and, for
    --objective lambdarank, LightGBM (pip install 'historygraph\\[fit]')."""
    from historygraph.policies.learned.train import LABELS, OBJECTIVES, fit_traces

    if label not in LABELS:
        _fail(f"unknown --label {label!r}; choose one of {', '.join(LABELS)}")
    if objective not in OBJECTIVES:
        _fail(f"unknown --objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if out.exists() and not force:
        _fail(f"{out} exists; pass --force to overwrite it or choose another --out")
    if out.is_dir():
        _fail(f"--out {out} is a folder; name a file such as {out / 'model.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"--out {out}: cannot create its folder: {exc}")
    if encoding not in ENCODINGS:
        _fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if fmt is not None and fmt not in READERS:
        _fail(f"unknown --format {fmt!r}; choose one of {', '.join(READERS)}")
    for p in paths:
        if not p.exists():
            _fail(f"{p}: no such file or folder")
    try:
        import sklearn  # noqa: F401
        if objective != "logistic":
            import lightgbm  # noqa: F401
    except ImportError as exc:
        _fail(f"historygraph fit needs scikit-learn{' and LightGBM' if objective != 'logistic' else ''} ({exc}): "
              f"pip install 'historygraph[fit]'")
    traces, _ = _read_all(paths, fmt, strict)
    if not traces:
        _fail(f"no readable traces in {', '.join(map(str, paths))}")
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=False, disable=not err.is_terminal) as bar:
        task = bar.add_task("features", total=len(traces))
        with _heartbeat(bar, task, "fit: features of"):
            try:
                model = fit_traces(traces, out, TokenCounter(encoding), c=c,
                                   meta={"fitted_on": sorted({p.resolve().name for p in paths}), "encoding": encoding,
                                         "historygraph": __version__},
                                   on_trace=lambda tr: _advance(bar, task, "fit: features of"), label=label,
                                   objective=objective)
            except ValueError as exc:
                _fail(str(exc))
    m = model.meta
    console.print(f"wrote {out}: {m['traces']} trajectories, {m['examples']} examples ({m['reused']} reused); "
                  f"use it with HISTORYGRAPH_LEARNED_MODEL={out} historygraph replay ... -p learned", soft_wrap=True)


@app.command("mcp")
def mcp_command(
    session: Annotated[Optional[str], typer.Option(help="Default session of the tools (else each call names one).")] = None,
    store: Annotated[Optional[str], typer.Option(help="Store path or postgresql:// URL. Default: $HISTORYGRAPH_DB, else historygraph.sqlite in the user data dir.")] = None,
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP on --host/--port (without it: stdio).")] = False,
    host: Annotated[str, typer.Option(help="Address for --http; loopback by default.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port for --http.")] = 8643,
) -> None:
    """Serve a store's tool results to MCP-capable agents (tools results, recall, search; needs the 'mcp' extra)."""
    try:
        from historygraph.integrations.mcp import build_server
    except ImportError as exc:
        _fail(f"the MCP server needs the 'mcp' extra (pip install 'historygraph[mcp]'): {exc}")
    db = _existing_store(store)
    if session is not None and not db.has_session(session):
        _fail(f"no session {session!r} in {_store_name(db)} (historygraph sessions --store {_store_name(db)} lists them)")
    server = build_server(db, session)
    if http:
        server.run("streamable-http", host=host, port=port)
    else:
        server.run("stdio")


def _flowed(doc: str) -> str:
    """A command's docstring as help text: the lines of each paragraph joined (typer's rich help keeps
    a docstring's line breaks, which the source wraps at its own width, so sentences broke mid-way)."""
    return "\n\n".join(" ".join(line.strip() for line in para.splitlines()) for para in inspect.cleandoc(doc).split("\n\n"))


for _info in app.registered_commands:
    if _info.help is None and _info.callback is not None and _info.callback.__doc__:
        _info.help = _flowed(_info.callback.__doc__)
