"""The recall tool: the model fetches tool results that a rendering omitted, and the proxy answers.

Opt-in (``historygraph serve --recall``, or ``X-HistoryGraph-Recall: on`` per request; ``off``
turns it off for one request), on the four APIs (Chat Completions, Messages, Responses: a
``function`` tool of each API's shape; the Gemini API: a function declaration, its forms in
:mod:`historygraph.server.recall_gemini`). When the rendering of a request omitted tool results
(their placeholders name the ids), the proxy adds one tool to the request, :data:`TOOL_NAME`,
taking ``{"ids": [...]}``. When the model's answer calls it, the proxy answers the call itself: it appends
the model's turn and, for each call, the complete stored results (each cut to ``recall_max_tokens``
tokens, marked), and calls the upstream again, up to ``recall_rounds`` times; the last of those
calls is sent without the tool, so the model answers. Calls to the client's own tools made in the
same turn are answered ``not run`` (the model sees its recalled results and calls them again if it
still needs them). The client receives only the final answer and never sees the tool; only that
answer is stored, so the client's next request still continues the stored session.

Streams (:func:`_stream`): each round is streamed from the upstream and read until it shows what
it starts. A round that starts by calling the recall tool is read whole and answered before the
client sees anything; the first round that starts an answer (text, a call of the client's tools)
is relayed as it arrives, event by event. When that round calls the recall tool after it began its
answer, its call is not relayed: the proxy answers it and the next round continues the same answer
in the same stream (:class:`_Splice`); the answer stored is the one the client received. Usage
figures in the answer are those of the final round.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from historygraph import telemetry
from historygraph.history.events import Message
from historygraph.providers import anthropic as anth
from historygraph.providers import gemini as gem
from historygraph.providers import openai_responses as resp
from historygraph.render import Rendering
from historygraph.render.recall import DESCRIPTION, PARAMETERS, TOOL_NAME, ids_of, openai_tool, recall_text
from historygraph.signals.calibration import anthropic_usage, openai_usage
from historygraph.server.errors import RETRY, not_json, stream_error, upstream_fault
from historygraph.server.answers import UNREADABLE, answer_of, unreadable
from historygraph.server import recall_gemini as rg
from historygraph.server.proxy import PROXY_MS_HEADER
from historygraph.server.upstream import OpenAIStreamAccumulator, SSEParser, forward_headers, response_headers, unreachable_error

NOT_RUN = "[not run: this call was made together with {tool}; the recalled results are above, call it again if still needed]"
HEADER = "x-historygraph-recall"
_ACC: dict[str, Any] = {"openai": OpenAIStreamAccumulator, "anthropic": anth.StreamAccumulator, "responses": resp.StreamAccumulator,
                        "gemini": gem.StreamAccumulator}
_USAGE = {"openai": openai_usage, "anthropic": anthropic_usage, "responses": resp.responses_usage, "gemini": gem.gemini_usage}


def wanted(enabled: bool, request: Request, rendering: Rendering, stream: bool | None = None) -> bool:
    """Whether to offer the tool: on (config or header) and the rendering omitted something (a
    Gemini stream (``stream``) only as server-sent events, ``alt=sse``, which the rounds read)."""
    raw = (request.headers.get(HEADER) or "").strip().lower()
    on = raw in ("on", "1", "true", "yes") or (enabled and raw not in ("off", "0", "false", "no"))
    return on and bool(rendering.omitted) and not (stream and request.query_params.get("alt") != "sse")


async def send(proxy: Any, url: str, body: dict[str, Any], recall_body: dict[str, Any], request: Request, sid: str,
               started: float, api: str, accumulator: Any, sent_tokens: int, policy: str, rendering: Rendering,
               at: int | None = None, stream: bool | None = None) -> Response:
    """Forward a rendered request (``body``) as the proxy does, or, when the recall tool is wanted
    for it (:func:`wanted`), ``recall_body`` through :func:`forward`; either way the rendering's
    notes (:meth:`~historygraph.server.proxy.Proxy.notes`) become response headers, and the answer
    is stored after the request's ``at`` events (:meth:`~historygraph.server.proxy.Proxy.store_answer`).
    ``stream``: whether the answer is a stream (``None``: the body's ``stream`` field says)."""
    if wanted(proxy.config.recall, request, rendering, stream if api == "gemini" else None):
        answer = await forward(proxy, url, recall_body, request, sid, started, api, at, accumulator, stream)
        answer.headers.update(proxy.notes(rendering, sid))
        telemetry.finish(getattr(request.state, telemetry.SPAN_STATE, None), answer.status_code)
        return answer
    return await proxy.forward(url, body, request, sid, started, accumulator, sent_tokens, policy, extra=proxy.notes(rendering, sid),
                               at=at, stream=stream)


def with_tool(body: dict[str, Any], api: str) -> dict[str, Any]:
    """``body`` with the recall tool appended to its ``tools``, in the API's tool shape (Responses:
    https://platform.openai.com/docs/api-reference/responses/create, ``tools``, function tool)."""
    if api == "gemini":
        return rg.with_tool(body)
    if api == "openai":
        tool = openai_tool()
    elif api == "responses":
        tool = {"type": "function", "name": TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS}
    else:
        tool = {"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": PARAMETERS}
    return {**body, "tools": [*(body.get("tools") or []), tool]}


def without_tool(body: dict[str, Any], api: str) -> dict[str, Any]:
    if api == "gemini":
        return rg.without_tool(body)

    def name(t: dict[str, Any]) -> Any:
        return (t.get("function") or {}).get("name") if api == "openai" else t.get("name")
    tools = [t for t in body.get("tools") or [] if name(t) != TOOL_NAME]
    out = {k: v for k, v in body.items() if k != "tools"}
    return {**out, "tools": tools} if tools else {k: v for k, v in out.items() if k != "tool_choice"}


def recalled_text(proxy: Any, session_id: str, arguments: str) -> str:
    """The answer to one recall call (``arguments``: the call's JSON text): each requested result's
    complete stored text, or the stored messages of a span a marker names, each cut to
    ``recall_max_tokens`` tokens with a marker, or why it cannot be given
    (:func:`historygraph.render.recall.recall_text`)."""
    return recall_text(proxy.store.graph(session_id), ids_of(arguments), proxy.signals.counter,
                       proxy.config.recall_max_tokens)


def _anthropic_blocks(events: list[Any]) -> list[dict[str, Any]]:
    """The content blocks of a Messages API stream, thinking text and signatures included."""
    blocks: dict[int, dict[str, Any]] = {}
    partial: dict[int, list[str]] = {}
    for e in events:
        if not isinstance(e, dict):
            continue
        kind = e.get("type")
        idx: Any = e.get("index")  # the block's index: an int in the wire format (not checked)
        if kind == "content_block_start" and isinstance(e.get("content_block"), dict):
            blocks[idx] = dict(e["content_block"])
        elif kind == "content_block_delta" and idx in blocks:
            d, b = e.get("delta") or {}, blocks[idx]
            if d.get("type") == "text_delta":
                b["text"] = b.get("text", "") + d.get("text", "")
            elif d.get("type") == "thinking_delta":
                b["thinking"] = b.get("thinking", "") + d.get("thinking", "")
            elif d.get("type") == "signature_delta":
                b["signature"] = d.get("signature", "")
            elif d.get("type") == "input_json_delta":
                partial.setdefault(idx, []).append(d.get("partial_json", ""))
    for idx, pieces in partial.items():
        text = "".join(pieces)
        blocks[idx]["input"] = json.loads(text) if text.strip() else {}
    return [blocks[i] for i in sorted(blocks)]


class _Round:
    """One upstream call: status, headers, raw bytes (chunks when streamed), the answer, and the
    model's turn in the API's form (Responses: its output items)."""

    def __init__(self, status: int, headers: Any, chunks: list[bytes], answer: Message | None,
                 turn: Any, complete: bool, cut: str | None = None) -> None:
        self.status, self.headers, self.chunks, self.answer = status, headers, chunks, answer
        self.turn, self.complete, self.cut = turn, complete, cut

    @property
    def recall_calls(self) -> list[Any]:
        return [c for c in (self.answer.tool_calls if self.answer else ()) if c.name == TOOL_NAME]


def _turn(answer: Message, events: list[Any], api: str) -> Any:
    """The model's turn of a streamed round, to send back with the answers to its calls."""
    if api == "openai":
        return {"role": "assistant", "content": answer.content or None,
                **({"tool_calls": [c.to_openai() for c in answer.tool_calls]} if answer.tool_calls else {})}
    if api == "anthropic":
        return {"role": "assistant", "content": _anthropic_blocks(events)}
    if api == "gemini":
        return rg.streamed_turn(events)
    done = [e for e in events if isinstance(e, dict) and e.get("type") in ("response.completed", "response.incomplete")]
    output = (done[-1].get("response") or {}).get("output") if done else None
    return output or [e["item"] for e in events if isinstance(e, dict) and e.get("type") == "response.output_item.done"]


def _plain_headers(headers: Any) -> dict[str, str]:
    return {k: v for k, v in response_headers(headers).items() if k.lower() != "content-encoding"}


async def _open(proxy: Any, url: str, body: dict[str, Any], headers: dict[str, str], api: str) -> httpx.Response:
    """Send one round upstream, its answer streamed; a 502 :class:`ClientError` when unreachable."""
    try:
        return await proxy.send(proxy.request("POST", url, json=body, headers=headers))
    except httpx.HTTPError as exc:
        proxy.metrics.upstream_errors.labels(api, "unreachable").inc()
        raise unreachable_error(url, exc, api, proxy.config.timeout) from None


async def _call(proxy: Any, url: str, body: dict[str, Any], headers: dict[str, str], api: str, acc: Any) -> _Round:
    """One round of a request that is not streamed."""
    up = await _open(proxy, url, body, headers, api)
    content = await proxy.read_answer(url, up, api)  # a 502 when the body is cut
    if up.status_code >= 400:
        proxy.metrics.upstream_errors.labels(api, str(up.status_code)).inc()
        return _Round(up.status_code, up.headers, [content], None, None, True)
    try:
        data = json.loads(content)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        proxy.metrics.upstream_errors.labels(api, "not_json").inc()
        raise upstream_fault(url, up.status_code, not_json(content, up.headers.get("content-type")))
    answer = answer_of(data, acc)
    turn: Any
    if api == "openai":
        m = data["choices"][0]["message"]
        turn = {"role": "assistant", "content": m.get("content"), **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})}
    elif api == "anthropic":
        turn = {"role": "assistant", "content": data.get("content") or []}
    elif api == "gemini":
        turn = rg.turn_of(data)
    else:
        turn = data.get("output") or []
    return _Round(up.status_code, up.headers, [content], answer, turn, True)


