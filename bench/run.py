"""The speed table of issue 13 in one command: render, first render, append, proxy, replay.

Usage::

    python bench/run.py [--quick] [--traces ../shared/traces] [--policy NAME ...] [--no-proxy] [--no-replay]

Every figure is CPU time (``time.process_time`` of this process, or of the server's process tree
for the proxy), the median (p50) and 95th percentile over repeats in one process, so that a
shared machine does not inflate it the way wall time would; each is also given as a ratio to
``prune`` measured in the same run. Sections:

* **render**: synthetic sessions of 50, 200, 1,000 and 5,000 tool results built by cycling the
  real steps (assistant message + its results) of the mini-swe-agent traces with fresh call ids,
  after the traces' system and first user messages; B = 6000; embeddings cached (a persistent
  SQLite cache under the user cache directory is filled once, outside the timed part). Each
  repeat appends one more step and renders, as an agent does between model calls; the policies
  take turns within each repeat (one session per policy), so that load from other processes on a
  shared machine inflates all of them alike and the ratios stay comparable.
* **first render**: the session written to a SQLite store and, for each policy, reopened by a new
  store instance and rendered once (``not rendered before``: what the rows the store kept from the
  appends, the TFA values, leave to compute), closed (writing what that render derived,
  :mod:`historygraph.history.derived`), then reopened again as after a restart: ``load`` is
  ``store.graph()``, ``first`` the first render of the reopened graph, as a ratio to a warm render
  (medians of 3 reopens), and again with the per-graph snapshots those of the session at 85 % of
  its results (``--first-only``: this section alone; ``--no-gc``: the cyclic collector off).
* **append**: one event appended to a session of 100, 1,000 and 10,000 messages (SQLite store,
  and the bare :class:`~historygraph.history.graph.ContextGraph`).
* **proxy**: ``historygraph serve`` in front of the lean fake provider, 1, 10 and 50 concurrent
  sessions with 200-message histories (``bench/proxy_latency.py``'s client and phases); requests
  per second, client-side latency p50/p95, and the CPU ms per request of the proxy, the client
  and the fake provider apart.
* **replay**: ``historygraph replay <traces> -p contextrender -p prune -p full --jobs 2`` with an
  empty store (cold: every text embedded) and again (warm), wall and CPU seconds.

``--quick`` runs 50 and 1,000 results, fewer repeats, the proxy at 1 and 10 sessions, and no replay.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from historygraph.history.events import Message, ToolCall  # noqa: E402
from historygraph.traces import read_traces  # noqa: E402
from historygraph.history.graph import ContextGraph  # noqa: E402
from historygraph.policies import Signals, create  # noqa: E402
from historygraph.store import open_store  # noqa: E402

BUDGET = 6000
FIRST = ("prune", "contextrender", "contextrender-dep", "learned", "cw-bm25", "contextweaver-placeholder")
POLICIES = ["prune", "full", "contextrender", "contextrender-dep", "learned", "cw-bm25", "cw-sliding-window",
            "observation-masking", "contextweaver-placeholder", "recap-noattn", "recap-recency", "recap-random", "semantic"]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def cpu_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.process_time()
    out = fn()
    return (time.process_time() - t0) * 1000, out


# -- synthetic sessions from real steps ------------------------------------------------------
class StepPool:
    """The real steps of the mini-swe-agent traces, cycled with fresh call ids."""

    def __init__(self, traces: Path) -> None:
        src = traces / "mini-swe-agent-deepseek"
        ts = list(read_traces(src if src.exists() else traces))
        self.head = [m for m in ts[0].messages[:2] if m.role in ("system", "user")]
        self.steps: list[tuple[Message, list[Message]]] = []
        for t in ts:
            msgs = t.messages
            for p, m in enumerate(msgs):
                if m.role == "assistant" and m.tool_calls:
                    ids = {c.id for c in m.tool_calls}
                    res = [r for r in msgs[p + 1:p + 1 + len(ids)] if r.role == "tool" and r.tool_call_id in ids]
                    if len(res) == len(ids):
                        self.steps.append((m, res))
        self.unique_results = len({r.content for _, rs in self.steps for r in rs})

    def step(self, k: int) -> list[Message]:
        a, res = self.steps[k % len(self.steps)]
        ren = {c.id: f"b{k}-{i}" for i, c in enumerate(a.tool_calls)}
        calls = tuple(ToolCall(id=ren[c.id], name=c.name, arguments=c.arguments) for c in a.tool_calls)
        return [Message(role="assistant", content=a.content, tool_calls=calls)] + \
            [Message(role="tool", content=r.content, tool_call_id=ren[r.tool_call_id]) for r in res]

    def session(self, n_results: int) -> tuple[list[Message], int]:
        """Messages holding at least ``n_results`` tool results, and the number of steps used."""
        out, k, n = list(self.head), 0, 0
        while n < n_results:
            s = self.step(k)
            out += s
            n += len(s) - 1
            k += 1
        return out, k


def warm_embeddings(pool: StepPool, signals: Signals) -> None:
    """Embed every result and every query text the timed renders will ask for (ContextRender's
    eq. 4 texts, the semantic baseline's query), so that renders find them cached."""
    from historygraph.policies.contextrender import ContextRenderConfig, query_texts
    from historygraph.policies.baselines.retrieval import latest_query

    texts = [r.content[:8000] for _, rs in pool.steps for r in rs]
    for i in range(len(pool.steps)):
        g = ContextGraph("q", pool.head + pool.step(i))
        texts += [*query_texts(g, ContextRenderConfig()), latest_query(g, 8000)]
    signals.embedder.embed(list(dict.fromkeys(texts)))


# -- sections --------------------------------------------------------------------------------
def bench_render(pool: StepPool, signals: Signals, policies: list[str], sizes: list[int], repeats: int,
                 first_limit_s: float) -> dict:
    out: dict = {}
    skip: set[str] = set()
    for n in sizes:
        msgs, k = pool.session(n)
        live = []
        for name in policies:
            if name in skip:
                out[(name, n)] = None
                continue
            policy = create(name)
            g = ContextGraph(f"bench-{name}-{n}", msgs)
            first, _ = cpu_ms(lambda: policy.render(g, BUDGET, signals))
            live.append((name, policy, g, first, []))
        for r in range(repeats):  # policies interleaved, so that a burst of load on a shared machine falls on all of them
            step = pool.step(k + r)
            for _name, policy, g, _first, times in live:
                g.extend(step)
                t, _ = cpu_ms(lambda: policy.render(g, BUDGET, signals))  # noqa: B023 (called at once)
                times.append(t)
        for name, _policy, _g, first, times in live:
            out[(name, n)] = {"p50": statistics.median(times), "p95": pct(times, 0.95), "fresh": first}
            nxt = [s for s in sizes if s > n]
            if nxt and n >= 200 and first > 5 * out[(name, n)]["p50"] and first / 1000 * (nxt[0] / n) ** 2 > first_limit_s:
                skip.add(name)  # an O(n²) first render at the next size would take too long
            print(f"  render {name:26s} {n:5d} results: p50 {out[(name, n)]['p50']:8.2f} ms  "
                  f"p95 {out[(name, n)]['p95']:8.2f}  fresh graph {first:9.1f} ms", file=sys.stderr, flush=True)
    return out


def _reopened_first(path: str, policy: Any, signals: Signals, pool: StepPool, k: int, copy: str) -> tuple[float, float, float]:
    """``(load, first, warm)`` CPU ms of a new store instance on a copy of ``path``: the graph, its
    first render, the median of 3 warm renders after one more step each (in memory only; the
    rows those derive are dropped, so that the copy keeps the session as stored)."""
    shutil.copyfile(path, copy)
    st = open_store(copy)
    load, g = cpu_ms(lambda: st.graph("s"))
    first, _ = cpu_ms(lambda: policy.render(g, BUDGET, signals))
    warm = []
    for r in range(3):
        g.extend(pool.step(k + r))
        t, _ = cpu_ms(lambda: policy.render(g, BUDGET, signals))  # noqa: B023 (called at once)
        warm.append(t)
    g.derived.take()  # rows of positions the stored session does not have: not written
    st.close()
    return load, first, statistics.median(warm)


def bench_first(pool: StepPool, signals: Signals, policies: list[str], sizes: list[int], tmp: str,
                skip: dict, warm_memos: bool = False, repeats: int = 3) -> dict:
    """``warm_memos``: render each session once on a plain graph first, so that the process-wide
    memos (token counts, vectors) are as warm as after the render section (``--first-only``).
    Each policy's session is reopened ``repeats`` times (medians); ``behind``: reopened when the
    stored per-graph snapshots are those of the session at 85 % of its results (the rows of every
    message stored), as when a process stops between two snapshots."""
    out: dict = {}
    for n in sizes:
        msgs, k = pool.session(n)
        head, _ = pool.session(int(0.85 * n))
        path = f"{tmp}/first-{n}.sqlite"
        st = open_store(path)
        st.create_session("s")
        st.append("s", msgs)
        st.close()
        for name in policies:
            if skip.get((name, n), 0) is None:
                continue
            policy = create(name)
            if warm_memos:
                policy.render(ContextGraph("warm", msgs), BUDGET, signals)
            copy = f"{tmp}/first-{n}-{name}.sqlite"  # each policy reopens the session as stored, before any render
            shutil.copyfile(path, copy)
            st = open_store(copy)
            cold_load, g = cpu_ms(lambda: st.graph("s"))
            cold, _ = cpu_ms(lambda: policy.render(g, BUDGET, signals))  # noqa: B023 (called at once)
            write, _ = cpu_ms(st.close)  # writes the rows the render derived
            runs = [_reopened_first(copy, policy, signals, pool, k, f"{copy}.{r}") for r in range(repeats)]
            load, first, warm = (statistics.median(x) for x in zip(*runs))
            ratio_ = statistics.median(f / w for _, f, w in runs)
            behind = f"{tmp}/first-{n}-{name}-behind.sqlite"
            st = open_store(behind)
            st.create_session("s")
            st.append("s", head)
            policy.render(st.graph("s"), BUDGET, signals)  # its snapshots, at 85 % of the results
            st.append("s", msgs[len(head):])
            policy.render(st.graph("s"), BUDGET, signals)  # the rows of the rest (grown < 25 %: no new snapshot)
            st.close()
            runs_b = [_reopened_first(behind, policy, signals, pool, k, f"{behind}.{r}") for r in range(repeats)]
            first_b = statistics.median(f for _, f, _ in runs_b)
            ratio_b = statistics.median(f / w for _, f, w in runs_b)
            out[(name, n)] = {"load": load, "first": first, "warm": warm, "ratio": ratio_, "cold_load": cold_load,
                              "cold": cold, "write": write, "behind": first_b, "behind_ratio": ratio_b}
            print(f"  first  {name:26s} {n:5d} results: load {load:8.1f} ms  first {first:9.1f} ms  "
                  f"warm {warm:8.2f} ms  first/warm {ratio_:5.1f}x  (snapshots 15 % behind: first {first_b:8.1f} "
                  f"{ratio_b:5.1f}x; not rendered before: load {cold_load:8.1f} first {cold:9.1f}; "
                  f"writing its rows {write:6.1f})", file=sys.stderr, flush=True)
    return out


def bench_append(pool: StepPool, sizes: list[int], tmp: str, repeats: int) -> dict:
    out: dict = {}
    for n in sizes:
        msgs: list[Message] = list(pool.head)
        k = 0
        while len(msgs) < n:
            msgs += pool.step(k)
            k += 1
        extra: list[Message] = []
        for r in range(repeats):
            extra += pool.step(k + r)
        for kind in ("sqlite", "graph"):
            if kind == "sqlite":
                st = open_store(f"{tmp}/append-{n}.sqlite")
                st.create_session("s")
                st.append("s", msgs)
                add = lambda m: st.append("s", m)  # noqa: E731
            else:
                g = ContextGraph("s", msgs)
                add = g.append
            times = []
            for m in extra:
                t, _ = cpu_ms(lambda: add(m))
                times.append(t)
            out[(kind, n)] = {"p50": statistics.median(times), "p95": pct(times, 0.95)}
            print(f"  append {kind:6s} at {n:6d} messages: p50 {out[(kind, n)]['p50']:.3f} ms", file=sys.stderr, flush=True)
    return out


def bench_proxy(runs: list[tuple[str, int, float, dict[int, int]]], tmp: str) -> dict:
    """``runs``: (policy, worker processes, think ms of the paced phase, {concurrent sessions:
    requests per session and phase}); the phases are those of ``bench/proxy_latency.py``."""
    import proxy_latency as pl

    out: dict = {}
    for policy, workers, think_ms, levels in runs:
        up_port, px_port = pl.free_port(), pl.free_port()
        procs = [pl.start_upstream(up_port, Path(tmp, f"upstream-{policy}.log"))]
        try:
            procs.append(pl.start(pl.serve_args(up_port, px_port, f"{tmp}/proxy-{policy}-{workers}.sqlite", policy, BUDGET, workers, []),
                                  px_port, Path(tmp, f"proxy-{policy}-{workers}.log")))
            if workers > 1:
                time.sleep(5)  # the supervisor answers once one worker is up; let the others start
            for n, requests in levels.items():
                try:
                    r = pl.run_level(n, requests, think_ms, f"http://127.0.0.1:{px_port}/v1", f"http://127.0.0.1:{up_port}/v1",
                                     cpu=lambda: pl.tree_cpu(procs[1].pid), upstream_cpu=lambda: pl.tree_cpu(procs[0].pid))
                except Exception as exc:  # report the level as failed and go on (e.g. client timeouts under load)
                    print(f"  proxy  {policy:14s} {workers} workers {n:3d} sessions: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                    break
                out[(policy, workers, n)] = {
                    "rps": r["rps"], "cpu_ms": r["cpu_ms"], "client_cpu_ms": r["client_cpu_ms"],
                    "upstream_cpu_ms": r["upstream_cpu_ms"], "think_ms": think_ms,
                    "sat_p50": statistics.median(r["sat"]), "e2e_p50": statistics.median(r["paced"]),
                    "e2e_p95": pct(r["paced"], 0.95), "direct_p50": statistics.median(r["direct"]),
                    "direct_p95": pct(r["direct"], 0.95), "hdr_p50": statistics.median(r["hdr"]),
                    "first_p50": statistics.median(r["first"])}
                print(f"  proxy  {policy:14s} {workers} workers {n:3d} sessions: {out[(policy, workers, n)]}", file=sys.stderr, flush=True)
        finally:
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    return out


def bench_replay(traces: Path, tmp: str) -> dict:
    import resource

    out: dict = {}
    store = f"{tmp}/replay.sqlite"
    for kind in ("cold", "warm"):
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "historygraph", "replay", str(traces), "-p", "contextrender", "-p", "prune",
                        "-p", "full", "--jobs", "2", "--store", store, "--out", f"{tmp}/replay-{kind}"],
                       check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        wall = time.perf_counter() - w0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out[kind] = {"wall_s": wall, "cpu_s": (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)}
        print(f"  replay {kind}: {out[kind]}", file=sys.stderr, flush=True)
    return out


# -- report ----------------------------------------------------------------------------------
def ratio(x: float | None, ref: float | None) -> str:
    return f"{x / ref:.1f}×" if x is not None and ref else "–"


def report(pool: StepPool | None, render: dict, first: dict, append: dict, proxy: dict, replay: dict,
           policies: list[str], sizes: list[int], args: argparse.Namespace) -> None:
    print(f"## historygraph speed ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    flags = "".join(f" --{f.replace('_', '-')}" for f in ("quick", "proxy_only", "first_only", "no_gc") if getattr(args, f))
    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}. Command: `python bench/run.py{flags}`. B = {BUDGET}.")
    if pool is None:
        report_proxy(proxy)
        return
    print(f"Synthetic sessions cycle {len(pool.steps)} real mini-swe-agent steps "
          f"({pool.unique_results} distinct results). CPU ms, p50 over {args.repeats} renders.\n")
    if render:
        print("### Render p50 (p95) in CPU ms, and p50 as a ratio to prune\n")
        print("| policy | " + " | ".join(f"{n:,} results" for n in sizes) + " |")
        print("|---|" + "---:|" * len(sizes))
    for name in policies:
        cells = []
        for n in sizes:
            r, ref = render.get((name, n)), render.get(("prune", n))
            cells.append("skipped" if r is None else f"{r['p50']:.2f} ({r['p95']:.2f}) · {ratio(r['p50'], ref and ref['p50'])}")
        print(f"| {name} | " + " | ".join(cells) + " |")
    if "learned" in policies and "contextrender" in policies:
        cells = [ratio(*(r and r["p50"] for r in (render.get(("learned", n)), render.get(("contextrender", n))))) for n in sizes]
        print("\n`learned` p50 as a ratio to `contextrender` (target ≤ 2×): " + ", ".join(
            f"{n:,} results {c}" for n, c in zip(sizes, cells)))
    if first:
        print("\n### First render of a session reopened from the SQLite store (CPU ms)\n")
        print("Reopened after a render stored its derived rows (as after a restart), medians of 3 reopens (first / warm: "
              "the median of the per-reopen ratios); `snapshots 15 % behind`: reopened when the stored per-graph snapshots "
              "are those of the session at 85 % of its results; right of the bar, the same session reopened before any "
              "render of the policy had stored its rows.\n")
        print("| policy | results | load graph | first render | warm render | first / warm | snapshots 15 % behind: first, "
              "first / warm | load + first | first / prune first | not rendered before: load + first | writing its rows |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for (name, n), r in first.items():
            ref = first.get(("prune", n))
            print(f"| {name} | {n:,} | {r['load']:.1f} | {r['first']:.1f} | {r['warm']:.2f} | {r['ratio']:.1f}× | "
                  f"{r['behind']:.1f}, {r['behind_ratio']:.1f}× | "
                  f"{r['load'] + r['first']:.1f} | {ratio(r['first'], ref and ref['first'])} | "
                  f"{r['cold_load']:.1f} + {r['cold']:.1f} | {r['write']:.1f} |")
    if append:
        ref = render.get(("prune", 1000)) or render.get(("prune", sizes[-1]))
        print("\n### Append one event (CPU ms; ratio to a prune render at "
              f"{1000 if ('prune', 1000) in render else sizes[-1]:,} results)\n")
        print("| where | " + " | ".join(f"{n:,} messages" for n in sorted({n for _, n in append})) + " |")
        print("|---|" + "---:|" * len({n for _, n in append}))
        for kind in ("sqlite", "graph"):
            cells = [f"{append[(kind, n)]['p50']:.3f} ({append[(kind, n)]['p95']:.3f}) · {ratio(append[(kind, n)]['p50'], ref and ref['p50'])}"
                     for n in sorted({n for _, n in append})]
            print(f"| {kind} | " + " | ".join(cells) + " |")
    report_proxy(proxy)
    if replay:
        ref = render.get(("prune", 1000))
        print("\n### Replay of the traces (contextrender, prune, full, --jobs 2)\n")
        print("| run | wall s | CPU s (all processes) | CPU as prune renders at 1,000 results |")
        print("|---|---:|---:|---:|")
        for kind, r in replay.items():
            print(f"| {kind} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {ratio(r['cpu_s'] * 1000, ref and ref['p50'])} |")


def report_proxy(proxy: dict) -> None:
    if not proxy:
        return
    print(f"\n### Proxy, 200-message histories ({os.cpu_count()} CPUs; client, proxy and fake provider on them; "
          f"phases of bench/proxy_latency.py)\n")
    print("requests/s and CPU: saturated phase (no pause between requests). Latency: client-side, paced phase "
          "(the think time between an answer and the next request); added = through the proxy − direct.\n")
    print("| policy | workers | sessions | requests/s | proxy CPU ms/request | client / fake provider CPU ms/request | think ms | "
          "e2e p50 ms | e2e p95 ms | direct p50 | direct p95 | added p50 | added p95 | X-…-Proxy-Ms p50 | first request p50 ms | req/s vs prune |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, w, n), r in proxy.items():
        ref = proxy.get(("prune", w, n))
        print(f"| {name} | {w} | {n} | {r['rps']:.1f} | {r['cpu_ms']:.1f} | {r['client_cpu_ms']:.1f} / {r['upstream_cpu_ms']:.1f} | "
              f"{r['think_ms']:.0f} | {r['e2e_p50']:.1f} | "
              f"{r['e2e_p95']:.1f} | {r['direct_p50']:.1f} | {r['direct_p95']:.1f} | {r['e2e_p50'] - r['direct_p50']:.1f} | "
              f"{r['e2e_p95'] - r['direct_p95']:.1f} | {r['hdr_p50']:.1f} | {r['first_p50']:.1f} | {ratio(r['rps'], ref and ref['rps'])} |")


def main() -> None:
    ap = argparse.ArgumentParser(description="historygraph speed table (see module docstring).")
    ap.add_argument("--quick", action="store_true", help="50 and 1,000 results, fewer repeats, proxy at 1 and 10, no replay")
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    ap.add_argument("--policy", action="append", help=f"policies to render (default: {', '.join(POLICIES)})")
    ap.add_argument("--no-proxy", action="store_true")
    ap.add_argument("--no-replay", action="store_true")
    ap.add_argument("--proxy-only", action="store_true", help="only the proxy rows (no render, first-render, append, replay)")
    ap.add_argument("--first-only", action="store_true", help="only the first-render rows")
    ap.add_argument("--no-gc", action="store_true", help="the cyclic garbage collector off (its full collections, "
                    "over the whole heap of this process, otherwise land in whichever render runs then)")
    ap.add_argument("--first-limit", type=float, default=20.0, help="skip larger sizes of a policy whose first render "
                    "would take longer than this many CPU seconds")
    args = ap.parse_args()
    if args.no_gc:
        gc.disable()
    sizes = [50, 1000] if args.quick else [50, 200, 1000, 5000]
    args.repeats = 5 if args.quick else 15
    levels = {1: 10, 10: 4} if args.quick else {1: 20, 10: 8, 50: 4}
    workers = os.cpu_count() or 1
    # think times: 50 sessions offer the target load (prune 150 requests/s, contextrender 50)
    runs = [("prune", 1, 333.0, levels), ("prune", workers, 333.0, levels), ("contextrender", workers, 1000.0, levels)]
    if args.proxy_only:
        tmp = tempfile.mkdtemp(prefix="hg-bench-")
        proxy = bench_proxy(runs, tmp)
        report(None, {}, {}, {}, proxy, {}, [], [], args)
        return
    policies = args.policy or POLICIES
    if "prune" not in policies:
        policies = ["prune"] + policies
    if not args.traces.exists():
        raise SystemExit(f"{args.traces}: no traces (the bench builds its sessions from real mini-swe-agent results)")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "historygraph-bench" / "embeddings.sqlite"
    signals = Signals(store=open_store(str(cache)))
    pool = StepPool(args.traces)
    print(f"warming embeddings ({pool.unique_results} results; cache {cache}) ...", file=sys.stderr, flush=True)
    warm_embeddings(pool, signals)
    tmp = tempfile.mkdtemp(prefix="hg-bench-")
    if args.first_only:
        first_pol = [p for p in FIRST if p in policies]
        first = bench_first(pool, signals, first_pol, [1000] if args.quick else [1000, 5000], tmp, {}, warm_memos=True)
        report(pool, {}, first, {}, {}, {}, [], [], args)
        return
    render = bench_render(pool, signals, policies, sizes, args.repeats, args.first_limit)
    first_pol = [p for p in FIRST if p in policies]
    first = bench_first(pool, signals, first_pol, [1000] if args.quick else [1000, 5000], tmp, render)
    append = bench_append(pool, [100, 1000, 10000], tmp, 20 if args.quick else 100)
    proxy = {} if args.no_proxy else bench_proxy(runs, tmp)
    replay = {} if args.no_replay or args.quick else bench_replay(args.traces, tmp)
    report(pool, render, first, append, proxy, replay, policies, sizes, args)


if __name__ == "__main__":
    main()
