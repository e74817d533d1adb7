"""The proxy, end to end: the official openai and anthropic clients talk to ``historygraph serve``
(a real process) in front of a recording fake provider (another real process)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit
from typing import TYPE_CHECKING

import httpx
import pytest

from historygraph import Message, Session, TokenCounter
from historygraph.history.sessions import derived_session_id

from fake_upstream import sign

# the official clients (openai, anthropic) are imported in the functions that use them: every test
# process collects this file, and importing both costs about 2 CPU s (docs/tests.md)
if TYPE_CHECKING:
    import openai

SRC = str(Path(__file__).resolve().parents[1] / "src")
FAKE = str(Path(__file__).resolve().parent / "fake_upstream.py")  # the rule-enforcing fake provider
BUDGET = 800
WORDS = 200  # a result of about 400 tokens: the newest fits in B, two do not
TOKEN = "test-token"
KEY = "sk-test-NEVER-STORE-1234"
TOOLS = [{"type": "function", "function": {"name": "search", "description": "find", "parameters": {"type": "object", "properties": {}}}}]
A_TOOLS = [{"name": "search", "description": "find", "input_schema": {"type": "object", "properties": {}}}]
counter = TokenCounter()


_PORTS = Path(tempfile.gettempdir()) / "historygraph-test-ports"  # ports handed out lately, by every test process


def _port() -> int:
    """A free local port no other test process (an xdist worker) was handed in the last 5 minutes: the
    OS hands a just-closed free port to whoever asks next, so two workers starting servers at the same
    time could pick the same one, one server failing to bind while the other answered its probe (a CI
    run's proxy fixture talked to another worker's fake)."""
    with _PORTS.open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        fh.seek(0)
        now = time.time()
        recent = {int(a) for a, _, t in (line.partition(" ") for line in fh.read().splitlines()) if t and now - float(t) < 300}
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in recent:
                fh.write(f"{port} {now}\n")
                return port


def _start(args: list[str], port: int, log: Path, probe: str = "/openapi.json", timeout: float = 60) -> subprocess.Popen:
    """``python ARGS`` with this checkout's source first on the path, once ``GET probe`` answers on
    ``port`` (within ``timeout`` seconds); its output goes to ``log``."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args} exited: {log.read_text()}")
        try:
            httpx.get(f"http://127.0.0.1:{port}{probe}", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args} did not start: {log.read_text()}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    up_port, px_port = _port(), _port()
    up = _start([FAKE, "--port", str(up_port)], up_port, tmp / "upstream.log")
    db = tmp / "proxy.sqlite"
    px = _start(["-m", "historygraph", "serve", "--upstream", f"http://127.0.0.1:{up_port}/v1", "--anthropic-upstream",
                 f"http://127.0.0.1:{up_port}", "--gemini-upstream", f"http://127.0.0.1:{up_port}", "--port", str(px_port), "--store", str(db), "--policy", "prune",
                 "--budget", str(BUDGET), "--auth-token", TOKEN, "--max-body-bytes", "200000"], px_port, tmp / "proxy.log")
    yield {"up": f"http://127.0.0.1:{up_port}", "px": f"http://127.0.0.1:{px_port}", "db": db, "log": tmp / "proxy.log"}
    for p in (px, up):
        p.terminate()
        p.wait(10)


def received(servers) -> dict:
    return httpx.get(servers["up"] + "/_requests").json()[-1]


def api(servers, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, servers["px"] + "/api" + path, headers={"Authorization": f"Bearer {TOKEN}"}, **kw)


def untimed(messages: list[dict]) -> list[dict]:
    """Stored messages without the time the proxy received them (``timestamp``)."""
    return [{k: v for k, v in m.items() if k != "timestamp"} for m in messages]


def oai(servers, session: str, **headers) -> openai.OpenAI:
    import openai

    return openai.OpenAI(base_url=servers["px"] + "/v1", api_key=KEY, max_retries=0,
                         default_headers={"X-HistoryGraph-Session": session, **headers})


