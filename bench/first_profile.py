"""Where a reopened session's first render goes: cProfile with a CPU clock over first renders.

The session is ``bench/run.py``'s synthetic one (B = 6000, embeddings cached), written to a SQLite
store, rendered once by the policy (its derived rows and snapshots written by ``close()``), then
reopened ``--repeats`` times by new store instances; each reopen's first render is timed
(``time.process_time``, no profiler) and then profiled on another reopen, as is one warm render
after one more step.

Usage: ``python bench/first_profile.py [--policy prune] [--results 1000] [--repeats 5] [--top 30]
[--sort tottime|cumulative] [--no-gc] [--no-profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as bench  # noqa: E402  (puts the repository's src first on sys.path)

from historygraph.history.graph import ContextGraph  # noqa: E402
from historygraph.policies import Signals, create  # noqa: E402
from historygraph.store import open_store  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", action="append")
    ap.add_argument("--results", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    ap.add_argument("--traces", type=Path, default=bench.ROOT.parent / "shared" / "traces")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "historygraph-bench" / "embeddings.sqlite")
    ap.add_argument("--no-gc", action="store_true")
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    signals = Signals(store=open_store(str(args.cache)))
    pool = bench.StepPool(args.traces)
    msgs, k = pool.session(args.results)
    tmp = tempfile.mkdtemp()
    if args.no_gc:
        gc.disable()
    for name in args.policy or ["prune"]:
        policy = create(name)
        policy.render(ContextGraph("warm", msgs), bench.BUDGET, signals)  # process-wide memos warm
        path = f"{tmp}/{name}.sqlite"
        st = open_store(path)
        st.create_session("s")
        st.append("s", msgs)
        policy.render(st.graph("s"), bench.BUDGET, signals)
        st.close()

        def reopen(r: int):  # noqa: ANN202
            copy = f"{path}.{r}"
            shutil.copyfile(path, copy)
            s = open_store(copy)
            return s, s.graph("s")

        firsts, warms = [], []
        for r in range(args.repeats):
            s, g = reopen(r)
            t0 = time.process_time()
            policy.render(g, bench.BUDGET, signals)
            firsts.append((time.process_time() - t0) * 1000)
            g.extend(pool.step(k))
            t0 = time.process_time()
            policy.render(g, bench.BUDGET, signals)
            warms.append((time.process_time() - t0) * 1000)
            g.derived.take()
            s.close()
        f, w = statistics.median(firsts), statistics.median(warms)
        print(f"{name} at {args.results:,} results: first {f:.2f} CPU ms (runs {', '.join(f'{x:.1f}' for x in firsts)}), "
              f"warm {w:.2f}, first/warm {statistics.median(a / b for a, b in zip(firsts, warms)):.1f}x", flush=True)
        if args.no_profile:
            continue
        prof = cProfile.Profile(time.process_time)
        for r in range(args.repeats):
            s, g = reopen(100 + r)
            prof.enable()
            policy.render(g, bench.BUDGET, signals)
            prof.disable()
            g.derived.take()
            s.close()
        st2 = pstats.Stats(prof)
        calls = sum(v[1] for v in st2.stats.values()) / args.repeats  # type: ignore[attr-defined]
        print(f"  {calls:,.0f} calls per first render profiled")
        st2.sort_stats(args.sort).print_stats(args.top)
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