def _exchange(proxy: Any, session_id: str, rnd: _Round, api: str) -> list[Any]:
    """The model's turn and the answers to its calls, in the API's form."""
    assert rnd.answer is not None and rnd.turn is not None
    answers = []
    for c in rnd.answer.tool_calls:
        text = recalled_text(proxy, session_id, c.arguments) if c.name == TOOL_NAME else NOT_RUN.format(tool=TOOL_NAME)
        answers.append((c.id, text))
    proxy.metrics.recall_calls.labels(api).inc(len(rnd.recall_calls))
    if api == "openai":
        return [rnd.turn, *({"role": "tool", "tool_call_id": i, "content": t} for i, t in answers)]
    if api == "gemini":
        return rg.exchange(rnd.turn, [t for _, t in answers])
    if api == "responses":  # each output item as the model made it, each call answered by an output of its kind
        kinds = {it.get("call_id"): it.get("type") for it in rnd.turn if isinstance(it, dict)}
        return [*rnd.turn, *({"type": "custom_tool_call_output" if kinds.get(i) == "custom_tool_call" else "function_call_output",
                              "call_id": i, "output": t} for i, t in answers)]
    results = []
    for c, (i, t) in zip(rnd.answer.tool_calls, answers):
        media = recalled_media(proxy, session_id, c.arguments) if c.name == TOOL_NAME else []
        results.append({"type": "tool_result", "tool_use_id": i, "content": [{"type": "text", "text": t}, *media] if media else t})
    return [rnd.turn, {"role": "user", "content": results}]