def history(tag: str, n: int = 3, words: int = WORDS) -> list[dict]:
    """system, task, n tool steps with ~``words``-token results, then a new user question."""
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"task {tag}"}]
    for i in range(n):
        msgs.append({"role": "assistant", "content": None,
                     "tool_calls": [{"id": f"{tag}c{i}", "type": "function", "function": {"name": "search", "arguments": f'{{"i": {i}}}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"{tag}c{i}", "content": f"result{i} " * words})
    msgs.append({"role": "user", "content": "and now?"})
    return msgs


def assert_paired(msgs: list[dict]) -> None:
    """Each assistant tool call is followed by exactly its results, and each result has its call."""
    i = 0
    while i < len(msgs):
        m = msgs[i]
        assert m["role"] != "tool", f"result at {i} without a call"
        if m.get("tool_calls"):
            ids = sorted(c["id"] for c in m["tool_calls"])
            j = i + 1
            while j < len(msgs) and msgs[j]["role"] == "tool":
                j += 1
            assert sorted(r["tool_call_id"] for r in msgs[i + 1:j]) == ids
            i = j
        else:
            i += 1


def history_tokens(msgs: list[dict]) -> int:
    """Tokens charged to B: everything but system messages and the last user message."""
    last_user = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    return sum(counter.count_message(Message.from_openai(m)) for i, m in enumerate(msgs)
               if m["role"] != "system" and i != last_user)


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_history_rendered_under_budget_pairs_kept_answer_stored(servers, stream):
    sid = f"oai-{stream}"
    msgs = history(sid)
    assert history_tokens(msgs) > BUDGET  # the test needs an over-budget history
    client = oai(servers, sid)
    kw = dict(model="m", messages=msgs, tools=TOOLS, tool_choice="auto", extra_body={"x_unknown": {"a": [1]}})
    if stream:
        calls: dict[int, dict] = {}
        for chunk in client.chat.completions.create(stream=True, **kw):
            for tc in chunk.choices[0].delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
                slot["arguments"] += tc.function.arguments or ""
        answer = {"id": calls[0]["id"], "name": calls[0]["name"], "arguments": calls[0]["arguments"]}
    else:
        tc = client.chat.completions.create(**kw).choices[0].message.tool_calls[0]
        answer = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
    body = received(servers)["body"]
    sent = body["messages"]
    assert body["tools"] == TOOLS and body["tool_choice"] == "auto" and body["x_unknown"] == {"a": [1]}
    assert history_tokens(sent) <= BUDGET
    assert_paired(sent)
    results = {m["tool_call_id"]: m["content"] for m in sent if m["role"] == "tool"}
    assert results[f"{sid}c2"] == "result2 " * WORDS  # Prune keeps the newest result complete
    for old in (f"{sid}c0", f"{sid}c1"):
        assert results[old] != msgs[2 + 2 * int(old[-1]) + 1]["content"] and old in results[old]  # placeholder naming it
    assert sent[0] == msgs[0] and sent[-1] == msgs[-1]
    stored = api(servers, "GET", f"/sessions/{sid}").json()["messages"]
    assert len(stored) == len(msgs) + 1
    assert [m["content"] for m in stored[:-1]] == [m["content"] or "" for m in msgs]  # complete, nothing lost
    assert stored[-1]["tool_calls"] == [{"id": answer["id"], "type": "function",
                                         "function": {"name": "search", "arguments": answer["arguments"]}}]
    assert json.loads(answer["arguments"]) == {"q": str(len(httpx.get(servers["up"] + "/_requests").json()))}


def test_resent_history_stores_only_new_events_and_an_edit_forks(servers):
    client = oai(servers, "resend")
    msgs = [{"role": "developer", "content": "be kind"}, {"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model="m", messages=msgs).choices[0].message
    assert received(servers)["body"]["messages"][0] == {"role": "developer", "content": "be kind"}
    msgs += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "more"}]
    client.chat.completions.create(model="m", messages=msgs)
    stored = api(servers, "GET", "/sessions/resend").json()["messages"]
    assert [m["content"] for m in stored] == ["be kind", "hello", first.content, "more", stored[-1]["content"]]
    assert stored[-1]["content"].startswith("answer ")
    edited = [*msgs[:3], {"role": "user", "content": "EDITED"}]
    resp = client.chat.completions.with_raw_response.create(model="m", messages=edited)
    assert resp.headers["x-historygraph-session"] == "resend~1"
    assert len(api(servers, "GET", "/sessions/resend").json()["messages"]) == 5  # never overwritten
    branch = api(servers, "GET", "/sessions/resend~1").json()
    assert branch["meta"] == {"parent": "resend", "forked_at": 3}
    assert [m["content"] for m in branch["messages"][:4]] == ["be kind", "hello", first.content, "EDITED"]
    listed = {s["id"]: s for s in api(servers, "GET", "/sessions").json()}
    assert listed["resend~1"]["parent"] == "resend" and listed["resend"]["events"] == 5


def test_session_without_header_is_derived_from_the_first_messages(servers):
    import openai

    client = openai.OpenAI(base_url=servers["px"] + "/v1", api_key=KEY, max_retries=0)
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "derive me"}]
    expect = "auto-" + hashlib.sha256(json.dumps([{"content": "S", "role": "system"}, {"content": "derive me", "role": "user"}],
                                                 sort_keys=True).encode()).hexdigest()[:16]
    assert derived_session_id([Message.from_openai(m) for m in msgs]) == expect
    r1 = client.chat.completions.with_raw_response.create(model="m", messages=msgs)
    a = r1.parse().choices[0].message.content
    r2 = client.chat.completions.with_raw_response.create(
        model="m", messages=msgs + [{"role": "assistant", "content": a}, {"role": "user", "content": "next"}])
    assert r1.headers["x-historygraph-session"] == r2.headers["x-historygraph-session"] == expect
    assert len(api(servers, "GET", f"/sessions/{expect}").json()["messages"]) == 5


def test_upstream_error_is_returned_unchanged_and_the_session_stays_consistent(servers):
    import anthropic
    import openai

    client = oai(servers, "err")
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.RateLimitError) as exc:
        client.chat.completions.create(model="error-model", messages=msgs)
    assert exc.value.status_code == 429 and exc.value.body == {"message": "fake upstream: rate limit reached",
                                                               "type": "rate_limit_error", "code": "rate_limited"}
    assert exc.value.response.headers["x-fake"] == "1"
    with pytest.raises(openai.RateLimitError):  # the client retries the same request
        client.chat.completions.create(model="error-model", messages=msgs)
    assert untimed(api(servers, "GET", "/sessions/err").json()["messages"]) == [{"role": "user", "content": "hi"}]
    client.chat.completions.create(model="m", messages=msgs)
    assert [m["role"] for m in api(servers, "GET", "/sessions/err").json()["messages"]] == ["user", "assistant"]
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0, default_headers={"X-HistoryGraph-Session": "aerr"})
    with pytest.raises(anthropic.APIStatusError) as aexc:
        a.messages.create(model="error-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert aexc.value.status_code == 529 and aexc.value.body["error"]["message"] == "fake upstream: overloaded"


def test_stream_is_relayed_chunk_by_chunk(servers):
    client = oai(servers, "slow")
    t0 = time.perf_counter()
    arrivals = [time.perf_counter() - t0 for _ in client.chat.completions.create(
        model="slow-model", messages=[{"role": "user", "content": "go"}], stream=True)]
    # the fake upstream waits 0.4 s between its 6 events: a buffering proxy would deliver them together
    assert arrivals[-1] - arrivals[0] > 1.2
    assert api(servers, "GET", "/sessions/slow").json()["messages"][-1]["content"].startswith("answer ")


@pytest.mark.parametrize("recall", ["off", "on"])
def test_streamed_answers_carry_the_proxy_time_header(servers, recall):
    """Issue 50: ``X-HistoryGraph-Proxy-Ms`` was missing on streamed answers. It is set before the
    stream starts: the proxy's own time until the upstream request that is relayed was sent (the
    slow model's 2.4 s of events are not in it), with and without the recall tool."""
    sid = f"ms-{recall}"
    body = {"model": "slow-model", "messages": history(sid), "tools": TOOLS, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}", "X-HistoryGraph-Session": sid, "X-HistoryGraph-Recall": recall}
    with httpx.stream("POST", servers["px"] + "/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        r.read()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-historygraph-omitted"] != "0"  # the rendering omitted results: the recall tool was offered
    assert 0 <= float(r.headers["x-historygraph-proxy-ms"]) < 1000


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_client_thinking_byte_exact_tools_paired_answer_stored(servers, stream):
    import anthropic

    sid = f"anth-{stream}"
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0, default_headers={"X-HistoryGraph-Session": sid})
    thinking = {"type": "thinking", "thinking": "weird ✓ \u2028 text", "signature": sign("weird ✓ \u2028 text")}
    msgs: list[dict] = [{"role": "user", "content": f"task {sid}"}]
    for i in range(3):
        msgs.append({"role": "assistant", "content": [thinking, {"type": "text", "text": f"step {i}"},
                                                      {"type": "tool_use", "id": f"{sid}t{i}", "name": "search", "input": {"i": i}}]})
        msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"{sid}t{i}", "content": f"res{i} " * WORDS}]})
    msgs.append({"role": "user", "content": "summarise"})
    kw = dict(model="m", max_tokens=50, system="Be brief.", messages=msgs, tools=A_TOOLS, metadata={"user_id": "u1"})
    if stream:
        with a.messages.stream(**kw) as s:
            final = s.get_final_message()
    else:
        final = a.messages.create(**kw)
    tool_use = final.content[-1]
    assert final.content[0].type == "thinking" and tool_use.type == "tool_use"
    body = received(servers)["body"]
    # the proxy's two prompt-cache breakpoints: end of the system prompt, last block of the last message
    mark = {"cache_control": {"type": "ephemeral"}}
    assert body["system"] == [{"type": "text", "text": "Be brief.", **mark}]
    assert body["tools"] == A_TOOLS and body["metadata"] == {"user_id": "u1"}
    sent = body["messages"]
    assert sent[-1] == {"role": "user", "content": [{"type": "text", "text": "summarise", **mark}]}
    assert all(m["content"][0] == thinking for m in sent if m["role"] == "assistant")
    # cache-stable rendering (the proxy's default) re-selects at 0.75·B = 600 tokens: prune keeps step 0
    # behind a placeholder and drops step 1 (messages #4–#5) behind a dropped-step marker
    assert [m for m in sent if m["role"] == "assistant"] == [msgs[1], msgs[5]]
    assert {"role": "user", "content": "[omitted: messages #4\u2013#5, tool calls: 1; stored in full, restore by message number]"} in sent
    results = [b for m in sent if isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result"]
    assert [b["tool_use_id"] for b in results] == [f"{sid}t0", f"{sid}t2"]
    assert results[1]["content"] == "res2 " * WORDS and results[0]["content"].startswith(f"[tool result {sid}t0 omitted")
    for k, m in enumerate(sent):  # every tool_use is answered in the next turn
        uses = [b["id"] for b in m["content"] if isinstance(m["content"], list) and b.get("type") == "tool_use"]
        if uses:
            assert [b["tool_use_id"] for b in sent[k + 1]["content"] if b.get("type") == "tool_result"] == uses
    stored = untimed(api(servers, "GET", f"/sessions/{sid}").json()["messages"])
    assert stored[0] == {"role": "system", "content": "Be brief."}
    assert stored[-1]["tool_calls"] == [{"id": tool_use.id, "type": "function",
                                         "function": {"name": "search", "arguments": json.dumps(tool_use.input)}}]
    assert api(servers, "GET", f"/sessions/{sid}/results/{sid}t0").json()["content"] == "res0 " * WORDS


def test_session_api_append_render_result_and_auth(servers):
    assert httpx.get(servers["px"] + "/api/sessions").status_code == 401
    assert httpx.get(servers["px"] + "/api/sessions", headers={"Authorization": "Bearer wrong"}).status_code == 401
    msgs = history("api", n=3)
    r = api(servers, "POST", "/sessions/api-s/events", json={"messages": msgs, "create": True})
    assert r.json() == {"positions": list(range(len(msgs)))}
    bad = api(servers, "POST", "/sessions/api-s/events", json={"messages": [{"role": "tool", "tool_call_id": "nope", "content": ""}]})
    assert bad.status_code == 400 and "nope" in bad.json()["detail"]
    r = api(servers, "POST", "/sessions/api-s/render", json={"policy": "prune", "budget": BUDGET}).json()
    assert r["selected_ids"] == ["apic2"] and r["omitted_ids"] == ["apic0", "apic1"]
    assert r["history_tokens"] == history_tokens(r["messages"]) <= BUDGET
    assert r["reasons"][str(r["selected"][0])].startswith("kept")
    assert api(servers, "GET", "/sessions/api-s/results/apic0").json() == {
        "id": "apic0", "position": 3, "name": None, "content": "result0 " * WORDS, "media": []}
    assert api(servers, "GET", "/sessions/api-s/results/zzz").status_code == 404
    assert "policy" in api(servers, "POST", "/sessions/api-s/render", json={"policy": "nope"}).json()["detail"]
    assert api(servers, "POST", "/sessions/api-s/render", json={"budget": 0}).status_code == 422
    assert "budget" in api(servers, "POST", "/sessions/api-s/render", json={"budget": 5}).json()["detail"]
    paths = httpx.get(servers["px"] + "/openapi.json").json()["paths"]
    assert {"/api/sessions", "/api/sessions/{session_id}/render", "/api/sessions/{session_id}/events",
            "/api/sessions/{session_id}/results/{tool_call_id}", "/v1/chat/completions", "/v1/messages"} <= set(paths)


@pytest.mark.parametrize("policy, tag", [("contextrender", "cr"), ("learned", "lr")])
def test_policy_by_header(servers, policy, tag):
    client = oai(servers, tag, **{"X-HistoryGraph-Policy": policy, "X-HistoryGraph-Budget": "700"})
    msgs = history(tag)
    client.chat.completions.create(model="m", messages=msgs)
    sent = received(servers)["body"]["messages"]
    assert history_tokens(sent) <= 700 < history_tokens(msgs)
    assert_paired(sent)


def test_the_oracle_is_refused_by_header(servers):
    import openai

    with pytest.raises(openai.BadRequestError, match="recorded future"):
        oai(servers, "or", **{"X-HistoryGraph-Policy": "oracle"}).chat.completions.create(model="m", messages=history("or"))


def test_bad_requests_get_clear_4xx_errors(servers):
    import openai

    client = oai(servers, "bad")
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]"):
        client.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="X-HistoryGraph-Budget"):
        oai(servers, "bad", **{"X-HistoryGraph-Budget": "lots"}).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="unknown tool_call_id 'ghost'"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "ghost", "content": ""}])
    with pytest.raises(openai.APIStatusError, match="size limit of 200000 bytes") as exc:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 300_000}])
    assert exc.value.status_code == 413
    # the Gemini API's 413 for a declared Content-Length is in Google's error shape
    big = httpx.post(servers["px"] + "/v1beta/models/m:generateContent", content=b"x" * 300_000,
                     headers={"content-type": "application/json", "x-goog-api-key": "k"})
    assert big.status_code == 413 and big.json()["error"]["status"] == "INVALID_ARGUMENT" and big.json()["error"]["code"] == 413
    r = httpx.post(servers["px"] + "/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_models_pass_through_and_keys_are_forwarded_never_stored(servers):
    # one request of each API first: the test must not rely on others of this module having run
    # in the same process before it (pytest-xdist spreads them over workers, each with its servers)
    import anthropic
    import openai

    oai(servers, "keys").chat.completions.create(model="m", messages=[{"role": "user", "content": "keys"}])
    anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0, default_headers={"X-HistoryGraph-Session": "keys-a"}) \
        .messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "keys"}])
    models = openai.OpenAI(base_url=servers["px"] + "/v1", api_key=KEY).models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    seen = httpx.get(servers["up"] + "/_requests").json()
    headers = [r["headers"] for r in seen]
    assert any(h.get("authorization") == f"Bearer {KEY}" for r in seen if r["path"] == "/v1/chat/completions" for h in [r["headers"]])
    assert any(KEY in v for r in seen if r["path"] == "/v1/messages" for v in r["headers"].values())  # x-api-key or bearer
    assert not any(k.startswith("x-historygraph") for h in headers for k in h)
    for f in servers["db"].parent.iterdir():  # database, WAL and the proxy's log
        assert KEY.encode() not in f.read_bytes(), f


