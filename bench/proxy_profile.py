"""Where the proxy's CPU goes per request: the request path in one process, profiled.

The app (:func:`historygraph.server.app.create_app`) is driven in-process through
``httpx.ASGITransport``; its upstream client is replaced by an ``httpx.MockTransport`` answering
as ``tests/fake_upstream.py`` does (a tool call after a user message, else a text answer), so the
CPU measured is the proxy's request path plus the in-process client's share (reported apart:
the same requests sent to a bare ASGI app that only reads the body and answers). Thread-pool
work runs inline here (``run_in_threadpool`` is replaced by a direct call) so that cProfile sees
it. Sessions are ``bench/proxy_latency.py``'s 200-message histories; each runs ``--requests``
steady-state agent steps after its first request (which stores the 200 messages).

Usage: ``python bench/proxy_profile.py [--policy prune] [--sessions 20] [--requests 10] [--top 30]
[--api openai|anthropic] [--breakdown] [--logs] [--default-gc]``. Prints CPU ms per steady-state request (``time.process_time``) and the
functions with the largest cumulative time; ``--breakdown`` instead times the stages of the
request path without a profiler (each stage's CPU ms per request, ``time.thread_time`` around
the functions listed in :data:`STAGES`; the rest is the HTTP framework, the in-process client
and the mock provider); ``--logs`` writes the proxy's JSON log records to a null stream, as a
deployment writes them to stderr (without it they are filtered out by level).
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
from historygraph.server import chat, messages, proxy as proxy_mod, responses  # noqa: E402
from historygraph.server.config import ServerConfig  # noqa: E402
from historygraph.providers import jsonio
from historygraph.history import sessions  # noqa: E402

STAGES = [  # (stage, object, attribute): the functions of the request path timed by --breakdown
    ("read and parse the body", proxy_mod.Proxy, "read_json"),
    ("route and store new messages", sessions.SessionRouter, "ingest"),
    ("policy render", None, "render"),  # the policy instance's render, patched once it exists
    ("check_invariants", proxy_mod, "check_invariants"),
    ("metrics of the render", proxy_mod.ProxyMetrics, "observe_render"),
    ("encode the forwarded body", jsonio, "dumps"),
    ("upstream call (httpx, less the mock provider)", "client", "send"),
    ("store the answer", proxy_mod.Proxy, "store_answer"),
    ("usage and calibration", proxy_mod.Proxy, "observe_usage"),
    ("after the response (prefetch)", proxy_mod.Proxy, "prefetch"),
]


class Breakdown:
    """CPU seconds (``time.thread_time``) per stage, outermost calls only (a stage called inside
    another counts once, in the outer one)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {name: 0.0 for name, _, _ in STAGES}
        self.depth = 0
        self.on = False
        self.mock = 0.0
        self.embed = 0.0  # sentence embedding (the model), counted in the stage that asked for it
        self.texts = 0
        self.gc = 0.0  # the cyclic garbage collector, counted apart from the stage it interrupted
        self._gc0 = 0.0
        import gc

        def collecting(phase, info):
            if phase == "start":
                self._gc0 = time.thread_time()
            elif self.on:
                self.gc += time.thread_time() - self._gc0
        gc.callbacks.append(collecting)

    def wrap(self, name: str, fn):
        import functools
        import inspect

        def enter():
            self.depth += 1
            return time.thread_time() if self.on and self.depth == 1 else None

        def leave(t0):
            self.depth -= 1
            if t0 is not None:
                self.cpu[name] += time.thread_time() - t0

        if inspect.iscoroutinefunction(fn):  # its awaits run nothing else here (one request at a time)
            @functools.wraps(fn)
            async def awrapped(*a, **k):
                t0 = enter()
                try:
                    return await fn(*a, **k)
                finally:
                    leave(t0)
            return awrapped

        @functools.wraps(fn)
        def wrapped(*a, **k):
            t0 = enter()
            try:
                return fn(*a, **k)
            finally:
                leave(t0)
        return wrapped

    def install(self, proxy, policy: str) -> None:
        for name, obj, attr in STAGES:
            if obj is None:
                pol = proxy.policy(policy)
                pol.render = self.wrap(name, pol.render)
            elif obj == "client":
                continue  # below, with the mock provider
            else:
                setattr(obj, attr, self.wrap(name, getattr(obj, attr)))
        from historygraph.signals import embeddings

        def timed_model(model):
            def embed(emb, texts):  # the model's own work, at any depth (inside a render or a prefetch)
                t0 = time.thread_time()
                try:
                    return model(emb, texts)
                finally:
                    if self.on:
                        self.embed += time.thread_time() - t0
                        self.texts += len(texts)
            return embed
        for cls in (embeddings.MiniLMEmbedder, getattr(embeddings, "StaticEmbedder", None)):
            if cls is not None:
                cls.embed = timed_model(cls.embed)
        mock = upstream

        def timed(request):  # the mock provider's own work, at any depth, is not the proxy's
            t0 = time.thread_time()
            try:
                return mock(request)
            finally:
                if self.on:
                    self.mock += time.thread_time() - t0
        proxy.transport = httpx.MockTransport(timed)
        proxy.transport.handle_async_request = self.wrap("upstream call (httpx, less the mock provider)",  # type: ignore[method-assign]
                                                         proxy.transport.handle_async_request)


