"""``historygraph fit``: the learned selector's reuse model fitted on recorded traces, written as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from historygraph import __version__
from historygraph.cli.common import console, err, fail, read_all
from historygraph.cli.progress import advance, heartbeat
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
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=False, disable=not err.is_terminal) as bar:
        task = bar.add_task("features", total=len(traces))
        with heartbeat(bar, task, "fit: features of"):
            try:
                model = fit_traces(traces, out, TokenCounter(encoding), c=c,
                                   meta={"fitted_on": sorted({p.resolve().name for p in paths}), "encoding": encoding,
                                         "historygraph": __version__},
                                   on_trace=lambda tr: advance(bar, task, "fit: features of"), label=label,
                                   objective=objective)
            except ValueError as exc:
                fail(str(exc))
    m = model.meta
    console.print(f"wrote {out}: {m['traces']} trajectories, {m['examples']} examples ({m['reused']} reused); "
                  f"use it with HISTORYGRAPH_LEARNED_MODEL={out} historygraph replay ... -p learned", soft_wrap=True)