def test_library_session_adds_and_renders_under_budget():
    s = Session(policy="prune", budget=BUDGET)
    for m in history("lib"):
        s.add(m)
    out = s.render()
    assert history_tokens(out) <= BUDGET < history_tokens(history("lib"))
    assert_paired(out)
    assert s.rendering.omitted and s.result("libc0") == "result0 " * WORDS
    assert s.render(budget=100_000) == [Message.from_openai(m).to_openai() for m in history("lib")]


def test_docs_proxy_library_example_runs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "proxy.md").read_text()
    block = text.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(block, "docs/proxy.md", "exec"), scope)
    assert scope["messages"][-1] == {"role": "tool", "content": "FAILED test_parse.py::test_dates", "tool_call_id": "c1"}
    assert scope["session"].result("c1") == "FAILED test_parse.py::test_dates"


def test_router_appends_only_new_events_and_branches_on_edit():
    from historygraph.history.sessions import SessionRouter
    from historygraph.store import MemoryStore

    router = SessionRouter(MemoryStore())
    base = [Message.from_openai(m) for m in history("r", n=2)]
    assert (router.ingest(base[:3], "r").appended, router.ingest(base, "r").appended) == (3, len(base) - 3)
    again = router.ingest(base, "r")
    assert (again.session_id, again.appended, again.forked_from) == ("r", 0, None)
    edited = base[:2] + [Message("user", "changed my mind")]
    fork = router.ingest(edited, "r")
    assert (fork.session_id, fork.appended, fork.forked_from) == ("r~1", 3, "r")
    longer = router.ingest(edited + [Message("assistant", "ok")], "r")  # continues the branch
    assert (longer.session_id, longer.appended) == ("r~1", 1)
    assert router.store.messages("r") == base