def upstream(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/messages"):
        return anthropic_upstream(request)
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


def anthropic_upstream(request: httpx.Request) -> httpx.Response:
    """As ``tests/fake_upstream.py`` answers the Messages API (without its thinking block)."""
    body = json.loads(request.content)
    last = body["messages"][-1]
    n = upstream.count = getattr(upstream, "count", 0) + 1
    tool_result = isinstance(last["content"], list) and any(b.get("type") == "tool_result" for b in last["content"])
    content: list = [{"type": "text", "text": f"answer {n}"}]
    if body.get("tools") and not tool_result:
        content = [{"type": "tool_use", "id": f"toolu_{n}", "name": "bash", "input": {"q": str(n)}}]
    return httpx.Response(200, json={"id": f"m{n}", "type": "message", "role": "assistant", "model": "m", "content": content,
                                     "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}})


def anthropic_turns(msgs: list[dict]) -> tuple[str, list[dict]]:
    """``pl.history``'s OpenAI messages as the Messages API's system and turns."""
    turns: list[dict] = []
    for m in msgs[1:]:
        if m["role"] == "assistant":
            turns.append({"role": "assistant", "content": [{"type": "text", "text": m["content"]}] + [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": json.loads(c["function"]["arguments"])}
                for c in m.get("tool_calls") or []]})
        elif m["role"] == "tool":
            turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]})
        else:
            turns.append({"role": "user", "content": m["content"]})
    return msgs[0]["content"], turns


async def inline(fn, *args, **kwargs):
    return fn(*args, **kwargs)


async def drive(app, sessions: int, requests: int, profiler: cProfile.Profile | None,
                breakdown: Breakdown | None = None, api: str = "openai") -> tuple[float, int]:
    """Round-robin over sessions; returns (CPU seconds of the steady-state requests, their count)."""
    if api == "anthropic":
        return await drive_anthropic(app, sessions, requests, breakdown)
    histories = {s: pl.history(s) for s in range(sessions)}
    cpu, count = 0.0, 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
        for step in range(requests + 1):
            for s, msgs in histories.items():
                body = {"model": "m", "messages": msgs, "tools": pl.TOOLS}
                c0 = time.process_time()
                if step and profiler:
                    profiler.enable()
                if breakdown:
                    breakdown.on = bool(step)
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