def recalled_media(proxy: Any, session_id: str, arguments: str) -> list[dict[str, Any]]:
    """The Anthropic ``image`` and ``document`` blocks of the tool results one recall call names
    (:attr:`Message.media`, whole), which its ``tool_result`` carries after the text: the model
    gets back what the placeholder stood for. (A Chat Completions tool message holds text only.)"""
    try:
        ids = json.loads(arguments or "{}").get("ids")
    except (json.JSONDecodeError, AttributeError):
        return []
    graph = proxy.store.graph(session_id)
    out: list[dict[str, Any]] = []
    for i in [ids] if isinstance(ids, str) else ids if isinstance(ids, list) else []:
        if isinstance(i, str) and i in graph.result_of and (media := graph.messages[graph.result_of[i]].media):
            out += [p for p in json.loads(media) if p.get("type") in ("image", "document")]
    return out


def _extended(body: dict[str, Any], exchange: list[Any], api: str) -> dict[str, Any]:
    """``body`` with the model's turn and the answers to its calls appended to its conversation."""
    if api == "gemini":
        return {**body, "contents": [*body["contents"], *exchange]}
    if api != "responses":
        return {**body, "messages": [*body["messages"], *exchange]}
    items = body["input"]
    return {**body, "input": [*([{"role": "user", "content": items}] if isinstance(items, str) else items), *exchange]}