def test_continuing_with_another_choice_than_the_stored_one_branches():
    # n > 1: the proxy stores choice 0 as the answer; a client that goes on with choice 1 sends a
    # history that differs from the stored one, so it continues in a branch and both answers stay
    from historygraph.history.sessions import SessionRouter
    from historygraph.store import MemoryStore

    router = SessionRouter(MemoryStore())
    router.ingest([Message("user", "name a colour"), Message("assistant", "red")], "n")  # choice 0 stored
    nxt = router.ingest([Message("user", "name a colour"), Message("assistant", "blue"), Message("user", "why?")], "n")
    assert (nxt.session_id, nxt.forked_from) == ("n~1", "n")
    assert router.store.messages("n")[1].content == "red" and router.store.messages("n~1")[1].content == "blue"

def test_upstream_pool_drops_idle_connections_before_a_5_s_keep_alive_timeout():
    # the limits must reach the transport (an httpx client given a transport ignores its own):
    # a connection idle for 5 s, closed by uvicorn's default keep-alive just as it was reused,
    # surfaced as a ReadError and a 502 under load
    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    import asyncio

    transport = create_app(ServerConfig(store=":memory:", policy="prune")).state.proxy.transport

    async def connector():
        session = transport.get_client()  # the aiohttp session the transport opens on its first request
        try:
            return session.connector.limit, session.connector._keepalive_timeout
        finally:
            await session.close()

    assert asyncio.run(connector()) == (1000, 4.0)


