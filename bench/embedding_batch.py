"""Peak memory and time of embedding per ONNX batch size (all-MiniLM-L6-v2 int8, CPU).

Usage: python bench/embedding_batch.py [--texts 256] [--batch 4 8 16 32]
Each batch size runs in its own process (peak RSS is per process) and embeds the same texts, all
long enough to be truncated to 256 word pieces (the worst case for activation memory). Prints one
line per batch size: peak RSS before and after embedding (MB) and wall seconds.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time


def run_one(batch: int, n: int) -> None:
    from historygraph.signals.embeddings import MiniLMEmbedder

    emb = MiniLMEmbedder(batch_size=batch)
    texts = [f"word{i} token " * 200 for i in range(n)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    t0 = time.perf_counter()
    emb.embed(texts)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"batch {batch:3d}: {n} texts, peak RSS {before} MB before → {peak} MB, {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--batch", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        run_one(args.one, args.texts)
        return
    for b in args.batch:
        subprocess.run([sys.executable, __file__, "--one", str(b), "--texts", str(args.texts)], check=True)


if __name__ == "__main__":
    main()
