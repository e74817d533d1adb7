"""Throughput and client-side latency of the proxy at 1, 10 and 50 concurrent sessions with
200-message histories, and the CPU each process spends per request.

Set-up: the fake provider (``tests/fake_upstream.py --lean``: the same rule check and answers as
the tests' fake, as a bare ASGI app that keeps no bodies) and ``historygraph serve`` run as
separate processes on loopback; the load generator is a third (aiohttp on uvloop), all on the
same cores. The harness is kept lean so that it takes little of the CPU the proxy needs: each
session holds its own keep-alive connection (as an agent process does; with ``--workers`` the
connection, and so the session, stays with one worker) and keeps its history as the JSON bytes
of each message, encoded once when the message is added, so a request body is one join of bytes.
Each session starts with a 200-message history (system, task, 99 tool steps whose results are
about 150–600 tokens, far over the budget so the policy has to select) and then runs agent steps,
each re-sending the whole history plus the previous answer and a new tool result or user message,
as a real client does (OpenAI Chat Completions, non-streamed). Per level, four phases
(:func:`level`):

* **seed**: each session's first request (stores its 200 messages; ``first`` = its
  ``X-HistoryGraph-Proxy-Ms``);
* **saturated**: ``--requests`` steps per session with no pause: ``requests/s`` (steady-state
  throughput, what the machine sustains with client, proxy and provider on it) and the CPU per
  request of each process over that phase: the proxy's process tree (``proxy_cpu_ms``), the
  client (``client_cpu_ms``) and the fake provider (``upstream_cpu_ms``);
* **paced**: ``--requests`` more steps, each session waiting ``--think-ms`` between an answer and
  its next request (an agent waits for its model and tools; 333 ms at 50 sessions offers 150
  requests/s): client-side latency p50/p95, clock started before the request is written and
  stopped when the whole answer is read;
* **direct**: fresh sessions paced the same, sent straight to the fake provider: the latency
  without the proxy. Added latency = through the proxy − direct, at the same percentile.

Every answer must be 200: the fake answers 400 to a request the provider would reject, and the
run stops there.

Usage: ``python bench/proxy_latency.py [--policy prune] [--budget 6000] [--requests 10]
[--think-ms 333] [--workers 1] [--store PATH_OR_URL] [--levels 1,10,50] [--serve-arg=--embedder=static]``.
Prints a table; numbers depend on the machine (CPU count and load average are printed).
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
from typing import Any, Callable

import aiohttp
import httpx
import msgspec

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
FAKE = str(ROOT / "tests" / "fake_upstream.py")
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]
_encode, _decode = msgspec.json.Encoder().encode, msgspec.json.Decoder().decode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args: list[str], port: int, log: Path, ready: str = "/openapi.json") -> subprocess.Popen:
    """Start ``python *args`` and wait until ``GET ready`` on ``port`` answers."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1)
            return proc
        except httpx.HTTPError:
            if proc.poll() is not None:
                raise SystemExit(f"{args[:3]} failed: {log.read_text()}") from None
            time.sleep(0.1)
    raise SystemExit(f"{args[:3]} did not start")


