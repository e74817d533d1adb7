"""Latency the proxy adds per request, at 1, 10 and 50 concurrent sessions with 200-event histories.

Set-up: the recording fake provider (``tests/fake_upstream.py``) and ``historygraph
serve`` run as separate processes on loopback; the load generator is a third (asyncio + httpx).
Each session starts with a 200-event history (system, task, 99 tool steps whose results are
about 150–600 tokens, far over the budget so the policy has to select) and then runs ``--requests``
agent steps, each re-sending the whole history plus the previous answer and a new tool result or
user message, as a real client does (OpenAI Chat Completions, non-streamed).

Reported per concurrency level, over the steady-state requests (the first request of each session,
which stores all 200 events, is reported separately):

* ``proxy ms``: the proxy's own time per request excluding the upstream call, from its
  ``X-HistoryGraph-Proxy-Ms`` header (parse, diff, store, render, invariant check, forward, store
  the answer; includes waiting for the proxy's CPU under concurrency);
* ``e2e ms``: client-observed latency through the proxy, and ``direct ms`` the same requests sent
  straight to the fake provider, for scale.

Usage: ``python bench/proxy_latency.py [--policy prune] [--budget 6000] [--requests 20]
[--store PATH_OR_URL]``. Prints a table; numbers depend on the machine (CPU count is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    """200 events: system, task, then 99 (assistant tool call, tool result) steps."""
    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"Fix bug {sid} in the parser."}]
    for i in range(99):
        cid = f"s{sid}c{i}"
        msgs.append({"role": "assistant", "content": f"Step {i}: look at file {i}.",
                     "tool_calls": [{"id": cid, "type": "function", "function": {"name": "bash", "arguments": f'{{"cmd": "cat f{i}.py"}}'}}]})
        body = "\n".join(f"def fn_{sid}_{i}_{k}(x): return x * {k}  # line {k}" for k in range(10 + (i * 37) % 40))
        msgs.append({"role": "tool", "tool_call_id": cid, "content": body})
    assert len(msgs) == 200
    return msgs


async def run_session(client: httpx.AsyncClient, base: str, sid: int, requests: int, direct: str, out: dict) -> None:
    msgs = history(sid)
    headers = {"X-HistoryGraph-Session": f"bench-{out['tag']}-{sid}", "Authorization": "Bearer sk-bench"}
    for step in range(requests + 1):
        body = {"model": "m", "messages": msgs, "tools": TOOLS}
        t0 = time.perf_counter()
        r = await client.post(base + "/chat/completions", json=body, headers=headers)
        e2e = (time.perf_counter() - t0) * 1000
        if r.status_code != 200:
            raise SystemExit(f"session {sid} step {step}: proxy answered {r.status_code}: {r.text}")
        for attempt in range(2):  # the direct call is only a reference: retry a dropped keep-alive connection once
            try:
                t0 = time.perf_counter()
                (await client.post(direct + "/chat/completions", json=body)).raise_for_status()
                out["direct"].append((time.perf_counter() - t0) * 1000)
                break
            except httpx.TransportError:
                if attempt:
                    raise
        key = "first" if step == 0 else "proxy"
        out[key].append(float(r.headers["x-historygraph-proxy-ms"]))
        if step:
            out["e2e"].append(e2e)
        msg = r.json()["choices"][0]["message"]
        msgs.append({k: v for k, v in msg.items() if v is not None})
        if msg.get("tool_calls"):
            msgs.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"output of step {step}\n" * 20})
        else:
            msgs.append({"role": "user", "content": f"Continue with step {step}."})


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def level(n: int, args: argparse.Namespace, proxy: str, direct: str) -> dict:
    out: dict = {"tag": f"{n}-{time.time_ns()}", "proxy": [], "first": [], "e2e": [], "direct": []}
    # idle connections are dropped before uvicorn's 5 s keep-alive timeout closes them under us
    limits = httpx.Limits(max_connections=2 * n + 10, max_keepalive_connections=2 * n + 10, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        await asyncio.gather(*(run_session(client, proxy, i, args.requests, direct, out) for i in range(n)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Proxy added latency (see module docstring).")
    ap.add_argument("--policy", default="prune")
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--requests", type=int, default=20, help="steady-state requests per session")
    ap.add_argument("--levels", default="1,10,50")
    ap.add_argument("--store", default=None, help="store URL (default: a fresh SQLite file)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hg-bench-")
    up_port, px_port = free_port(), free_port()
    procs = [start([str(Path(__file__).resolve().parents[1] / "tests" / "fake_upstream.py"), "--port", str(up_port)], up_port, Path(tmp, "upstream.log"))]
    try:
        procs.append(start(["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--port", str(px_port),
                            "--store", args.store or f"{tmp}/bench.sqlite", "--policy", args.policy, "--budget", str(args.budget)],
                           px_port, Path(tmp, "proxy.log")))
        print(f"proxy latency: policy {args.policy}, B = {args.budget}, 200-event histories, {args.requests} steady-state "
              f"requests per session, {os.cpu_count()} CPUs, store {args.store or 'SQLite'}")
        print(f"{'sessions':>8} {'requests':>8} {'proxy ms p50':>12} {'proxy ms p95':>12} {'first req p50':>13} "
              f"{'e2e ms p50':>10} {'e2e ms p95':>10} {'direct ms p50':>13}")
        for n in (int(x) for x in args.levels.split(",")):
            r = asyncio.run(level(n, args, f"http://127.0.0.1:{px_port}/v1", f"http://127.0.0.1:{up_port}/v1"))
            print(f"{n:>8} {len(r['proxy']):>8} {statistics.median(r['proxy']):>12.1f} {pct(r['proxy'], 0.95):>12.1f} "
                  f"{statistics.median(r['first']):>13.1f} {statistics.median(r['e2e']):>10.1f} {pct(r['e2e'], 0.95):>10.1f} "
                  f"{statistics.median(r['direct']):>13.1f}", flush=True)
    except (httpx.HTTPError, SystemExit):
        print(f"failed; server logs in {tmp}", file=sys.stderr)
        raise
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
