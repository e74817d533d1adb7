"""Where a warm render's CPU goes: cProfile with a CPU-time clock over warm renders of one policy.

The session is ``bench/run.py``'s synthetic one (real mini-swe-agent steps cycled, B = 6000,
embeddings cached); each repeat appends one step and renders, as an agent does between model
calls; only the renders are profiled (``time.process_time`` as the profiler's clock, so time other
processes take on a shared machine is not counted).

Usage: ``python bench/render_profile.py [--policy prune] [--results 1000] [--repeats 15] [--top 30]
[--sort tottime|cumulative] [--cache PATH] [--no-gc]``. Prints the CPU ms per render (median, without the profiler),
the profiled calls per render and the functions with the largest times.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402  (puts the repository's src first on sys.path)

from historygraph.history.graph import ContextGraph  # noqa: E402
from historygraph.policies import Signals, create  # noqa: E402
from historygraph.store import open_store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="prune")
    ap.add_argument("--results", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    ap.add_argument("--traces", type=Path, default=bench.ROOT.parent / "shared" / "traces")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "historygraph-bench" / "embeddings.sqlite",
                    help="the embedding cache (a SQLite store; bench/run.py's by default)")
    ap.add_argument("--no-gc", action="store_true", help="the cyclic garbage collector off while rendering "
                    "(its pauses otherwise land in whichever function runs)")
    args = ap.parse_args()
    signals = Signals(store=open_store(str(args.cache)))
    pool = bench.StepPool(args.traces)
    if args.policy not in ("prune", "full", "cw-sliding-window", "observation-masking"):
        bench.warm_embeddings(pool, signals)
    msgs, k = pool.session(args.results)
    policy = create(args.policy)
    g = ContextGraph("profile", msgs)
    policy.render(g, bench.BUDGET, signals)
    plain = []
    for r in range(args.repeats):  # unprofiled: the CPU ms per render
        g.extend(pool.step(k + r))
        t0 = time.process_time()
        policy.render(g, bench.BUDGET, signals)
        plain.append((time.process_time() - t0) * 1000)
    k += args.repeats
    prof = cProfile.Profile(time.process_time)
    if args.no_gc:
        gc.disable()
    for r in range(args.repeats):
        g.extend(pool.step(k + r))
        prof.enable()
        policy.render(g, bench.BUDGET, signals)
        prof.disable()
    st = pstats.Stats(prof)
    calls = sum(v[1] for v in st.stats.values()) / args.repeats  # type: ignore[attr-defined]
    print(f"{args.policy} at {args.results:,} results: {statistics.median(plain):.2f} CPU ms per render "
          f"(median of {args.repeats}, no profiler); {calls:,.0f} calls per render profiled")
    st.sort_stats(args.sort).print_stats(args.top)


if __name__ == "__main__":
    main()
