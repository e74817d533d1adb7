"""``historygraph fit``: the learned selector's reuse model fitted on recorded traces, written as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from historygraph import __version__
from historygraph.cli.common import console, err, fail, read_all
from historygraph.cli.progress import advance, heartbeat
from historygraph.cli.replay import SESSION_SOURCES
from historygraph.history.events import Trace
from historygraph.signals.tokens import DEFAULT_ENCODING, ENCODINGS, TokenCounter
from historygraph.traces import READERS


def fit(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders (searched recursively) of your own agent.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Model file to write (JSON, a few KB; about 170 KB with "
                                      "--objective lambdarank or blend); refuses to overwrite without --force.")] = Path("model.json"),
    objective: Annotated[str, typer.Option(help="'blend' (the default and the shipped recipe: 0.1 × a logistic "
                                           "regression on 'reuse-or-named' + 0.9 × LightGBM LambdaRank trees on "
                                           "'fresh', each member with its own label; needs LightGBM), 'logistic' "
                                           "(the logistic regression alone, the earlier default; scikit-learn only) "
                                           "or 'lambdarank' (the trees alone, ordering each call's candidates, "
                                           "calibrated to probabilities; slightly lower on τ-bench at B = 3000): "
                                           "docs/learned.md.")] = "blend",
    c: Annotated[float, typer.Option("--C", help="Inverse L2 regularisation strength of the logistic regression (--objective logistic, and blend's logistic member).")] = 1.0,
    label: Annotated[str, typer.Option(help="What counts as reuse at the next call: 'reuse-or-named' (a Tool-Flow "
                                       "Analysis value or a code identifier the result first held; the "
                                       "shipped blend's logistic member), 'values-or-named' (TFA values other than file names, or "
                                       "identifiers) and 'named' (identifiers alone): higher recall on coding "
                                       "agents, slightly lower on agents that repeat order numbers or IDs; "
                                       "'reuse' (TFA values alone); 'fresh' ('values-or-named' counting only "
                                       "what no user or assistant message wrote before the result). For "
                                       "--objective logistic or lambdarank; 'blend' fits its members with their own "
                                       "labels and takes only the default.")] = "reuse-or-named",
    encoding: Annotated[str, typer.Option(help=f"Tokenizer: {', '.join(ENCODINGS)}.")] = DEFAULT_ENCODING,
    fmt: Annotated[Optional[str], typer.Option("--format", help="Force a trace format instead of detecting it.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out if it exists.")] = False,
    strict: Annotated[bool, typer.Option(help="Stop at the first unreadable trace file.")] = False,
    check: Annotated[bool, typer.Option(help="Before fitting on every trace, hold out every 4th, fit on the others "
                                        "and replay the held-out ones with the shipped model and with that one, "
                                        "and say how recall moved (at 32000 and 16000 tokens for Claude Code "
                                        "and Codex session logs, else 6000 and 3000); needs 2+ traces.")] = True,
) -> None:
    """Fit the learned selector's reuse model on recorded traces and write it as JSON.

    Label: observed reuse (Tool-Flow Analysis, ContextRender §3.2, and code identifiers,
    ContextWeaver §3.1) at the next model call (--label); features: render-time signals only. Use the model with HISTORYGRAPH_LEARNED_MODEL=FILE (or the policy
    parameter model=FILE) and replay to measure it. Needs scikit-learn, and LightGBM for the
    default 'blend' and for 'lambdarank' (only --objective logistic does without it): pip install
    -e '.\\[fit]' in the historygraph clone."""
    from historygraph.policies.learned.train import LABELS, OBJECTIVES, fit_traces

    if label not in LABELS:
        fail(f"unknown --label {label!r}; choose one of {', '.join(LABELS)}")
    if objective not in OBJECTIVES:
        fail(f"unknown --objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if out.exists() and not force:
        fail(f"{out} exists; pass --force to overwrite it or choose another --out")
    if out.is_dir():
        fail(f"--out {out} is a folder; name a file such as {out / 'model.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--out {out}: cannot create its folder: {exc}")
    if encoding not in ENCODINGS:
        fail(f"unknown encoding {encoding!r}; choose one of {', '.join(ENCODINGS)}")
    if fmt is not None and fmt not in READERS:
        fail(f"unknown --format {fmt!r}; choose one of {', '.join(READERS)}")
    for p in paths:
        if not p.exists():
            fail(f"{p}: no such file or folder")
    try:
        import sklearn  # noqa: F401
        if objective != "logistic":
            import lightgbm  # noqa: F401
    except ImportError as exc:
        fail(f"historygraph fit needs scikit-learn{' and LightGBM' if objective != 'logistic' else ''} ({exc}): "
             f"pip install -e '.[fit]' in the historygraph clone")
    traces, _ = read_all(paths, fmt, strict)
    if not traces:
        fail(f"no readable traces in {', '.join(map(str, paths))}")
    meta: dict[str, object] = {"fitted_on": sorted({p.resolve().name for p in paths}), "encoding": encoding,
                               "historygraph": __version__}
    if check and len(traces) >= 2:
        try:
            meta["held_out"] = held_out_check(traces, TokenCounter(encoding), c, label, objective)
        except ValueError as exc:
            fail(f"the held-out check's fit (--no-check skips it): {exc}")
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=False, disable=not err.is_terminal) as bar:
        task = bar.add_task("features", total=len(traces))
        with heartbeat(bar, task, "fit: features of"):
            try:
                model = fit_traces(traces, out, TokenCounter(encoding), c=c, meta=meta, on_trace=lambda tr: advance(bar, task, "fit: features of"), label=label,
                                   objective=objective)
            except ValueError as exc:
                fail(str(exc))
    m = model.meta
    console.print(f"wrote {out}: {m['traces']} trajectories, {m['examples']} examples ({m['reused']} reused); "
                  f"use it with HISTORYGRAPH_LEARNED_MODEL={out} historygraph replay ... -p learned", soft_wrap=True)



HOLD_OUT_EVERY = 4  # held_out_check: every 4th trace is held out (a quarter, at least one)


def check_budgets(traces: list[Trace]) -> tuple[int, int]:
    """The budgets of the held-out check: 32000 and 16000 tokens when every trace is a Claude Code
    or Codex session log, else 6000 and 3000 (ContextRender B.1's and its half; the budgets of
    docs/learned.md's tables)."""
    return (32000, 16000) if all(t.source in SESSION_SOURCES for t in traces) else (6000, 3000)


def held_out_check(traces: list[Trace], counter: TokenCounter, c: float, label: str, objective: str) -> dict:
    """Hold out every :data:`HOLD_OUT_EVERY`-th of ``traces`` (at least one), fit the model on the
    others, and replay the held-out ones with ``learned`` on the shipped model and on that one at
    :func:`check_budgets`; prints and returns ``{"held_out", "fitted_on", "budgets": {B: {"events",
    "shipped", "fitted"}}}`` (recall in %: Later-Used Result Recall, ContextRender B.4).

    Raises:
        ValueError: as :func:`historygraph.policies.learned.train.fit_examples` (nothing to learn from).
    """
    from historygraph.eval.replay import replay_trace
    from historygraph.policies import Signals, create
    from historygraph.policies.learned.train import examples, fit_examples

    test = traces[HOLD_OUT_EVERY - 1::HOLD_OUT_EVERY] or traces[-1:]
    train = [t for t in traces if all(t is not x for x in test)]
    model = fit_examples(examples(train, counter), c, None, label, objective)
    signals = Signals(counter=counter)
    out: dict = {"held_out": len(test), "fitted_on": len(train), "budgets": {}}
    for b in check_budgets(test):
        acc = {"events": 0, "shipped": 0, "fitted": 0}
        for tr in test:
            fitted = create("learned")
            fitted.model = model  # type: ignore[attr-defined]  # (the policy's fitted model, as a file would give it)
            res = replay_trace(tr, {"shipped": create("learned"), "fitted": fitted}, b, signals)
            acc["events"] += res.stats["shipped"].events
            acc["shipped"] += res.stats["shipped"].hits
            acc["fitted"] += res.stats["fitted"].hits
        r = {k: round(100.0 * acc[k] / max(1, acc["events"]), 1) for k in ("shipped", "fitted")}
        out["budgets"][b] = {"events": acc["events"], **r}
        console.print(f"held out {len(test)} of {len(traces)} traces (every {HOLD_OUT_EVERY}th), fitted on the other "
                      f"{len(train)}: recall at B = {b}: shipped model {r['shipped']:.1f} %, fitted "
                      f"{r['fitted']:.1f} % ({r['fitted'] - r['shipped']:+.1f} points, {acc['events']} reuse events)",
                      soft_wrap=True, markup=False, highlight=False)
    return out