def start_upstream(port: int, log: Path) -> subprocess.Popen:
    """The lean fake provider (``tests/fake_upstream.py --lean``) on ``port``."""
    return start([FAKE, "--port", str(port), "--lean"], port, log, ready="/_requests")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its children (psutil)."""
    import psutil

    p = psutil.Process(pid)
    total = 0.0
    for q in [p] + p.children(recursive=True):
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


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
    (after a tool call) or user message (after a text answer), as an agent does, over its own
    keep-alive connection. The history is kept as each message's JSON bytes (encoded once)."""

    def __init__(self, sid: int, tag: str) -> None:
        self.sid, self.steps = sid, 0
        self.parts = [_encode(m) for m in history(sid)]
        self.head = b'{"model":"m","tools":' + _encode(TOOLS) + b',"messages":['
        self.headers = {"X-HistoryGraph-Session": f"bench-{tag}-{sid}", "Authorization": "Bearer sk-bench",
                        "Content-Type": "application/json"}
        self.http: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()

    async def step(self, base: str) -> tuple[float, dict[str, Any], dict[str, str]]:
        """One request; returns (client-side latency in ms, the answer's JSON, its headers)."""
        if self.http is None:
            self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=aiohttp.ClientTimeout(total=600))
        body = self.head + b",".join(self.parts) + b"]}"
        for attempt in range(2):  # retry a keep-alive connection the server dropped meanwhile, once
            try:
                t0 = time.perf_counter()
                async with self.http.post(base + "/chat/completions", data=body, headers=self.headers) as r:
                    content = await r.read()
                ms = (time.perf_counter() - t0) * 1000
                break
            except aiohttp.ClientConnectionError:
                if attempt:
                    raise
        if r.status != 200:
            raise SystemExit(f"session {self.sid} step {self.steps}: {base} answered {r.status}: {content[:2000]!r}")
        msg = _decode(content)["choices"][0]["message"]
        self.parts.append(_encode({k: v for k, v in msg.items() if v is not None}))
        if msg.get("tool_calls"):
            self.parts.append(_encode({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                                       "content": f"output of step {self.steps} in session {self.sid}\n" * 20}))
        else:
            self.parts.append(_encode({"role": "user", "content": f"Continue with step {self.steps}."}))
        self.steps += 1
        return ms, msg, dict(r.headers)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def _phase(agents: list[Agent], base: str, requests: int, think_s: float,
                 lat: list[float], hdr: list[float] | None = None) -> None:
    async def run(a: Agent) -> None:
        if think_s:
            await asyncio.sleep(random.random() * think_s)  # spread the sessions over one think time
        for _ in range(requests):
            ms, _, headers = await a.step(base)
            lat.append(ms)
            if hdr is not None:
                hdr.append(float(headers["x-historygraph-proxy-ms"]))
            if think_s:
                await asyncio.sleep(think_s)
    await asyncio.gather(*(run(a) for a in agents))


async def level(n: int, requests: int, think_ms: float, proxy: str, direct: str,
                cpu: Callable[[], float] | None = None, upstream_cpu: Callable[[], float] | None = None) -> dict:
    """One concurrency level of ``n`` sessions, in four phases (see module docstring): seed (each
    session's first request, storing its 200 messages), saturated (``requests`` steps per
    session, no pause: throughput and CPU per request of the proxy (``cpu``: its CPU seconds so
    far), the client (this process) and the provider (``upstream_cpu``)), paced (``requests``
    more steps, ``think_ms`` between an answer and the next request: client-side latency) and
    direct (fresh sessions, paced the same, sent straight to the provider)."""
    tag = f"{n}-{time.time_ns()}"
    out: dict = {"first": [], "sat": [], "paced": [], "hdr": [], "direct": []}
    nan = lambda: float("nan")
    cpu, upstream_cpu = cpu or nan, upstream_cpu or nan
    agents = [Agent(i, tag) for i in range(n)]
    direct_agents = [Agent(i, tag + "-direct") for i in range(n)]
    try:
        seed_hdr: list[float] = []
        await _phase(agents, proxy, 1, 0.0, out["first"], seed_hdr)
        c0, u0, k0, w0 = cpu(), upstream_cpu(), time.process_time(), time.perf_counter()
        await _phase(agents, proxy, requests, 0.0, out["sat"])
        out["wall_s"] = time.perf_counter() - w0
        out["cpu_s"], out["upstream_cpu_s"], out["client_cpu_s"] = cpu() - c0, upstream_cpu() - u0, time.process_time() - k0
        out["count"] = n * requests
        await _phase(agents, proxy, requests, think_ms / 1000, out["paced"], out["hdr"])
        await _phase(direct_agents, direct, requests, think_ms / 1000, out["direct"])
    finally:
        for a in agents + direct_agents:
            await a.close()
    async with aiohttp.ClientSession() as http:
        async with http.get(direct.removesuffix("/v1") + "/_rejections") as r:
            rejected = await r.json()
        if rejected:
            raise SystemExit(f"the fake provider rejected {len(rejected)} forwarded requests: {rejected[0]['error']}")
        await http.post(direct.removesuffix("/v1") + "/_reset")
    out["rps"] = out["count"] / out["wall_s"]
    for k in ("cpu", "upstream_cpu", "client_cpu"):
        out[k + "_ms"] = out[k + "_s"] * 1000 / out["count"]
    return out


