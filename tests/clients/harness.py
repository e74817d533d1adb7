"""The ``clients`` tests' harness: the fake provider (``tests/fake_upstream.py``, scripted models
of ``tests/fake_scripts.py``), ``historygraph serve`` in front of it at a budget B, and the tap
(``tests/clients/tap.py``) in front of the proxy, each a real process on a free loopback port; and
the checks every client's run must pass (:meth:`Stack.check`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from fake_scripts import MARK, expected_output
from test_server import _port as port, _start

REPO = Path(__file__).resolve().parents[2]
SRC = str(REPO / "src")
FAKE = str(REPO / "tests" / "fake_upstream.py")
TAP = str(Path(__file__).resolve().parent / "tap.py")
CLIENTS = REPO / ".clients"
TOKEN = "clients-test-token"
INSTALL = "bash scripts/install-clients.sh"


def need(path: Path, what: str) -> Path:
    """``path`` of an installed client, or skip naming the install script."""
    if not path.exists():
        pytest.skip(f"{what} is not installed ({path} is missing): run `{INSTALL}`")
    return path


def need_module(name: str) -> None:
    pytest.importorskip(name, reason=f"{name} is not installed in this environment (pip install -e '.[test]')")


def _text(content: Any) -> str:
    """The text of a message's or a result's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(p.get("text", p.get("content", p.get("output", "")))) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def gemini_messages(contents: list[Any]) -> list[dict[str, Any]]:
    """A Gemini request's ``contents`` as Chat Completions messages (a model turn's calls with ids
    by place, each ``functionResponse`` a tool message answering the call of its name), for the
    checks below."""
    out: list[dict[str, Any]] = []
    open_calls: dict[str, str] = {}
    for i, c in enumerate(contents):
        parts = c.get("parts") or []
        if c.get("role") == "model":
            calls = [p["functionCall"] for p in parts if "functionCall" in p]
            open_calls = {f["name"]: f"g{i}-{k}" for k, f in enumerate(calls)}
            out.append({"role": "assistant", "content": "".join(p.get("text", "") for p in parts if not p.get("thought")),
                        "tool_calls": [{"id": f"g{i}-{k}", "function": {"name": f["name"], "arguments": json.dumps(f.get("args") or {})}}
                                       for k, f in enumerate(calls)]})
            continue
        for p in parts:
            if "functionResponse" in p:
                r = p["functionResponse"]
                response = r.get("response") or {}
                text = response["output"] if isinstance(response.get("output"), str) else json.dumps(response)
                out.append({"role": "tool", "tool_call_id": open_calls.get(r.get("name"), "?"), "content": text})
        texts = [p["text"] for p in parts if "text" in p]
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def newest_results(body: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(the call's arguments or the assistant's text, the result's text or ``None`` when missing)
    for each result answering the newest assistant turn of one forwarded request: the tool results
    after the last call (Chat Completions, Messages, Responses), or, when the newest assistant turn
    made no call, the user message after it (text protocols: mini-swe-agent's text mode, aider)."""
    if isinstance(body.get("contents"), list):
        body = {"messages": gemini_messages(body["contents"])}
    items = body.get("messages") if "messages" in body else body.get("input")
    turns = [m for m in items if isinstance(m, dict) and m.get("role") != "system"] if isinstance(items, list) else []
    last = max((i for i, m in enumerate(turns) if m.get("role") == "assistant" or m.get("type") in ("function_call", "custom_tool_call")), default=None)
    if last is None or last == len(turns) - 1:
        return []
    a, after = turns[last], turns[last + 1:]
    calls: dict[str, str] = {}
    for m in turns[:last + 1]:  # Chat Completions calls, Anthropic tool_use blocks, Responses call items
        for c in m.get("tool_calls") or []:
            calls[c.get("id")] = c.get("function", {}).get("arguments", "")
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                calls[b.get("id")] = json.dumps(b.get("input"))
        if m.get("type") in ("function_call", "custom_tool_call"):
            calls[m.get("call_id")] = m.get("arguments", m.get("input", ""))
    newest = [c.get("id") for c in a.get("tool_calls") or []]
    newest += [b.get("id") for b in (a.get("content") if isinstance(a.get("content"), list) else []) if isinstance(b, dict) and b.get("type") == "tool_use"]
    newest += [m.get("call_id") for m in turns[:last + 1][::-1][:1] if m.get("type") in ("function_call", "custom_tool_call")]
    got: dict[str, str] = {}
    for m in after:
        if m.get("role") == "tool":
            got[m.get("tool_call_id")] = _text(m.get("content"))
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                got[b.get("tool_use_id")] = _text(b.get("content"))
        if m.get("type") in ("function_call_output", "custom_tool_call_output"):
            got[m.get("call_id")] = _text(m.get("output"))
    if newest:
        return [(calls.get(i, ""), got.get(i)) for i in newest]
    return [(_text(a.get("content")), _text(after[0].get("content")) if after[0].get("role") == "user" else None)]


def result_problems(body: dict[str, Any]) -> tuple[list[str], int]:
    """What is wrong with the newest results of one forwarded request (missing, or not the complete
    output of the scripted command: a placeholder or an excerpt), and how many were checked."""
    problems, checked = [], 0
    for call, result in newest_results(body):
        if result is None:
            problems.append(f"no result for the newest call {call[:120]!r}")
            continue
        steps = [int(k) for k in MARK.findall(call) if "STEP-" in call]
        for k in steps[:1]:
            checked += 1
            marker, numbers = expected_output(k).split("\n")  # each whole (a client may JSON-encode the output)
            if marker not in result or numbers not in result:
                problems.append(f"step {k}'s output is not complete in the forwarded result: {result[:200]!r}")
    return problems, checked


def client_history_tokens(body: dict[str, Any]) -> int:
    """About the tokens a client's request holds beyond its system prompt: its messages' (or
    input items') JSON but the system ones, o200k_base (a Gemini request's ``contents``)."""
    from historygraph import TokenCounter

    if isinstance(body.get("contents"), list):
        return TokenCounter().count(json.dumps(body["contents"]))
    items = body.get("messages") if "messages" in body else body.get("input")
    items = [m for m in items if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))] if isinstance(items, list) else [items]
    return TokenCounter().count(json.dumps(items))


@dataclass
class Stack:
    """One fake provider, one proxy at budget B, one tap; ``url`` is what a client points at."""

    budget: int
    fake: str
    proxy: str
    url: str
    log: Path
    procs: list[subprocess.Popen]

    def reset(self) -> None:
        httpx.post(self.fake + "/_reset")
        httpx.post(self.url + "/_tap/reset")
        self._before = self.sessions()

    def sessions(self) -> dict[str, int]:
        r = httpx.get(self.proxy + "/api/sessions", headers={"Authorization": f"Bearer {TOKEN}"})
        r.raise_for_status()
        return {s["id"]: s["events"] for s in r.json()}

    def check(self, min_results: int = 3, api: str | None = None, over_b: bool = True) -> dict[str, Any]:
        """The run's verdict: no request the fake rejected by the provider's rules, no 4xx/5xx from
        the proxy (any route), a session stored or grown, and in every forwarded request the newest
        results complete; at least ``min_results`` of them checked (the script ran its steps); at
        B = 3000 (``over_b``) the client's last request held more history than B, so the proxy had
        to leave something out."""
        rejected = httpx.get(self.fake + "/_rejections").json()
        assert rejected == [], f"the fake provider rejected {len(rejected)} forwarded request(s): {[r['error'] for r in rejected][:3]}"
        tapped = httpx.get(self.url + "/_tap").json()
        failed = [t for t in tapped if t["status"] >= 400]
        assert failed == [], f"the proxy answered {len(failed)} of {len(tapped)} request(s) with an error: {failed[:3]}"
        forwarded = httpx.get(self.fake + "/_requests").json()
        if api:
            forwarded = [f for f in forwarded if f["path"] == api]
        assert forwarded, f"nothing reached the fake provider (tap saw {tapped[:5]})"
        problems, checked = [], 0
        for n, f in enumerate(forwarded):
            p, c = result_problems(f["body"])
            problems += [f"request {n + 1} of {len(forwarded)}: {x}" for x in p]
            checked += c
        assert problems == [], "\n".join(problems[:5])
        assert checked >= min_results, f"only {checked} newest results checked in {len(forwarded)} forwarded requests (the agent stopped early?)"
        sent = [t["request"] for t in tapped if t.get("request") and (api is None or t["path"] == api)]
        history = client_history_tokens(sent[-1]) if sent else 0
        if self.budget == 3000 and over_b:
            assert history > self.budget, f"the client's last request holds {history} history tokens, not over B = {self.budget}"
        after = self.sessions()
        grown = {s: e for s, e in after.items() if e > self._before.get(s, 0)}
        assert grown, f"no session stored or grown (sessions: {after})"
        return {"forwarded": len(forwarded), "checked": checked, "sessions": grown, "tapped": tapped, "history": history}


def renders(stack: Stack, sessions: Any) -> list[tuple[int, int]]:
    """(history tokens the client sent, history tokens forwarded) of each request the proxy rendered
    for one of ``sessions``, in order, from its log's ``rendered`` lines (its own token counts)."""
    line = re.compile(r" rendered session=(\S+) .*?history_tokens_in=(\d+) history_tokens_out=(\d+)")
    found = [line.search(x) for x in stack.log.read_text().splitlines()]
    return [(int(m.group(2)), int(m.group(3))) for m in found if m and m.group(1) in sessions]


def within_budget(stack: Stack, sessions: Any) -> list[tuple[int, int]]:
    """Every request of ``sessions`` whose history exceeds B forwarded within B; at B = 3000 at
    least one did (the proxy had to leave something out). The renders, for the test to report."""
    seen = renders(stack, sessions)
    assert seen, f"no rendered request logged for {sorted(sessions)} in {stack.log}"
    over = [(i, o) for i, o in seen if i > stack.budget]
    assert all(o <= stack.budget for _, o in over), f"history forwarded over B = {stack.budget}: {over}"
    if stack.budget == 3000:
        assert over, f"no request's history exceeded B = {stack.budget}: {seen}"
    return seen


@contextmanager
def known_bugs(stack: Stack, bugs: dict[str, str]) -> Iterator[None]:
    """A failure inside is an expected failure (xfail) when the proxy's error answers or the fake's
    rejections contain one of ``bugs``' keys (a proxy bug, named by its value); any other failure
    stays a failure, and a run that passes passes (so the test counts as soon as the bug is fixed)."""
    try:
        yield
    except (AssertionError, subprocess.TimeoutExpired):
        seen = json.dumps(httpx.get(stack.url + "/_tap").json()) + json.dumps([r["error"] for r in httpx.get(stack.fake + "/_rejections").json()])
        for pattern, reason in bugs.items():
            if pattern in seen:
                pytest.xfail(reason)
        raise


def launch(budget: int, tmp: Path) -> Stack:
    fp, pp, tp = port(), port(), port()
    procs = [_start([FAKE, "--port", str(fp)], fp, tmp / "fake.log", timeout=90)]
    try:
        procs.append(_start(["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{fp}/v1", "--anthropic-upstream",
                             f"http://127.0.0.1:{fp}", "--gemini-upstream", f"http://127.0.0.1:{fp}", "--port", str(pp), "--store", str(tmp / "proxy.sqlite"), "--budget", str(budget),
                             "--auth-token", TOKEN, "--log-format", "text"], pp, tmp / "proxy.log", timeout=90))
        procs.append(_start([TAP, "--port", str(tp), "--to", f"http://127.0.0.1:{pp}"], tp, tmp / "tap.log", probe="/_tap", timeout=90))
    except Exception:
        for p in procs:
            p.kill()
        raise
    return Stack(budget, f"http://127.0.0.1:{fp}", f"http://127.0.0.1:{pp}", f"http://127.0.0.1:{tp}", tmp / "proxy.log", procs)


def stop(stack: Stack) -> None:
    for p in stack.procs[::-1]:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a client program to its end; its output is shown when it fails."""
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd[0]} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc
