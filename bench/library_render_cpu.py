"""CPU time of one library rendering per sentence embedder, on one real trace.

Usage: python bench/library_render_cpu.py [TRACE] [--policy contextrender] [--budget 6000] [--repeats 5]

Feeds TRACE (default: the mini-swe-agent trace django__django-11099 of ../shared/traces) message
by message into a :class:`historygraph.Session` and renders before every recorded model call, as an
agent loop using the library does, once per embedder (``minilm``, the library's default;
``wordllama``, the proxy's; ``static``) and repeat, each time with a fresh in-memory store and
embedding cache (so every text is embedded once per repeat, as in one agent run). The embedder's
model is loaded before the clock starts. Prints per embedder the CPU seconds of this process per
rendering (``time.process_time``: every thread, onnxruntime's included), as the median over the
repeats of the mean over the renderings, and its ratio to ``minilm``'s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial
from pathlib import Path

from historygraph import Session
from historygraph.policies import Signals
from historygraph.signals.embeddings import create_embedder
from historygraph.traces import read_traces

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "mini-swe-agent-deepseek" / "django__django-11099.traj.json"


def cpu_per_render(trace, embedder: str, policy: str, budget: int) -> tuple[float, int]:  # noqa: ANN001
    """Mean CPU seconds per rendering over one pass through ``trace``, and the renderings made."""
    signals = Signals(embedder_factory=partial(create_embedder, embedder))
    signals.embedder.inner.embed(["load the model before the clock starts"])  # (not into the cache)
    session = Session(policy=policy, budget=budget, signals=signals)
    spent, renders = 0.0, 0
    for m in trace.messages:
        if m.role == "assistant":  # the input of this model call
            t0 = time.process_time()
            session.render()
            spent += time.process_time() - t0
            renders += 1
        session.add(m)
    return spent / max(renders, 1), renders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--policy", default="contextrender")
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--embedder", action="append", default=None)
    args = ap.parse_args()
    trace = next(iter(read_traces(args.trace)))
    names = args.embedder or ["minilm", "wordllama", "static"]
    out = {}
    for name in names:
        runs = [cpu_per_render(trace, name, args.policy, args.budget) for _ in range(args.repeats)]
        out[name] = statistics.median(r[0] for r in runs)
        print(f"{name}: {1000 * out[name]:.1f} CPU ms per rendering (median of {args.repeats}; "
              f"{runs[0][1]} renderings of {args.trace.name}, {args.policy}, B = {args.budget})", flush=True)
    if "minilm" in out:
        print("ratio to minilm: " + ", ".join(f"{n} {out[n] / out['minilm']:.3f}" for n in names))


if __name__ == "__main__":
    main()