async def drive_anthropic(app, sessions: int, requests: int, breakdown: Breakdown | None) -> tuple[float, int]:
    """:func:`drive` for the Messages API endpoint (``/v1/messages``)."""
    histories = {s: anthropic_turns(pl.history(s)) for s in range(sessions)}
    tools = [{"name": "bash", "input_schema": {"type": "object", "properties": {}}}]
    cpu, count = 0.0, 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as client:
        for step in range(requests + 1):
            for s, (system, turns) in histories.items():
                body = {"model": "m", "system": system, "messages": turns, "tools": tools, "max_tokens": 100}
                c0 = time.process_time()
                if breakdown:
                    breakdown.on = bool(step)
                r = await client.post("/v1/messages", json=body, headers={"X-HistoryGraph-Session": f"a-{s}"})
                if step:
                    cpu += time.process_time() - c0
                    count += 1
                r.raise_for_status()
                content = r.json()["content"]
                turns.append({"role": "assistant", "content": content})
                if content[0]["type"] == "tool_use":
                    turns.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": content[0]["id"],
                                                               "content": f"output of step {step}\n" * 20}]})
                else:
                    turns.append({"role": "user", "content": f"Continue with step {step}."})
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
    ap.add_argument("--api", choices=["openai", "anthropic"], default="openai",
                    help="the endpoint: /v1/chat/completions or /v1/messages (the same histories as turns)")
    ap.add_argument("--breakdown", action="store_true", help="CPU per stage of the request path, no profiler")
    ap.add_argument("--default-gc", action="store_true", help="CPython's collector settings, not serve's (tune_gc)")
    ap.add_argument("--logs", action="store_true", help="log records written (to a null stream), as in a deployment")
    args = ap.parse_args()
    if args.logs:
        import io

        from historygraph.server.logs import configure

        class Null(io.TextIOBase):
            def write(self, s: str) -> int:
                return len(s)
        configure("INFO", stream=Null())
    tmp = tempfile.mkdtemp(prefix="hg-profile-")
    config = ServerConfig(upstream="http://upstream/v1", store=f"{tmp}/p.sqlite", policy=args.policy, budget=args.budget)
    app = app_mod.create_app(config)
    if not args.default_gc:
        app_mod.tune_gc()  # as historygraph serve does
    proxy = app.state.proxy
    proxy.transport = httpx.MockTransport(upstream)
    for mod in (proxy_mod, chat, messages, responses):  # every module that hands work to the pool
        mod.run_in_threadpool = inline
    profiler = None if args.no_profile or args.breakdown else cProfile.Profile()
    breakdown = None
    if args.breakdown:
        breakdown = Breakdown()
        breakdown.install(proxy, args.policy)
    cpu, count = asyncio.run(drive(app, args.sessions, args.requests, profiler, breakdown, args.api))
    client = asyncio.run(bare_client_cost(args.sessions, min(args.requests, 3)))
    print(f"policy {args.policy}, {args.api} API: {count} steady-state requests, {cpu * 1000 / count:.2f} CPU ms per request "
          f"(in-process client's share about {client:.2f} ms{', profiler on' if profiler else ''})")
    if breakdown:
        breakdown.cpu["upstream call (httpx, less the mock provider)"] -= breakdown.mock
        print("| stage | CPU ms per request | share |\n|---|---:|---:|")
        for name, sec in breakdown.cpu.items():
            print(f"| {name} | {sec * 1000 / count:.2f} | {sec / cpu:.0%} |")
        rest = cpu - sum(breakdown.cpu.values()) - breakdown.mock
        print(f"| (of the stages above: embedding, {breakdown.texts / count:.2f} texts per request) | "
              f"{breakdown.embed * 1000 / count:.2f} | {breakdown.embed / cpu:.0%} |")
        print(f"| (of the stages above: the garbage collector) | {breakdown.gc * 1000 / count:.2f} | {breakdown.gc / cpu:.0%} |")
        print(f"| (the mock provider, not the proxy) | {breakdown.mock * 1000 / count:.2f} | {breakdown.mock / cpu:.0%} |")
        print(f"| rest (HTTP framework, in-process client) | {rest * 1000 / count:.2f} | {rest / cpu:.0%} |")
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