@pytest.mark.parametrize("failures, error", [(0, None), (1, httpx.RemoteProtocolError), (2, httpx.ConnectError),
                                             (2, httpx.ConnectTimeout), (3, httpx.ConnectError), (1, httpx.ReadTimeout)])
def test_upstream_connection_failures_before_an_answer_are_retried_twice(failures, error):
    # a refused or timed-out connection, or a pooled one the upstream had just closed, is tried
    # again (2 retries, as httpx's transport did with retries=2); a timeout waiting for the answer is not
    import asyncio

    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig
    from historygraph.server.proxy import UPSTREAM_RETRIES

    tries = []

    def upstream(request: httpx.Request) -> httpx.Response:
        tries.append(request)
        if len(tries) <= failures:
            raise error("failed", request=request)
        return httpx.Response(200, json={"ok": True})

    proxy = create_app(ServerConfig(store=":memory:", policy="prune")).state.proxy
    proxy.transport = httpx.MockTransport(upstream)

    async def send():
        return await proxy.send(proxy.request("POST", "http://up/v1/chat/completions", content=b"{}"))

    retried = error is not httpx.ReadTimeout
    if failures > UPSTREAM_RETRIES or not retried:
        with pytest.raises(error):
            asyncio.run(send())
        assert len(tries) == (UPSTREAM_RETRIES + 1 if retried else 1)
    else:
        assert asyncio.run(send()).status_code == 200 and len(tries) == failures + 1


def test_unreachable_upstream_gives_502_naming_it(tmp_path):
    import asyncio

    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    port = _port()
    app = create_app(ServerConfig(upstream=f"http://127.0.0.1:{port}/v1", store=":memory:", policy="prune"))

    async def call():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
            return await c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})

    r = asyncio.run(call())
    message = r.json()["error"]["message"]
    # the URL, the reason in words and what to check; not aiohttp's "ssl:default" for a plain-http upstream
    assert r.status_code == 502 and message == (
        f"upstream http://127.0.0.1:{port}/v1/chat/completions unreachable: connection refused at 127.0.0.1:{port} "
        "(nothing listens there); check that the provider runs at that address and that historygraph serve --upstream names it")
    assert r.json()["error"]["type"] == "api_error"  # the provider's type for a server-side failure, not the client's request
    assert [replace(m, timestamp=None) for m in app.state.proxy.store.messages(derived_session_id([Message("user", "hi")]))] == [Message("user", "hi")]


def test_two_proxy_instances_on_one_database_continue_the_same_session(servers, tmp_path):
    import asyncio

    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    db = str(tmp_path / "shared.sqlite")
    apps = [create_app(ServerConfig(upstream=servers["up"] + "/v1", store=db, policy="prune", budget=BUDGET)) for _ in range(2)]
    headers = {"X-HistoryGraph-Session": "two", "Authorization": f"Bearer {KEY}"}

    msgs = history("two")

    async def conversation():
        for step in range(4):  # alternate instances, each continuing what the other stored
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=apps[step % 2]), base_url="http://proxy") as c:
                r = await c.post("/v1/chat/completions", json={"model": "m", "messages": msgs}, headers=headers)
            msgs.extend([{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                         {"role": "user", "content": f"step {step}"}])

    asyncio.run(conversation())
    for app in apps:
        store = app.state.proxy.store
        assert store.sessions() == ["two"]
        assert [m.content for m in store.messages("two")] == [m["content"] or "" for m in msgs[:-1]]


def test_serve_rejects_bad_settings_with_a_message():
    from typer.testing import CliRunner

    from historygraph.cli import app

    r = CliRunner().invoke(app, ["serve", "--policy", "nope", "--store", ":memory:"])
    assert r.exit_code == 2 and "unknown policy 'nope'" in r.output
    r = CliRunner().invoke(app, ["serve", "--store", "postgresql://nobody@127.0.0.1:1/none"])
    assert r.exit_code == 2 and "cannot open store" in r.output


def test_upstream_500_is_returned_and_the_session_stays_consistent(servers):
    import openai

    sid = "fault-500"
    client = oai(servers, sid)
    before = api(servers, "GET", f"/sessions/{sid}")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="broken-model", messages=history("f5", n=1))
    detail = api(servers, "GET", f"/sessions/{sid}").json()
    # the request's events are recorded, no answer was invented
    assert before.status_code == 404 and detail["messages"][-1]["role"] == "user"


@pytest.mark.parametrize("model", ["cut-model", "short-model"])  # connection dropped / closed before the end
def test_stream_cut_mid_way_is_stored_as_partial_never_as_complete(servers, model):
    import openai

    sid = f"fault-{model}"
    client = oai(servers, sid)
    with pytest.raises(openai.APIError, match="stream cut"):
        for _ in client.chat.completions.create(model=model, messages=history("fc", n=1), stream=True):
            pass
    msgs = api(servers, "GET", f"/sessions/{sid}").json()["messages"]
    assert msgs[-1]["role"] == "user"  # nothing presented as a complete assistant turn
    from historygraph.store import open_store
    store = open_store(str(servers["db"]))
    partial = json.loads(store.get_text("partial_answer", f"{sid}:{len(msgs)}"))
    assert partial["partial"] is True and "chat.completion.chunk" in partial["stream"]