async def forward(proxy: Any, url: str, body: dict[str, Any], request: Request, session_id: str, started: float,
                  api: str, at: int | None = None, accumulator: Any = None, stream: bool | None = None) -> Response:
    """Forward ``body`` with the recall tool, answering its calls (see the module docstring); the
    answer is stored after the request's ``at`` events, read by ``accumulator`` (default: the
    API's); ``stream`` as for :func:`send`."""
    acc = accumulator or _ACC[api]
    if body.get("stream") if stream is None else stream:
        return await _stream(proxy, url, body, request, session_id, started, api, at, acc)
    headers = forward_headers(request.headers, body)
    ours = {"x-historygraph-session": session_id}
    rounds = proxy.config.recall_rounds
    current = with_tool(body, api)
    upstream_s = 0.0
    for k in range(rounds + 1):
        last = k == rounds
        t_up = time.perf_counter()
        rnd = await _call(proxy, url, without_tool(current, api) if last else current, headers, api, acc)
        upstream_s += time.perf_counter() - t_up
        if rnd.status < 400 and rnd.recall_calls and not last:
            current = _extended(current, _exchange(proxy, session_id, rnd, api), api)
            continue
        break
    if rnd.status < 400 and rnd.answer is not None:
        try:
            data = json.loads(b"".join(rnd.chunks))
        except ValueError:
            data = None
        proxy.observe_usage(body, _USAGE[api](data), api=api)
        await run_in_threadpool(proxy.store_answer, session_id, rnd.answer, at)
    proxy_ms = (time.perf_counter() - started - upstream_s) * 1000
    return Response(b"".join(rnd.chunks), rnd.status, {**_plain_headers(rnd.headers), **ours, PROXY_MS_HEADER: f"{proxy_ms:.2f}"})


def _starts(event: Any, api: str) -> str | None:
    """What an event of a streamed round starts: ``"recall"`` (a call of the recall tool),
    ``"output"`` (text, a call of another tool, any other output the client is to see) or ``None``
    (nothing yet: role deltas, thinking and reasoning, bookkeeping events)."""
    if not isinstance(event, dict):
        return None
    if api == "openai":
        delta = ((event.get("choices") or [{}])[0] or {}).get("delta") or {}
        names = [(c.get("function") or {}).get("name") for c in delta.get("tool_calls") or [] if isinstance(c, dict)]
        if TOOL_NAME in names:
            return "recall"
        return "output" if delta.get("content") or any(names) else None
    if api == "gemini":
        return rg.starts(event)
    if api == "anthropic":
        block = event.get("content_block") if event.get("type") == "content_block_start" else None
        if not isinstance(block, dict) or block.get("type") in ("thinking", "redacted_thinking"):
            return None
        return "recall" if block.get("name") == TOOL_NAME else "output"
    item = event.get("item") if event.get("type") == "response.output_item.added" else None
    if not isinstance(item, dict) or item.get("type") == "reasoning":
        return None
    return "recall" if item.get("name") == TOOL_NAME else "output"


