"""Leave-one-source-out recall of the learned selector, and per-source learning curves (issue 39).

Sources are the folders of ``../shared/traces`` and ``../shared/traces-train`` (one agent each;
a source in both folders is one source). ``--loso``: for each source S, the shipped recipe
(``historygraph fit``'s blend) is fitted on the other sources' trajectories of both folders, and
``learned`` with that model is replayed on S's trajectories of ``../shared/traces`` next to the
shipped model and ``oracle`` (and ``contextrender`` with ``--contextrender``, which needs the
embedder). Scoring runs :func:`historygraph.eval.replay.replay_trace`, so every figure is Later-Used
Result Recall (ContextRender B.4) as ``historygraph replay`` reports it.

``--curve SOURCES``: per source, ``k`` of its trajectories (drawn ``--draws`` times) are fitted
together with the shipped model's training data (the traces-train mini-swe-agent trajectories)
with the own rows repeated ``w`` times (``--weights``), and alone; each model is scored on the
source's trajectories not drawn, next to the shipped model and the model fitted on the (capped)
base alone. For mini-swe-agent, whose own data is the shipped training data,
``k`` trajectories of traces-train alone are fitted and scored on ``../shared/traces``. With
``--base others`` the own rows are added to the other sources' trajectories instead (the LOSO
model's data: an agent the shipped model was not fitted on, starting from what it was).

Bounded for a shared 2-core machine: at most ``--cap`` trajectories per source are fitted on
(every k-th, in file order), and at most ``--test-cap`` are scored per source. CPU time
(``time.process_time``) is printed per phase. Feature rows are cached under ``--cache`` per
trajectory, keyed by the digest of the feature modules, so a feature change recomputes them.

    python bench/fit_loso.py --loso                          # the LOSO table
    python bench/fit_loso.py --curve tau-bench,tau2-bench,mini-swe-agent-deepseek
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
from pathlib import Path

import numpy as np

from historygraph.eval.replay import replay_trace
from historygraph.history.events import Trace
from historygraph.policies import Signals, create
from historygraph.policies.learned.dataset import Examples, trace_examples
from historygraph.policies.learned.train import fit_examples
from historygraph.traces import read_traces

ROOTS = ("../shared/traces", "../shared/traces-train")
FEATURE_MODULES = ("features.py", "result_facts.py", "facts_cache.py", "flat_tables.py", "graph_state.py", "dataset.py")


_NUMBERED = re.compile(r"^\s*\d+(?:[\t:|]|\s{2,}|$)")
_HIT = re.compile(r"^(?:[\w./@+-]+:)?\d+[:-]")
_PATH = re.compile(r"^[\w./@+~-]+/?$|^[dl-][rwxsStT-]{9}[.@+]?\s")
_CODE = re.compile(r"^\s*(?:def |class |import |from \S+ import|#include|function |const |let |var |return\b|@\w)|[{};]\s*$")
_INDENTED = re.compile(r"^(?:\t| {2,})\S")
_TESTS = re.compile(r"\b\d+ (?:passed|failed)\b|\bRan \d+ tests?\b|test session starts|^(?:OK|FAILED)\b|\bPASSED\b", re.M)
_DIFF = re.compile(r"^(?:@@ |\+\+\+ |--- )", re.M)
_WROTE = re.compile(r"\b(?:edited|created|written|saved|updated|replaced|modified)\b", re.I)
_WRAPPER = re.compile(r"\s*(?:<[^>]*>[^<]*(?:</[^>]*>)?|\(.*\)|\[.*\]|\S*[$#>])\s*")  # tags, notes, prompts
_FILE_HEAD = re.compile(r"^\[File: |result of running `cat -n`", re.M)


def output_kind(text: str, arguments: str) -> str:
    """The kind of a tool result read from its shape (``--variant shape``), mapped onto
    :data:`~historygraph.policies.learned.result_facts.KINDS` so the feature columns stay: test output
    (a test runner's summary) ``test``; a write (a diff, or a short output saying a file was
    edited/created after a call that carries 200+ characters) ``edit``; search hits (``path:line:``
    or ``line:`` lines) or a listing (path-like lines, ``ls -l`` rows, a JSON list of records)
    ``search``; file content (numbered lines or a file header, or code-like or indented lines) ``view``; other
    output of 2+ lines ``run``; shorter ``other``. Lines that are only a tag, a bracketed note or a
    shell prompt (agents' wrappers: ``<returncode>0</returncode>``, ``(Open file: …)``) are not counted. Half of the non-empty lines decide a shape."""
    head = text[:8000]
    lines = [ln for ln in head.splitlines() if ln.strip() and not _WRAPPER.fullmatch(ln)]
    n = len(lines)
    if _TESTS.search(head):
        return "test"
    if _DIFF.search(head) or (len(arguments) >= 200 and len(head) < 300 and _WROTE.search(head)):
        return "edit"
    share = (lambda pat: sum(1 for ln in lines if pat.search(ln)) / n) if n else (lambda pat: 0.0)
    if n >= 2 and (share(_HIT) >= 0.5 or share(_PATH) >= 0.5) or head.lstrip().startswith("[{") or head.lstrip().startswith("[["):
        return "search"
    if _FILE_HEAD.search(head) or (n >= 3 and (share(_NUMBERED) >= 0.5 or share(_CODE) >= 0.15
                                                                      or share(_INDENTED) >= 0.4)):
        return "view"
    return "run" if n >= 2 else "other"


def use_variant(variant: str) -> None:
    """Replace the call kind of every result's facts by :func:`output_kind` (``shape``), in this process."""
    if variant == "shipped":
        return
    if variant != "shape":
        raise SystemExit(f"unknown --variant {variant!r}; choose shipped or shape")
    import historygraph.policies.learned.facts_cache as fc
    import historygraph.policies.learned.graph_state as gs
    from historygraph.policies.learned.result_facts import extract_facts

    def shaped(m, call):
        kind, *rest = extract_facts(m, call)
        return (output_kind(m.content, call.arguments if call else ""), *rest)

    fc.extract_facts = gs.extract_facts = shaped


def sources(roots=ROOTS) -> dict[str, dict[str, list[Trace]]]:
    """source -> root -> its trajectories (files sorted by name)."""
    out: dict[str, dict[str, list[Trace]]] = {}
    for root in roots:
        for d in sorted(p for p in Path(root).iterdir() if p.is_dir()):
            out.setdefault(d.name, {})[root] = [t for f in sorted(d.rglob("*")) if f.is_file() for t in read_traces(f)]
    return out


def every(items: list, cap: int) -> list:
    """At most ``cap`` of ``items``, every k-th (all when ``cap`` is 0)."""
    return items[::max(1, -(-len(items) // cap))][:cap] if cap and len(items) > cap else items


class Rows:
    """Feature rows per trajectory, cached on disk per feature-module digest."""

    def __init__(self, cache: Path, signals: Signals, variant: str) -> None:
        import historygraph.policies.learned as pkg

        h = hashlib.sha256(variant.encode() + (Path(__file__).read_bytes() if variant != "shipped" else b""))
        for name in FEATURE_MODULES:
            h.update((Path(pkg.__file__).parent / name).read_bytes())
        self.dir = cache / h.hexdigest()[:12]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.signals = signals

    def __call__(self, trace: Trace, group: int) -> Examples:
        f = self.dir / (hashlib.sha256(trace.trace_id.encode()).hexdigest()[:16] + f"-{len(trace.messages)}.npz")
        if f.exists():
            z = np.load(f)
            ex = Examples(*(z[k] for k in ("X", "reused", "within", "group", "invocation", "named", "valued", "fresh")))
        else:
            ex = trace_examples(trace, self.signals.counter)
            np.savez(f, **{k: getattr(ex, k) for k in ("X", "reused", "within", "group", "invocation", "named", "valued", "fresh")})
        ex.group = np.full(len(ex.group), group)
        return ex


def score(traces: list[Trace], policies: dict, budgets: list[int], signals: Signals) -> dict[tuple[str, int], list[int]]:
    """(policy, B) -> [hits, events, Σ history tokens, invocations] over ``traces``."""
    out: dict[tuple[str, int], list[int]] = {}
    for b in budgets:
        for tr in traces:
            res = replay_trace(tr, {n: p() for n, p in policies.items()}, b, signals)
            for n, st in res.stats.items():
                acc = out.setdefault((n, b), [0, 0, 0, 0])
                acc[0] += st.hits
                acc[1] += st.events
                acc[2] += sum(st.history_tokens)
                acc[3] += len(st.history_tokens)
    return out


def learned_with(model):
    def make():
        pol = create("learned")
        if model is not None:
            pol.model = model
        return pol
    return make


def pct(acc: list[int]) -> str:
    return f"{100.0 * acc[0] / max(1, acc[1]):.1f}"


def fit(parts: list[Examples]) -> object:
    return fit_examples(Examples.concat(parts))


def loso(a, src, rows, signals, budgets) -> None:
    t0 = time.process_time()
    fit_rows: dict[str, list[Examples]] = {}
    g = 0
    for s, by_root in src.items():
        fit_rows[s] = []
        for tr in every([t for ts in by_root.values() for t in ts], a.cap):
            fit_rows[s].append(rows(tr, g))
            g += 1
        print(f"{s}: {len(fit_rows[s])} trajectories to fit on, {sum(len(e.reused) for e in fit_rows[s])} rows "
              f"({time.process_time() - t0:.0f} s CPU so far)", file=sys.stderr, flush=True)
    print(f"features: {time.process_time() - t0:.0f} s CPU", file=sys.stderr, flush=True)
    lines = ["| source (scored) | B | events | learned, LOSO | learned, shipped | oracle |"
             + (" contextrender |" if a.contextrender else "") + " tokens LOSO / shipped |",
             "|---|---:|---:|---:|---:|---:|" + ("---:|" if a.contextrender else "") + "---|"]
    totals: dict = {}
    for s, by_root in src.items():
        test = every(by_root.get(ROOTS[0], []), a.test_cap)
        if not test:
            continue
        t1 = time.process_time()
        model = fit([e for o, es in fit_rows.items() if o != s for e in es])
        t2 = time.process_time()
        pols = {"loso": learned_with(model), "shipped": learned_with(None), "oracle": lambda: create("oracle", replay=True)}
        if a.contextrender:
            pols["contextrender"] = lambda: create("contextrender")
        res = score(test, pols, budgets, signals)
        for b in budgets:
            lo, sh = res[("loso", b)], res[("shipped", b)]
            lines.append(f"| {s} ({len(test)}) | {b} | {lo[1]} | {pct(lo)} ({lo[0]}) | {pct(sh)} ({sh[0]}) | "
                         f"{pct(res[('oracle', b)])} |" + (f" {pct(res[('contextrender', b)])} |" if a.contextrender else "")
                         + f" {lo[2] / max(1, lo[3]):.0f} / {sh[2] / max(1, sh[3]):.0f} |")
            for n in pols:
                acc = totals.setdefault((n, b), [0, 0, 0, 0])
                for i in range(4):
                    acc[i] += res[(n, b)][i]
        print(f"{s}: fit {t2 - t1:.0f} s, replay {time.process_time() - t2:.0f} s CPU", file=sys.stderr, flush=True)
    for b in budgets:
        lo, sh = totals[("loso", b)], totals[("shipped", b)]
        lines.append(f"| all | {b} | {lo[1]} | {pct(lo)} ({lo[0]}) | {pct(sh)} ({sh[0]}) | {pct(totals[('oracle', b)])} |"
                     + (f" {pct(totals[('contextrender', b)])} |" if a.contextrender else "")
                     + f" {lo[2] / max(1, lo[3]):.0f} / {sh[2] / max(1, sh[3]):.0f} |")
    print("\n".join(lines))
    print(f"CPU {time.process_time() - t0:.0f} s", file=sys.stderr)


def curve(a, src, rows, signals, budgets) -> None:
    t0 = time.process_time()
    base_traces = every(src["mini-swe-agent-deepseek"][ROOTS[1]], a.cap)
    base = [rows(t, i) for i, t in enumerate(base_traces)]
    base_model = fit(base)
    ks = [int(x) for x in a.ks.split(",")]
    weights = [int(x) for x in a.weights.split(",")]
    rng = np.random.default_rng(0)
    print(f"base: {len(base)} traces-train trajectories ({time.process_time() - t0:.0f} s CPU)", file=sys.stderr, flush=True)
    lines = ["| source | k own | model | " + " | ".join(f"B = {b}" for b in budgets) + " |",
             "|---|---:|---|" + "---:|" * len(budgets)]
    for s in a.curve.split(","):
        if s == "mini-swe-agent-deepseek":
            pool, fixed_test = src[s][ROOTS[1]], src[s][ROOTS[0]]
        else:
            pool, fixed_test = [t for ts in src[s].values() for t in ts], None
        if a.base == "others":  # the base: the other sources' trajectories (a new agent's starting point)
            base = [rows(t, i) for i, t in enumerate(t for o, r in src.items() if o != s
                                                     for t in every([t for ts in r.values() for t in ts], a.cap))]
            base_model = fit(base)
        results: dict[tuple[int, str], list[list[float]]] = {}
        for k in ks:
            for _ in range(a.draws):
                pick = sorted(rng.choice(len(pool), size=k, replace=False))
                test = fixed_test if fixed_test is not None else every(
                    [t for i, t in enumerate(pool) if i not in set(pick)], a.test_cap)
                own = [rows(pool[i], len(base) + n) for n, i in enumerate(pick)]
                models: dict[str, object] = {"shipped": None}
                if a.base != "others" and any((e.reused.max(initial=0) or e.named.max(initial=0)) for e in own):
                    models["own alone"] = fit(own)
                if s != "mini-swe-agent-deepseek" or a.base == "others":
                    models["base alone"] = base_model
                    for w in weights:
                        models[f"base + own x{w}"] = fit(base + own * w)
                res = score(test, {n: learned_with(m) for n, m in models.items()}, budgets, signals)
                for n in models:
                    results.setdefault((k, n), []).append([100.0 * res[(n, b)][0] / max(1, res[(n, b)][1]) for b in budgets])
                print(f"{s} k={k}: " + "; ".join(f"{n} {v[-1]}" for (kk, n), v in results.items() if kk == k)
                      + f" ({time.process_time() - t0:.0f} s CPU)", file=sys.stderr, flush=True)
        for (k, n), v in results.items():
            arr = np.array(v)
            lines.append(f"| {s} | {k} | {n} | " + " | ".join(
                f"{arr[:, i].mean():.1f} ({arr[:, i].min():.1f}–{arr[:, i].max():.1f})" for i in range(len(budgets))) + " |")
    print("\n".join(lines))
    print(f"CPU {time.process_time() - t0:.0f} s", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loso", action="store_true", help="the leave-one-source-out table")
    ap.add_argument("--curve", default="", help="learning curves of these sources (comma-separated)")
    ap.add_argument("--budget", default="6000,3000")
    ap.add_argument("--cap", type=int, default=30, help="at most N trajectories per source to fit on (every k-th)")
    ap.add_argument("--test-cap", type=int, default=0, help="at most N trajectories per source to score (every k-th)")
    ap.add_argument("--ks", default="2,5,10,20", help="--curve: numbers of own trajectories")
    ap.add_argument("--weights", default="1,10", help="--curve: repetitions of the own rows next to the base")
    ap.add_argument("--base", default="shipped", choices=("shipped", "others"),
                    help="--curve: the data own rows are added to: the shipped model's training data, or the other "
                    "sources' trajectories (at most --cap each; a new agent starting from a model not fitted on it)")
    ap.add_argument("--draws", type=int, default=2, help="--curve: random draws per k")
    ap.add_argument("--contextrender", action="store_true", help="--loso: also replay contextrender (embeds)")
    ap.add_argument("--variant", default="shipped", help="features: shipped, or shape (the call kind read from "
                    "the result's shape, output_kind; the shipped model's column is then meaningless)")
    ap.add_argument("--cache", default="/tmp/historygraph-loso-rows", help="folder for the cached feature rows")
    a = ap.parse_args()
    budgets = [int(x) for x in a.budget.split(",")]
    signals = Signals()
    t0 = time.process_time()
    src = sources()
    print(f"read {', '.join(f'{s} {sum(map(len, r.values()))}' for s, r in src.items())} "
          f"({time.process_time() - t0:.0f} s CPU)", file=sys.stderr, flush=True)
    use_variant(a.variant)
    rows = Rows(Path(a.cache), signals, a.variant)
    if a.loso:
        loso(a, src, rows, signals, budgets)
    if a.curve:
        curve(a, src, rows, signals, budgets)


if __name__ == "__main__":
    main()
