"""Warm render p50 of an earlier tree and this checkout in one process, for before/after comparisons
finer than ``bench/render_ab.py`` resolves on a loaded machine.

The earlier tree's ``historygraph`` package is copied under a temporary directory as the package
``hgbase`` (every import inside the package is relative), so both versions render ``bench/run.py``'s
synthetic session (B = 6000, embeddings cached and warmed for both) in the same process and the
same seconds: learned and contextrender of both trees, all four interleaved per step (the order
reversed every step), CPU time (``time.process_time``). Prints per size and run the p50 of each,
learned / contextrender per tree and learned after / before.

Usage: ``python bench/render_inproc_ab.py BASE_TREE [--sizes 1000,5000] [--repeats 21] [--runs 3]
[--policy learned --policy contextrender] [--no-gc]``, e.g. a ``git worktree`` of the commit
before a change. Both trees must read the same embedding cache schema.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import run as bench  # noqa: E402  (puts the repository's src first on sys.path)

from historygraph.history.graph import ContextGraph  # noqa: E402
from historygraph.policies import Signals, create  # noqa: E402
from historygraph.policies.contextrender import ContextRenderConfig, query_texts  # noqa: E402
from historygraph.policies.baselines.retrieval import latest_query  # noqa: E402
from historygraph.store import open_store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path)
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policy", action="append")
    ap.add_argument("--no-gc", action="store_true")
    ap.add_argument("--traces", type=Path, default=BENCH.parents[0].parent / "shared" / "traces")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "historygraph-bench" / "embeddings.sqlite")
    args = ap.parse_args()
    names = args.policy or ["learned", "contextrender"]
    tmp = Path(tempfile.mkdtemp(prefix="hg-inproc-ab-"))
    shutil.copytree(args.base.resolve() / "src" / "historygraph", tmp / "hgbase",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(tmp))
    be = importlib.import_module("hgbase.events")
    b_graph = importlib.import_module("hgbase.graph").ContextGraph
    b_pol = importlib.import_module("hgbase.policies")
    b_store = importlib.import_module("hgbase.store")

    def conv(m):  # noqa: ANN001, ANN202  (a message of this tree as one of the base tree)
        return be.Message(role=m.role, content=m.content, tool_call_id=m.tool_call_id, name=m.name,
                          tool_calls=tuple(be.ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls))

    pool = bench.StepPool(args.traces)
    signals, b_signals = Signals(store=open_store(str(args.cache))), b_pol.Signals(store=b_store.open_store(str(args.cache)))
    texts = [r.content[:8000] for _, rs in pool.steps for r in rs]
    for i in range(len(pool.steps)):
        g = ContextGraph("q", pool.head + pool.step(i))
        texts += [*query_texts(g, ContextRenderConfig()), latest_query(g, 8000)]
    for s in (signals, b_signals):
        s.embedder.embed(list(dict.fromkeys(texts)))
    for run in range(args.runs):
        for n in [int(x) for x in args.sizes.split(",")]:
            msgs, k = pool.session(n)
            b_msgs = [conv(m) for m in msgs]
            live = []
            for name in names:
                for tag, make, graph, sig, ms in (("before", b_pol.create, b_graph, b_signals, b_msgs),
                                                 ("after", create, ContextGraph, signals, msgs)):
                    policy, g = make(name), graph(f"{tag}-{name}-{n}-{run}", ms)
                    policy.render(g, bench.BUDGET, sig)
                    live.append((f"{name}/{tag}", policy, g, sig, tag == "before", []))
            for r in range(args.repeats):
                step = pool.step(k + r)
                b_step = [conv(m) for m in step]
                for _label, policy, g, sig, is_base, times in (live if r % 2 == 0 else live[::-1]):
                    g.extend(b_step if is_base else step)
                    if args.no_gc:
                        gc.disable()
                    t0 = time.process_time()
                    policy.render(g, bench.BUDGET, sig)
                    times.append((time.process_time() - t0) * 1000)
                    gc.enable()
            med = {label: statistics.median(times) for label, _, _, _, _, times in live}
            line = "  ".join(f"{key} {v:.2f}" for key, v in med.items())
            if "learned" in names and "contextrender" in names:
                line += "  | learned/contextrender " + " ".join(
                    f"{t} {med[f'learned/{t}'] / med[f'contextrender/{t}']:.2f}" for t in ("before", "after"))
            for name in names:
                line += f"  | {name} after/before {med[f'{name}/after'] / med[f'{name}/before']:.3f}"
            print(f"run {run + 1} n={n}: {line}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