@pytest.mark.slow  # starts a second proxy process and waits out its 1 s timeout: about 2.5 CPU s (docs/tests.md)
def test_upstream_timeout_gives_a_well_formed_error(servers, tmp_path):
    port = _port()
    px = _start(["-m", "historygraph", "serve", "--upstream", servers["up"] + "/v1", "--port", str(port), "--store",
                 str(tmp_path / "t.sqlite"), "--policy", "prune", "--timeout", "1"], port, tmp_path / "t.log")
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                       json={"model": "hang-model", "messages": [{"role": "user", "content": "hi"}]},
                       headers={"X-HistoryGraph-Session": "fault-timeout"})
        assert r.status_code == 502 and r.json()["error"]["message"] == (
            f"upstream {servers['up']}/v1/chat/completions timed out: no answer within 1 s (historygraph serve --timeout); "
            "check that the provider at that address is up and not overloaded, or allow it longer")
    finally:
        px.terminate()
        px.wait(10)


def test_calibration_hook_sees_provider_usage(servers):
    before = api(servers, "GET", "/calibration").json()["observations"]
    oai(servers, "calib").chat.completions.create(model="fake-model", messages=history("cb", n=1))
    after = api(servers, "GET", "/calibration").json()
    assert after["observations"] == before + 1 and after["median_ratio"] > 0


def test_interposed_message_openai_and_anthropic_results_follow_their_call(servers):
    """Issue 12.1: a note stored while a call is in flight, then the result. No 500; the forwarded
    request has the result directly after its call and the note after it, on every later request too."""
    import anthropic

    msgs = [{"role": "user", "content": "task interposed"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "ipc1", "type": "function",
                                                                   "function": {"name": "search", "arguments": "{}"}}]},
            {"role": "user", "content": "note: still waiting"},
            {"role": "tool", "tool_call_id": "ipc1", "content": "found it"}]
    client = oai(servers, "interposed")
    for _ in range(2):
        client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        sent = received(servers)["body"]["messages"]
        assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"] and sent[3] == msgs[2]
        assert_paired(sent)
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": "interposed-a"})
    amsgs = [{"role": "user", "content": "task interposed a"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "ipt1", "name": "search", "input": {}}]},
             {"role": "user", "content": [{"type": "text", "text": "note: still waiting"}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "ipt1", "content": "found it"}]}]
    a.messages.create(model="m", max_tokens=20, messages=amsgs, tools=A_TOOLS)
    sent = received(servers)["body"]["messages"]
    assert sent[1] == amsgs[1] and sent[2]["content"][0] == amsgs[3]["content"][0]


def test_thinking_block_opening_the_active_tool_loop_is_forwarded_even_over_b(servers):
    """Issue 12.2: with extended thinking the loop's first assistant turn (thinking block, large tool
    input) is sent back byte-exact however small B is; a B too small for it is forwarded over B and
    says so (issue 36.3: never a 4xx for the proxy's own budget)."""
    import anthropic

    think = {"type": "thinking", "thinking": "plan ✓", "signature": sign("plan ✓")}
    turns = [{"role": "user", "content": "find the bug (thinking)"},
             {"role": "assistant", "content": [think, {"type": "tool_use", "id": "th0", "name": "search",
                                                       "input": {"script": "echo x " * 300}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "th0", "content": "out " * WORDS}]}]
    for i in range(1, 4):
        turns += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"th{i}", "name": "search", "input": {"i": i}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"th{i}", "content": "out " * WORDS}]}]
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": "thinking-loop", "X-HistoryGraph-Budget": "1000"})
    a.messages.create(model="m", max_tokens=20, messages=turns, tools=A_TOOLS)
    sent = received(servers)["body"]["messages"]
    assert sent[1] == turns[1]  # the opening turn, thinking first, byte-exact
    raw = a.messages.with_raw_response.create(model="m", max_tokens=20, messages=turns, tools=A_TOOLS,
                                              extra_headers={"X-HistoryGraph-Budget": "200"})
    assert int(raw.headers["x-historygraph-over-budget"]) > 600  # the opening turn's input alone: 605 tokens
    assert received(servers)["body"]["messages"][1] == turns[1]


def _leaf_tokens(value) -> int:
    """Independent recount: tokens of every string leaf of a wire block (keys and JSON syntax not counted)."""
    if isinstance(value, str):
        return counter.count(value)
    if isinstance(value, dict):
        return sum(_leaf_tokens(v) for k, v in value.items() if k != "type")
    if isinstance(value, list):
        return sum(_leaf_tokens(v) for v in value)
    return counter.count(json.dumps(value))


