"""Where the proxy's CPU goes per request: the request path in one process, profiled.

The app (:func:`historygraph.server.app.create_app`) is driven in-process through
``httpx.ASGITransport``; its upstream client is replaced by an ``httpx.MockTransport`` answering
as ``tests/fake_upstream.py`` does (a tool call after a user message, else a text answer), so the
CPU measured is the proxy's request path plus the in-process client's share (reported apart:
the same requests sent to a bare ASGI app that only reads the body and answers). Thread-pool
work runs inline here (``run_in_threadpool`` is replaced by a direct call) so that cProfile sees
it. Sessions are ``bench/proxy_latency.py``'s 200-message histories; each runs ``--requests``
steady-state agent steps after its first request (which stores the 200 messages).

Usage: ``python bench/proxy_profile.py [--policy prune] [--sessions 20] [--requests 10] [--top 30]``.
Prints CPU ms per steady-state request (``time.process_time``) and the functions with the largest
cumulative time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import proxy_latency as pl  # noqa: E402

from historygraph.server import app as app_mod  # noqa: E402


def upstream(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    last = body["messages"][-1]
    n = upstream.count = getattr(upstream, "count", 0) + 1
    msg: dict = {"role": "assistant", "content": f"answer {n}"}
    if body.get("tools") and last.get("role") == "user":
        msg = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"q": str(n)})}}]}
    return httpx.Response(200, json={"id": f"c{n}", "object": "chat.completion", "model": "m", "created": 0,
                                     "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


async def inline(fn, *args, **kwargs):
    return fn(*args, **kwargs)


async def drive(app, sessions: int, requests: int, profiler: cProfile.Profile | None) -> tuple[float, int]:
    """Round-robin over sessions; returns (CPU seconds of the steady-state requests, their count)."""
    histories = {s: pl.history(s) for s in range(sessions)}
    cpu, count = 0.0, 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
        for step in range(requests + 1):
            for s, msgs in histories.items():
                body = {"model": "m", "messages": msgs, "tools": pl.TOOLS}
                c0 = time.process_time()
                if step and profiler:
                    profiler.enable()
                r = await client.post("/v1/chat/completions", json=body, headers={"X-HistoryGraph-Session": f"p-{s}"})
                if step and profiler:
                    profiler.disable()
                if step:
                    cpu += time.process_time() - c0
                    count += 1
                r.raise_for_status()
                msg = r.json()["choices"][0]["message"]
                msgs.append({k: v for k, v in msg.items() if v is not None})
                if msg.get("tool_calls"):
                    msgs.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"output of step {step}\n" * 20})
                else:
                    msgs.append({"role": "user", "content": f"Continue with step {step}."})
    return cpu, count


async def bare_client_cost(sessions: int, requests: int) -> float:
    """CPU ms per request of the in-process client alone (a bare ASGI app that reads the body)."""
    async def bare(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"choices": [{"message": {"role": "assistant", "content": "a"}}]}'})
    msgs = pl.history(0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=bare), base_url="http://proxy") as client:
        c0 = time.process_time()
        for _ in range(sessions * requests):
            await client.post("/v1/chat/completions", json={"model": "m", "messages": msgs, "tools": pl.TOOLS})
        return (time.process_time() - c0) * 1000 / (sessions * requests)


def main() -> None:
    ap = argparse.ArgumentParser(description="Profile of the proxy's request path (see module docstring).")
    ap.add_argument("--policy", default="prune")
    ap.add_argument("--budget", type=int, default=6000)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--no-profile", action="store_true", help="only the CPU figure")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hg-profile-")
    config = app_mod.ServerConfig(upstream="http://upstream/v1", store=f"{tmp}/p.sqlite", policy=args.policy, budget=args.budget)
    app = app_mod.create_app(config)
    proxy = app.state.proxy
    proxy.client = httpx.AsyncClient(transport=httpx.MockTransport(upstream))
    app_mod.run_in_threadpool = inline
    profiler = None if args.no_profile else cProfile.Profile()
    cpu, count = asyncio.run(drive(app, args.sessions, args.requests, profiler))
    client = asyncio.run(bare_client_cost(args.sessions, min(args.requests, 3)))
    print(f"policy {args.policy}: {count} steady-state requests, {cpu * 1000 / count:.2f} CPU ms per request "
          f"(in-process client's share about {client:.2f} ms{', profiler on' if profiler else ''})")
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
