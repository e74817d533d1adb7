"""A scripted agent run through ``historygraph serve`` in front of the cache-simulating fake
(``tests/fake_upstream.py --prompt-cache``), and the input tokens the fake billed it: the figure of
docs/proxy.md, "Prompt caches" (``python tests/cache_run.py`` prints the table; the test is
tests/test_prompt_cache.py).

The client is mini-swe-agent-like: a system prompt of about 1,300 tokens, a task, one ``bash``
tool, and ``calls`` model calls; the scripted model (``script-<N>``, tests/fake_scripts.py) runs
``echo STEP-k; seq ...`` at each, whose output (about 450 tokens) the client sends back as the
result, with the model's turn as it came. ``client_breakpoints``: the client marks its system
prompt and its last message with ``cache_control`` itself, as Claude Code does (Anthropic only).
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from fake_scripts import expected_output
from test_server import _port, _start

HERE = Path(__file__).resolve().parent
FAKE = str(HERE / "fake_upstream.py")
SYSTEM = ("You are a helpful assistant that can interact with a computer shell to solve programming tasks. "
          + " ".join(f"Rule {i}: think step by step, run one command per turn, read its output carefully, and keep "
                     f"changes small and tested before moving on to the next part of the task." for i in range(40)))
TASK = "Run the numbered steps one by one, then submit."
A_TOOLS = [{"name": "bash", "description": "Run a shell command", "input_schema": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
O_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": A_TOOLS[0]["input_schema"]}}]
MARK = {"type": "ephemeral"}


@dataclass
class Billed:
    """Input tokens as the fake billed them, summed over a run's calls."""

    read: int = 0
    write: int = 0
    fresh: int = 0

    @property
    def total(self) -> int:
        return self.read + self.write + self.fresh

    @property
    def uncached(self) -> int:
        """What was not read from the cache (fresh input and cache writes)."""
        return self.write + self.fresh


@contextmanager
def stack(tmp: Path, *serve_args: str) -> Iterator[tuple[str, str]]:
    """The fake with ``--prompt-cache`` and one proxy in front of it; yields the proxy's URL and
    the fake's (a client sending its own requests, the proxy off)."""
    fp, pp = _port(), _port()
    procs: list[subprocess.Popen] = [_start([FAKE, "--port", str(fp), "--prompt-cache"], fp, tmp / "fake.log", timeout=90)]
    try:
        procs.append(_start(["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{fp}/v1", "--anthropic-upstream",
                             f"http://127.0.0.1:{fp}", "--port", str(pp), "--store", str(tmp / "proxy.sqlite"), *serve_args],
                            pp, tmp / "proxy.log", timeout=90))
        yield f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{fp}"
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def anthropic_run(url: str, session: str, calls: int, policy: str, budget: int, client_breakpoints: bool = False) -> Billed:
    """``calls`` Messages API calls of one session through the proxy at ``url``."""
    billed = Billed()
    msgs: list[dict] = [{"role": "user", "content": TASK}]
    system: object = [{"type": "text", "text": SYSTEM, "cache_control": MARK}] if client_breakpoints else SYSTEM
    headers = {"x-api-key": "sk-ant-dummy", "anthropic-version": "2023-06-01", "X-HistoryGraph-Session": session,
               "X-HistoryGraph-Policy": policy, "X-HistoryGraph-Budget": str(budget)}
    with httpx.Client(timeout=120) as http:
        for k in range(1, calls + 1):
            sent = [dict(m) for m in msgs]
            if client_breakpoints:  # the last block of the last message, as Claude Code marks it
                last = sent[-1]["content"]
                blocks = [{"type": "text", "text": last}] if isinstance(last, str) else list(last)
                sent[-1]["content"] = blocks[:-1] + [{**blocks[-1], "cache_control": MARK}]
            r = http.post(url + "/v1/messages", headers=headers, json={
                "model": f"{session}/script-{calls}", "max_tokens": 200, "system": system, "tools": A_TOOLS, "messages": sent})
            r.raise_for_status()
            answer = r.json()
            u = answer["usage"]
            billed.read += u["cache_read_input_tokens"]
            billed.write += u["cache_creation_input_tokens"]
            billed.fresh += u["input_tokens"]
            use = next(b for b in answer["content"] if b["type"] == "tool_use")
            msgs.append({"role": "assistant", "content": answer["content"]})
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": expected_output(k)}]})
    return billed


def openai_run(url: str, session: str, calls: int, policy: str, budget: int) -> Billed:
    """``calls`` Chat Completions calls of one session through the proxy at ``url``."""
    billed = Billed()
    msgs: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    headers = {"Authorization": "Bearer sk-dummy", "X-HistoryGraph-Session": session,
               "X-HistoryGraph-Policy": policy, "X-HistoryGraph-Budget": str(budget)}
    with httpx.Client(timeout=120) as http:
        for k in range(1, calls + 1):
            r = http.post(url + "/v1/chat/completions", headers=headers,
                          json={"model": f"{session}/script-{calls}", "tools": O_TOOLS, "messages": msgs})
            r.raise_for_status()
            answer = r.json()
            u = answer["usage"]
            cached = u["prompt_tokens_details"]["cached_tokens"]
            billed.read += cached
            billed.fresh += u["prompt_tokens"] - cached
            msg = answer["choices"][0]["message"]
            msgs.append({"role": "assistant", "content": msg.get("content"), "tool_calls": msg["tool_calls"]})
            msgs.append({"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": expected_output(k)})
    return billed


def main() -> None:
    """Print the table of docs/proxy.md, "Prompt caches" (25 calls, B = 6000)."""
    import tempfile

    calls, budget = int(sys.argv[1]) if len(sys.argv) > 1 else 25, 6000
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in (("plain", ("--no-cache-breakpoints", "--no-cache-stable")), ("breakpoints", ("--no-cache-stable",)), ("stable", ())):
            d = Path(tmp) / name
            d.mkdir()
            with stack(d, *args) as (url, _):
                for policy in ("full", "learned"):
                    if name == "stable" and policy == "full":
                        continue  # full is never wrapped
                    for client in ("anthropic", "anthropic+client-bp", "openai"):
                        sid = f"{name}-{policy}-{client}".replace("+", "-")
                        b = (openai_run(url, sid, calls, policy, budget) if client == "openai"
                             else anthropic_run(url, sid, calls, policy, budget, client.endswith("client-bp")))
                        rows.append((client, name, policy, b))
    print(f"{'client':22} {'proxy':12} {'policy':8} {'total':>8} {'read':>8} {'write':>8} {'fresh':>8} {'uncached':>8}")
    for client, name, policy, b in sorted(rows, key=lambda r: r[0]):
        print(f"{client:22} {name:12} {policy:8} {b.total:8} {b.read:8} {b.write:8} {b.fresh:8} {b.uncached:8}")


if __name__ == "__main__":
    main()
