"""Throughput and client-side latency of the proxy at 1, 10 and 50 concurrent sessions with
200-message histories.

Set-up: the recording fake provider (``tests/fake_upstream.py``, answering at once) and
``historygraph serve`` run as separate processes on loopback; the load generator is a third
(asyncio + httpx), all on the same cores. Each session starts with a 200-message history
(system, task, 99 tool steps whose results are about 150–600 tokens, far over the budget so the
policy has to select) and then runs agent steps, each re-sending the whole history plus the
previous answer and a new tool result or user message, as a real client does (OpenAI Chat
Completions, non-streamed). Per level, four phases (:func:`level`):

* **seed**: each session's first request (stores its 200 messages; ``first`` = its
  ``X-HistoryGraph-Proxy-Ms``);
* **saturated**: ``--requests`` steps per session with no pause: ``requests/s`` (steady-state
  throughput, what the machine sustains with client, proxy and provider on it) and the proxy's
  CPU ms per request when a CPU probe is given (``bench/run.py`` passes one);
* **paced**: ``--requests`` more steps, each session waiting ``--think-ms`` between an answer and
  its next request (an agent waits for its model and tools; 333 ms at 50 sessions offers 150
  requests/s): client-side latency p50/p95, clock started before the request is sent;
* **direct**: fresh sessions paced the same, sent straight to the fake provider: the latency
  without the proxy. Added latency = through the proxy − direct, at the same percentile.

Usage: ``python bench/proxy_latency.py [--policy prune] [--budget 6000] [--requests 10]
[--think-ms 333] [--workers 1] [--store PATH_OR_URL]``. Prints a table; numbers depend on the
machine (CPU count is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import httpx

SRC = str(Path(__file__).resolve().parents[1] / "src")
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1)
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise SystemExit(f"{args[:3]} failed: {log.read_text()}") from None
            time.sleep(0.1)
    raise SystemExit(f"{args[:3]} did not start")


def history(sid: int) -> list[dict]:
    """200 events: system, task, then 99 (assistant tool call, tool result) steps. The results'
    texts are the same in every session (only the task and the call ids differ), so the
    embedding cache of a policy that embeds results is filled by the first session's first
    request; every later result is unique to its session (:meth:`Agent.step`)."""
    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"Fix bug {sid} in the parser."}]
    for i in range(99):
        cid = f"s{sid}c{i}"
        msgs.append({"role": "assistant", "content": f"Step {i}: look at file {i}.",
                     "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": f'{{"cmd": "cat f{i}.py"}}'}}]})
        body = "\n".join(f"def fn_{i}_{k}(x): return x * {k}  # line {k}" for k in range(10 + (i * 37) % 40))
        msgs.append({"role": "tool", "tool_call_id": cid, "content": body})
    assert len(msgs) == 200
    return msgs


class Agent:
    """One session's client: re-sends its whole history plus each answer and a new tool result
    (after a tool call) or user message (after a text answer), as an agent does."""

    def __init__(self, sid: int, tag: str) -> None:
        self.sid, self.msgs, self.steps = sid, history(sid), 0
        self.headers = {"X-HistoryGraph-Session": f"bench-{tag}-{sid}", "Authorization": "Bearer sk-bench"}

    async def step(self, client: httpx.AsyncClient, base: str) -> tuple[float, httpx.Response]:
        """One request; returns (client-side latency in ms, response)."""
        body = {"model": "m", "messages": self.msgs, "tools": TOOLS}
        for attempt in range(2):  # retry a keep-alive connection the server dropped meanwhile, once
            try:
                t0 = time.perf_counter()
                r = await client.post(base + "/chat/completions", json=body, headers=self.headers)
                ms = (time.perf_counter() - t0) * 1000
                break
            except httpx.TransportError:
                if attempt:
                    raise
        if r.status_code != 200:
            raise SystemExit(f"session {self.sid} step {self.steps}: {base} answered {r.status_code}: {r.text}")
        msg = r.json()["choices"][0]["message"]
        self.msgs.append({k: v for k, v in msg.items() if v is not None})
        if msg.get("tool_calls"):
            self.msgs.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                              "content": f"output of step {self.steps} in session {self.sid}\n" * 20})
        else:
            self.msgs.append({"role": "user", "content": f"Continue with step {self.steps}."})
        self.steps += 1
        return ms, r


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def _phase(agents: list[Agent], client: httpx.AsyncClient, base: str, requests: int, think_s: float,
                 lat: list[float], hdr: list[float] | None = None) -> None:
    async def run(a: Agent) -> None:
        if think_s:
            await asyncio.sleep(random.random() * think_s)  # spread the sessions over one think time
        for _ in range(requests):
            ms, r = await a.step(client, base)
            lat.append(ms)
            if hdr is not None:
                hdr.append(float(r.headers["x-historygraph-proxy-ms"]))
            if think_s:
                await asyncio.sleep(think_s)
    await asyncio.gather(*(run(a) for a in agents))


async def level(n: int, requests: int, think_ms: float, proxy: str, direct: str,
                cpu: Callable[[], float] | None = None) -> dict:
    """One concurrency level of ``n`` sessions, in four phases (see module docstring): seed (each
    session's first request, storing its 200 messages), saturated (``requests`` steps per
    session, no pause: throughput and the proxy's CPU per request), paced (``requests`` more
    steps, ``think_ms`` between an answer and the next request: client-side latency) and direct
    (fresh sessions, paced the same, sent straight to the provider)."""
    tag = f"{n}-{time.time_ns()}"
    out: dict = {"first": [], "sat": [], "paced": [], "hdr": [], "direct": []}
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        agents = [Agent(i, tag) for i in range(n)]
        seed_hdr: list[float] = []
        await _phase(agents, client, proxy, 1, 0.0, out["first"], seed_hdr)
        c0, w0 = (cpu() if cpu else 0.0), time.perf_counter()
        await _phase(agents, client, proxy, requests, 0.0, out["sat"])
        out["wall_s"], out["cpu_s"] = time.perf_counter() - w0, (cpu() - c0 if cpu else float("nan"))
        out["count"] = n * requests
        await _phase(agents, client, proxy, requests, think_ms / 1000, out["paced"], out["hdr"])
        await _phase([Agent(i, tag + "-direct") for i in range(n)], client, direct, requests, think_ms / 1000, out["direct"])
        await client.post(direct.removesuffix("/v1") + "/_reset")  # the fake keeps every body it received
    out["rps"] = out["count"] / out["wall_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Proxy throughput and added latency (see module docstring).")
    ap.add_argument("--policy", default="prune")
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--requests", type=int, default=10, help="steady-state requests per session and phase")
    ap.add_argument("--think-ms", type=float, default=333.0, help="pause between an answer and the next request (paced phase)")
    ap.add_argument("--levels", default="1,10,50")
    ap.add_argument("--workers", type=int, default=1, help="historygraph serve --workers")
    ap.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hg-bench-")
    up_port, px_port = free_port(), free_port()
    procs = [start([str(Path(__file__).resolve().parents[1] / "tests" / "fake_upstream.py"), "--port", str(up_port)], up_port, Path(tmp, "upstream.log"))]
    try:
        procs.append(start(["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--port", str(px_port),
                            "--store", args.store or f"{tmp}/bench.sqlite", "--policy", args.policy, "--budget", str(args.budget),
                            "--workers", str(args.workers)], px_port, Path(tmp, "proxy.log")))
        print(f"proxy: policy {args.policy}, B = {args.budget}, {args.workers} workers, 200-message histories, "
              f"{args.requests} requests per session and phase, think {args.think_ms:g} ms, {os.cpu_count()} CPUs, "
              f"store {args.store or 'SQLite'}")
        print(f"{'sessions':>8} {'req/s':>7} {'e2e p50':>8} {'e2e p95':>8} {'direct p50':>10} {'direct p95':>10} "
              f"{'hdr p50':>8} {'first p50':>9}")
        for n in (int(x) for x in args.levels.split(",")):
            r = asyncio.run(level(n, args.requests, args.think_ms, f"http://127.0.0.1:{px_port}/v1", f"http://127.0.0.1:{up_port}/v1"))
            print(f"{n:>8} {r['rps']:>7.1f} {statistics.median(r['paced']):>8.1f} {pct(r['paced'], 0.95):>8.1f} "
                  f"{statistics.median(r['direct']):>10.1f} {pct(r['direct'], 0.95):>10.1f} "
                  f"{statistics.median(r['hdr']):>8.1f} {statistics.median(r['first']):>9.1f}", flush=True)
    except (httpx.HTTPError, SystemExit):
        print(f"failed; server logs in {tmp}", file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