def test_server_tool_blocks_and_thinking_are_charged_to_the_budget(servers):
    """Issue 12.3: a 2,000-token web search result and thinking text are forwarded, so B counts them:
    at B = 150 the request is forwarded over B and says how many tokens it sent (issue 36.3; before
    issue 12.3: forwarded, 136 tokens counted); at a B that holds them the forwarded history,
    recounted from the wire, is within B."""
    import anthropic

    search = {"type": "web_search_tool_result", "tool_use_id": "srv1",
              "content": [{"type": "web_search_result", "url": f"https://example.org/{i}", "title": f"page {i}",
                           "encrypted_content": "EncryptedPageText " * 40, "page_age": None} for i in range(6)]}
    turns = [{"role": "user", "content": "what is new (server tools)?"},
             {"role": "assistant", "content": [{"type": "thinking", "thinking": "search the web " * 30, "signature": sign("search the web " * 30)},
                                               {"type": "server_tool_use", "id": "srv1", "name": "web_search",
                                                "input": {"query": "news"}}, search,
                                               {"type": "text", "text": "Here is what I found."}]},
             {"role": "user", "content": "thanks; and more?"}]
    charged = sum(_leaf_tokens(b) for b in turns[1]["content"])
    assert charged > 1000
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": "server-tools"})
    raw = a.messages.with_raw_response.create(model="m", max_tokens=20, messages=turns, extra_headers={"X-HistoryGraph-Budget": "150"})
    assert int(raw.headers["x-historygraph-over-budget"]) > 1000
    budget = charged + 200
    a.messages.create(model="m", max_tokens=20, messages=turns, extra_headers={"X-HistoryGraph-Budget": str(budget)})
    sent = received(servers)["body"]["messages"]
    assert sent[1] == turns[1]
    assert sum(_leaf_tokens(m["content"]) for m in sent[:-1]) <= budget


@pytest.mark.slow
def test_two_worker_processes_share_one_store(servers, tmp_path):
    """``--workers 2``: two processes answer on one port and share the SQLite store, so a session
    continued on whichever worker takes the request stores each event once, in order; a developer
    message is counted by the calibration hook from the rendering (the request is not parsed again)."""
    import psutil

    port, db = _port(), tmp_path / "w.sqlite"
    px = _start(["-m", "historygraph", "serve", "--upstream", servers["up"] + "/v1", "--port", str(port), "--store",
                 str(db), "--policy", "prune", "--budget", str(BUDGET), "--workers", "2"], port, tmp_path / "w.log")
    try:
        def workers() -> int:  # uvicorn's supervisor spawns the workers with multiprocessing
            return sum("spawn_main" in " ".join(c.cmdline()) for c in psutil.Process(px.pid).children())

        deadline = time.time() + 60
        while workers() < 2 and time.time() < deadline:
            time.sleep(0.2)
        assert workers() == 2
        msgs = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "task for two workers"}]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=60) as client:
            for step in range(6):  # new connections: requests spread over the workers
                r = client.post("/chat/completions", json={"model": "fake-model", "messages": msgs, "tools": TOOLS},
                                headers={"X-HistoryGraph-Session": "two-workers", "Connection": "close"})
                assert r.status_code == 200, r.text
                answer = {k: v for k, v in r.json()["choices"][0]["message"].items() if v is not None}
                msgs.append(answer)
                if answer.get("tool_calls"):
                    msgs.append({"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": f"out {step}"})
                else:
                    msgs.append({"role": "user", "content": f"go on {step}"})
    finally:
        px.terminate()
        px.wait(30)
    from historygraph.store import open_store
    stored = open_store(str(db)).messages("two-workers")
    assert [m.content for m in stored] == [m.get("content") or "" for m in msgs[:len(stored)]]
    assert stored[0].role == "system" and [m.role for m in stored[1:]] == [m["role"] for m in msgs[1:len(stored)]]
    assert len(stored) == len(msgs) - 1  # everything but the last tool result / user message, which no request carried yet
    records = [json.loads(line) for line in (tmp_path / "w.log").read_text().splitlines() if line.startswith("{")]
    # the workers are spawned processes: each configures the logs itself (one rendered record per request)
    assert sum(r.get("message") == "rendered" and r.get("session") == "two-workers" for r in records) == 6