class _Splice:
    """Turns the events of the rounds relayed to the client into one answer: a round that began
    its answer and then called the recall tool is cut there (its call is never relayed), and the
    next round continues the same answer (OpenAI: tool-call indexes shifted past those relayed;
    Anthropic: its ``message_start`` and thinking blocks dropped, block indexes continued;
    Responses: its opening events and reasoning items dropped, output indexes continued, the
    final response's ``output`` holding every item relayed). ``acc``: the client's view,
    accumulated from what was relayed (the answer stored)."""

    def __init__(self, api: str, acc: Any) -> None:
        self.api, self.acc, self.rounds = api, acc, 0
        self.offset = 0  # calls (OpenAI), blocks (Anthropic) or output items (Responses) relayed in earlier rounds
        self.index: dict[Any, int | None] = {}  # this round's upstream index -> the client's (None: dropped)
        self.items: list[Any] = []  # Responses: output items relayed in earlier rounds
        self.done: list[Any] = []  # Responses: this round's relayed items
        self.seq = 0

    def next_round(self) -> None:
        self.offset += len([v for v in self.index.values() if v is not None])
        self.items += self.done
        self.index, self.done, self.rounds = {}, [], self.rounds + 1

    def _mapped(self, idx: Any, keep: bool = True) -> int | None:
        if idx not in self.index:
            self.index[idx] = self.offset + len([v for v in self.index.values() if v is not None]) if keep else None
        return self.index[idx]

    def event(self, e: Any) -> bytes | None:
        """The bytes to relay for upstream event ``e`` (``None``: dropped)."""
        if e == "[DONE]":
            return b"data: [DONE]\n\n"
        if not isinstance(e, dict):
            return None
        if self.api == "gemini":  # no indexes: a continuing round's thought summaries dropped
            if self.rounds and rg.thought(e):
                return None
            self.acc.feed(e)
            return rg.relayed(e)
        if self.api == "openai":
            calls = ((e.get("choices") or [{}])[0] or {}).get("delta", {}).get("tool_calls") if e.get("choices") else None
            if calls and self.rounds:
                e = json.loads(json.dumps(e))
                for c in e["choices"][0]["delta"]["tool_calls"]:
                    c["index"] = self._mapped(c.get("index"))
            elif calls:
                for c in calls:
                    self._mapped(c.get("index"))
            self.acc.feed(e)
            return ("data: " + json.dumps(e) + "\n\n").encode()
        kind = e.get("type")
        if self.api == "anthropic":
            if kind == "message_start" and self.rounds:
                return None
            if kind in ("content_block_start", "content_block_delta", "content_block_stop"):
                block: dict[str, Any] = e.get("content_block") or {}
                first = kind == "content_block_start"
                keep = not (self.rounds and first and block.get("type") in ("thinking", "redacted_thinking"))
                idx = self._mapped(e.get("index"), keep) if first else self.index.get(e.get("index"), e.get("index"))
                if idx is None:
                    return None
                e = {**e, "index": idx}
            self.acc.feed(e)
            return (f"event: {kind}\ndata: " + json.dumps(e) + "\n\n").encode()
        if self.rounds and kind in ("response.created", "response.in_progress"):
            return None
        if "output_index" in e:
            item: dict[str, Any] = e["item"] if isinstance(e.get("item"), dict) else {}
            first = kind == "response.output_item.added"
            keep = not (self.rounds and first and item.get("type") == "reasoning")
            idx = self._mapped(e.get("output_index"), keep) if first else self.index.get(e.get("output_index"), e.get("output_index"))
            if idx is None:
                return None
            e = {**e, "output_index": idx}
            if kind == "response.output_item.done":
                self.done.append(e.get("item"))
        if kind in ("response.completed", "response.incomplete") and self.rounds and isinstance(e.get("response"), dict):
            e = {**e, "response": {**e["response"], "output": [*self.items, *self.done]}}
        if "sequence_number" in e:
            e = {**e, "sequence_number": self.seq}
            self.seq += 1
        self.acc.feed(e)
        return (f"event: {kind}\ndata: " + json.dumps(e) + "\n\n").encode()


class _Live:
    """One streamed upstream round, read event by event."""

    def __init__(self, up: httpx.Response, api: str, acc: Any) -> None:
        self.up, self.api = up, api
        self.parser, self.acc = SSEParser(), acc()
        self.events: list[Any] = []
        self.chunks = up.aiter_raw().__aiter__()
        self.cut: str | None = None

    async def next(self) -> list[Any] | None:
        """The events of the next chunk (``None`` at the end; ``self.cut`` says why when the
        stream ended without its final event). An unreadable answer raises (:data:`UNREADABLE`)."""
        if self.cut is not None:
            return None
        try:
            chunk = await self.chunks.__anext__()
        except StopAsyncIteration:
            if not self.acc.complete:
                self.cut = "upstream stream cut mid-way: the upstream closed the stream before its final event"
            return None
        except httpx.HTTPError as exc:
            if not self.acc.complete:
                self.cut = f"upstream stream cut mid-way: {exc}"
            return None
        events = list(self.parser.feed(chunk))
        if self.api == "gemini":
            events = [one for e in events for one in rg.split(e)]
        for e in events:
            self.acc.feed(e)
        self.events += events
        return events

    def round(self) -> _Round:
        try:
            answer = self.acc.message() if self.acc.complete else None
        except UNREADABLE:  # a call whose arguments never became JSON: no answer to store or act on
            answer = None
        return _Round(self.up.status_code, self.up.headers, [], answer, _turn(answer, self.events, self.api) if answer else None,
                      self.acc.complete, self.cut)