def run_level(*args: Any, **kwargs: Any) -> dict:
    """:func:`level` on a uvloop event loop (the client's own CPU stays small)."""
    import uvloop

    return uvloop.run(level(*args, **kwargs))


def serve_args(up_port: int, px_port: int, store: str, policy: str, budget: int, workers: int, extra: list[str]) -> list[str]:
    return ["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--port", str(px_port),
            "--store", store, "--policy", policy, "--budget", str(budget), "--workers", str(workers), *extra]


def main() -> None:
    ap = argparse.ArgumentParser(description="Proxy throughput and added latency (see module docstring).")
    ap.add_argument("--policy", default="prune")
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--requests", type=int, default=10, help="steady-state requests per session and phase")
    ap.add_argument("--think-ms", type=float, default=333.0, help="pause between an answer and the next request (paced phase)")
    ap.add_argument("--levels", default="1,10,50")
    ap.add_argument("--workers", type=int, default=1, help="historygraph serve --workers")
    ap.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    ap.add_argument("--serve-arg", action="append", default=[], help="one more argument for historygraph serve (repeatable)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hg-bench-")
    up_port, px_port = free_port(), free_port()
    procs = [start_upstream(up_port, Path(tmp, "upstream.log"))]
    try:
        procs.append(start(serve_args(up_port, px_port, args.store or f"{tmp}/bench.sqlite", args.policy, args.budget,
                                      args.workers, args.serve_arg), px_port, Path(tmp, "proxy.log")))
        if args.workers > 1:
            time.sleep(5)  # the supervisor answers once one worker is up; let the others start
        print(f"proxy: policy {args.policy}, B = {args.budget}, {args.workers} workers, 200-message histories, "
              f"{args.requests} requests per session and phase, think {args.think_ms:g} ms, {os.cpu_count()} CPUs, "
              f"store {args.store or 'SQLite'}, load average {os.getloadavg()[0]:.1f}")
        print(f"{'sessions':>8} {'req/s':>7} {'proxy CPU ms':>12} {'client CPU':>10} {'fake CPU':>8} {'e2e p50':>8} {'e2e p95':>8} "
              f"{'direct p50':>10} {'direct p95':>10} {'hdr p50':>8} {'first p50':>9}")
        for n in (int(x) for x in args.levels.split(",")):
            r = run_level(n, args.requests, args.think_ms, f"http://127.0.0.1:{px_port}/v1", f"http://127.0.0.1:{up_port}/v1",
                          cpu=lambda: tree_cpu(procs[1].pid), upstream_cpu=lambda: tree_cpu(procs[0].pid))
            print(f"{n:>8} {r['rps']:>7.1f} {r['cpu_ms']:>12.2f} {r['client_cpu_ms']:>10.2f} {r['upstream_cpu_ms']:>8.2f} "
                  f"{statistics.median(r['paced']):>8.1f} {pct(r['paced'], 0.95):>8.1f} "
                  f"{statistics.median(r['direct']):>10.1f} {pct(r['direct'], 0.95):>10.1f} "
                  f"{statistics.median(r['hdr']):>8.1f} {statistics.median(r['first']):>9.1f}", flush=True)
    except (httpx.HTTPError, aiohttp.ClientError, SystemExit):
        print(f"failed; server logs in {tmp}", file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