def test_late_second_result_for_one_call_is_stored_and_one_is_forwarded(servers):
    """Issue 12.5: a synthetic timeout error, then the real result for the same call (before: 400 on
    this and every later request). Both are stored; the latest is forwarded, right after its call."""
    msgs = [{"role": "user", "content": "task late result"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "late1", "type": "function",
                                                                   "function": {"name": "search", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "late1", "content": "error: timed out"},
            {"role": "tool", "tool_call_id": "late1", "content": "the real result"}]
    client = oai(servers, "late-result")
    for _ in range(2):
        client.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        sent = received(servers)["body"]["messages"]
        assert [m.get("content") for m in sent if m["role"] == "tool"] == ["the real result"]
    stored = api(servers, "GET", "/sessions/late-result").json()["messages"]
    assert [m["content"] for m in stored if m["role"] == "tool"] == ["error: timed out", "the real result"]


@pytest.mark.parametrize("stream", [False, True])
def test_calibration_sees_anthropic_and_streamed_usage_with_cache_parts(servers, stream):
    """Issue 12.4: every answer's usage reaches the calibration, both APIs, streamed or not."""
    import anthropic

    before = api(servers, "GET", "/calibration").json()
    a = anthropic.Anthropic(base_url=servers["px"], api_key=KEY, max_retries=0,
                            default_headers={"X-HistoryGraph-Session": f"calib-a-{stream}"})
    kw = dict(model="m", max_tokens=20, messages=[{"role": "user", "content": f"usage please {stream}"}])
    if stream:
        with a.messages.stream(**kw) as s:
            s.get_final_message()
    else:
        a.messages.create(**kw)
    oai(servers, f"calib-o-{stream}").chat.completions.create(model="m", messages=history(f"cu{stream}", n=1),
                                                              stream=stream, stream_options={"include_usage": True} if stream else None)
    after = api(servers, "GET", "/calibration").json()
    assert after["observations"] == before["observations"] + 2 and after["applied"] is True
    assert after["input_tokens"]["fresh"] == before["input_tokens"]["fresh"] + 2  # the fake reports 1 fresh token each


def test_a_worker_process_tunes_its_garbage_collector(monkeypatch, tmp_path):
    # historygraph serve --workers N: each worker builds its app with create_app_from_env, then
    # freezes what it allocated and collects less often (app.GC_THRESHOLDS)
    import dataclasses
    import gc
    import json as _json

    from historygraph.server import app as app_mod
    from historygraph.server.config import CONFIG_ENV, LOG_ENV, ServerConfig

    before = gc.get_threshold()
    config = ServerConfig(store=str(tmp_path / "w.sqlite"), policy="prune")
    monkeypatch.setenv(CONFIG_ENV, _json.dumps(dataclasses.asdict(config)))
    monkeypatch.delenv(LOG_ENV, raising=False)
    try:
        app_mod.create_app_from_env()
        assert gc.get_threshold() == app_mod.GC_THRESHOLDS != before
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.parametrize("url, api, want", [
    ("http://no-such-host.invalid/v1/chat/completions", "openai", "the host name 'no-such-host.invalid' could not be resolved"),
    ("https://127.0.0.1:{port}/v1/messages", "anthropic", "connection refused at 127.0.0.1:{port} (nothing listens there)"),
])
def test_an_unreachable_upstream_is_named_with_the_reason_and_the_option_to_check(url, api, want):
    # the exception chain as httpx-aiohttp raises it: httpx's error from aiohttp's, from the OS error
    import asyncio

    from httpx_aiohttp import AiohttpTransport

    from historygraph.server.upstream import unreachable_message

    url = url.format(port=_port())

    async def fail() -> BaseException:
        async with httpx.AsyncClient(transport=AiohttpTransport()) as c:
            try:
                await c.post(url, content=b"{}")
            except httpx.HTTPError as exc:
                return exc
        raise AssertionError("the request was answered")

    message = unreachable_message(url, asyncio.run(fail()), api)
    option = "--upstream" if api == "openai" else "--anthropic-upstream"
    assert message == (f"upstream {url} unreachable: {want.format(port=urlsplit(url).port)}; check that the provider "
                       f"runs at that address and that historygraph serve {option} names it")
    assert "ssl:default" not in message


def test_a_cookie_an_upstream_answer_sets_is_never_sent_with_a_later_request():
    # a provider's load balancer sets cookies (e.g. __cf_bm); the proxy's upstream connection is
    # shared by all its clients, so it must keep none: before the fix httpx's client (and aiohttp's
    # session under it) stored the cookie and sent it with the next client's request
    import asyncio

    from aiohttp import web

    from historygraph.server.app import create_app
    from historygraph.server.config import ServerConfig

    cookies: list[str | None] = []

    async def chat(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie"))
        response = web.json_response({"id": "c", "object": "chat.completion", "model": "m",
                                      "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                   "finish_reason": "stop"}]})
        response.set_cookie("__cf_bm", f"balancer-{len(cookies)}", path="/")
        return response

    async def run() -> None:
        upstream = web.Application()
        upstream.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(upstream)
        await runner.setup()
        port = _port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        app = create_app(ServerConfig(upstream=f"http://127.0.0.1:{port}/v1", store=":memory:", policy="prune"))
        try:
            for session in ("cookie-a", "cookie-b"):  # two agents, each its own client (a client's own cookies pass)
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy") as c:
                    r = await c.post("/v1/chat/completions", headers={"X-HistoryGraph-Session": session},
                                     json={"model": "m", "messages": [{"role": "user", "content": f"hi from {session}"}]})
                    assert r.status_code == 200 and r.headers["set-cookie"].startswith("__cf_bm=balancer-")
        finally:
            await app.state.proxy.transport.aclose()
            await runner.cleanup()

    asyncio.run(run())
    assert cookies == [None, None]  # the answer's Set-Cookie reached the client; nothing came back upstream


def test_blocking_work_runs_off_the_event_loop_and_its_errors_reach_the_caller():
    """The request path's hand-off (``app.run_in_threadpool``): the call runs in a worker thread,
    never the event loop's, gets its arguments, returns its value, raises its own exception, and
    50 calls at once all complete (the pool has THREADS threads)."""
    import asyncio
    import threading

    from historygraph.server import proxy as app_mod

    def work(x, *, y):
        return threading.get_ident(), x + y

    def fail():
        raise ValueError("boom")

    async def main():
        loop_thread = threading.get_ident()
        tid, value = await app_mod.run_in_threadpool(work, 2, y=3)
        with pytest.raises(ValueError, match="boom"):
            await app_mod.run_in_threadpool(fail)
        many = await asyncio.gather(*(app_mod.run_in_threadpool(work, i, y=1) for i in range(50)))
        return loop_thread, tid, value, many

    loop_thread, tid, value, many = asyncio.run(main())
    assert tid != loop_thread and value == 5
    assert [v for _, v in many] == list(range(1, 51)) and all(t != loop_thread for t, _ in many)


def test_the_server_config_and_the_serve_command_import_without_the_web_stack():
    """Issue 35: ``historygraph.server`` imports nothing eagerly, and its settings module (the one
    table of serve defaults, read by ``historygraph serve``'s options) pulls neither FastAPI nor
    aiohttp; the command's option defaults are that table's."""
    import subprocess
    import sys

    code = ("import sys, historygraph.server.config, historygraph.cli.serve; "
            "print(sorted(m for m in ('fastapi', 'aiohttp', 'starlette', 'uvicorn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    import inspect

    from historygraph.cli.serve import serve
    from historygraph.server.config import DEFAULTS, ServerConfig

    params = inspect.signature(serve).parameters
    assert params["budget_text"].default == str(DEFAULTS.budget) == str(ServerConfig.budget)
    for name in ("upstream", "anthropic_upstream", "host", "port", "max_body_bytes", "timeout", "encoding",
                 "recall_rounds", "session_cache", "embedder", "workers"):
        assert params[name].default == getattr(DEFAULTS, name), name
    assert params["calibration"].default == DEFAULTS.calibrate == ServerConfig.calibrate