async def _stream(proxy: Any, url: str, body: dict[str, Any], request: Request, session_id: str, started: float,
                  api: str, at: int | None, acc: Any) -> Response:
    """:func:`forward` of a streamed request: each round is read until it shows what it starts
    (:func:`_starts`); a round that starts with a recall call is read whole and answered before
    anything reaches the client; the first round that starts an answer is relayed as it arrives,
    and when it calls the recall tool after all, the call is answered and the next round continues
    the same answer (:class:`_Splice`). ``X-HistoryGraph-Proxy-Ms``: the proxy's time until the
    relayed round's request was sent, the earlier rounds' upstream time excluded."""
    headers = forward_headers(request.headers, body)
    ours = {"x-historygraph-session": session_id}
    rounds, current, k = proxy.config.recall_rounds, with_tool(body, api), 0
    held: list[Any] = []
    upstream_s = 0.0  # the upstream's time in the rounds answered before the relayed one
    while True:  # the rounds before anything is relayed
        t_up = time.perf_counter()
        ours[PROXY_MS_HEADER] = f"{(t_up - started - upstream_s) * 1000:.2f}"
        up = await _open(proxy, url, without_tool(current, api) if k == rounds else current, headers, api)
        if up.status_code >= 400:
            content = await proxy.read_answer(url, up, api)
            proxy.metrics.upstream_errors.labels(api, str(up.status_code)).inc()
            return Response(content, up.status_code, {**_plain_headers(up.headers), **ours})
        live, held, fault, starts = _Live(up, api, acc), [], None, None
        try:
            while starts is None and (events := await live.next()) is not None:
                held += events
                starts = next((s for e in events if (s := _starts(e, api)) is not None), None)
            if starts == "recall" and k < rounds:
                while await live.next() is not None:
                    pass
        except UNREADABLE as exc:
            fault = f"upstream stream unusable: {unreadable(exc)}; {RETRY}"
        rnd = live.round()
        if fault is None and starts == "recall" and k < rounds and rnd.complete and rnd.recall_calls:
            await live.up.aclose()
            upstream_s += time.perf_counter() - t_up
            current = _extended(current, _exchange(proxy, session_id, rnd, api), api)
            k += 1
            continue
        break

    async def relay():
        nonlocal live, current, k, held, fault
        splice, stored = _Splice(api, acc()), False
        try:
            while True:
                late = False
                try:
                    pending = held
                    while not late:
                        for e in pending:
                            if k < rounds and _starts(e, api) == "recall":  # it began its answer, then recalls
                                late = True
                                break
                            out = splice.event(e)
                            if not stored and splice.acc.complete and (answer := splice.acc.message()) is not None:
                                stored = True
                                await run_in_threadpool(proxy.store_answer, session_id, answer, at)
                            if out is not None:
                                yield out
                        if late or fault is not None:
                            break
                        nxt = await live.next()
                        if nxt is None:
                            break
                        pending = nxt
                    if late:
                        while await live.next() is not None:
                            pass
                except UNREADABLE as exc:
                    fault = f"upstream stream unusable: {unreadable(exc)}; {RETRY}"
                rnd = live.round()
                if late and fault is None and rnd.complete:
                    await live.up.aclose()
                    current = _extended(current, _exchange(proxy, session_id, rnd, api), api)
                    k += 1
                    splice.next_round()
                    up = await _open(proxy, url, without_tool(current, api) if k == rounds else current, headers, api)
                    if up.status_code >= 400:
                        content = await proxy.read_answer(url, up, api)
                        proxy.metrics.upstream_errors.labels(api, str(up.status_code)).inc()
                        yield stream_error(api, f"upstream error {up.status_code} in a recall round: {content.decode('utf-8', 'replace')[:500]}",
                                           "upstream_error")
                        return
                    live, held = _Live(up, api, acc), []
                    continue
                why = fault or rnd.cut
                if why is not None:
                    proxy.metrics.upstream_errors.labels(api, "malformed_stream" if fault else "stream_cut").inc()
                    await run_in_threadpool(proxy.store_partial, session_id, json.dumps(live.events).encode(), why)
                    yield stream_error(api, why, "upstream_malformed_answer" if fault else "upstream_stream_cut")
                return
        finally:
            await live.up.aclose()

    return StreamingResponse(relay(), live.up.status_code, {**_plain_headers(live.up.headers), **ours})
