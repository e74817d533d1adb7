"""The recall tool: the model fetches tool results that a rendering omitted, and the proxy answers.

Opt-in (``historygraph serve --recall``, or ``X-HistoryGraph-Recall: on`` per request; ``off``
turns it off for one request). When the rendering of a request omitted tool results (their
placeholders name the ids), the proxy adds one tool to the request, :data:`TOOL_NAME`, taking
``{"ids": [...]}``. When the model's answer calls it, the proxy answers the call itself: it appends
the model's turn and, for each call, the complete stored results (each cut to ``recall_max_tokens``
tokens, marked), and calls the upstream again, up to ``recall_rounds`` times; the last of those
calls is sent without the tool, so the model answers. Calls to the client's own tools made in the
same turn are answered ``not run`` (the model sees its recalled results and calls them again if it
still needs them). The client receives only the final answer and never sees the tool; only that
answer is stored, so the client's next request still continues the stored session.

Streams: each round is streamed from the upstream and buffered; the final round's stream is then
relayed as received (the client sees it once the upstream has finished it, not chunk by chunk).
Usage figures in the answer are those of the final round.
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
from historygraph.render import Rendering
from historygraph.signals.calibration import anthropic_usage, openai_usage
from historygraph.server.errors import RETRY, ClientError, not_json, stream_error, upstream_fault
from historygraph.server.proxy import UNREADABLE, answer_of, unreadable
from historygraph.server.upstream import OpenAIStreamAccumulator, SSEParser, forward_headers, response_headers, unreachable_message

TOOL_NAME = "historygraph_recall"
DESCRIPTION = ("Fetch the complete text of earlier tool results that this conversation shows only as a "
               "placeholder ('[tool result ID omitted from this context ...]'), or of the messages an "
               "'[omitted: messages #A–#B, ...]' marker stands for. Pass the result ids, or '#A–#B'.")
PARAMETERS = {"type": "object", "properties": {"ids": {"type": "array", "items": {"type": "string"},
                                                        "description": "tool result ids named by placeholders, "
                                                                       "or message spans '#A–#B' named by markers"}},
              "required": ["ids"]}
NOT_RUN = "[not run: this call was made together with {tool}; the recalled results are above, call it again if still needed]"
HEADER = "x-historygraph-recall"


def wanted(enabled: bool, request: Request, rendering: Rendering) -> bool:
    """Whether to offer the tool: on (config or header) and the rendering omitted something."""
    raw = (request.headers.get(HEADER) or "").strip().lower()
    on = raw in ("on", "1", "true", "yes") or (enabled and raw not in ("off", "0", "false", "no"))
    return on and bool(rendering.omitted)


async def send(proxy: Any, url: str, body: dict[str, Any], recall_body: dict[str, Any], request: Request, sid: str,
               started: float, api: str, accumulator: Any, sent_tokens: int, policy: str, rendering: Rendering) -> Response:
    """Forward a rendered request (``body``) as the proxy does, or, when the recall tool is wanted
    for it (:func:`wanted`), ``recall_body`` through :func:`forward`; either way the rendering's
    notes (:meth:`~historygraph.server.proxy.Proxy.notes`) become response headers."""
    if wanted(proxy.config.recall, request, rendering):
        answer = await forward(proxy, url, recall_body, request, sid, started, api)
        answer.headers.update(proxy.notes(rendering, sid))
        telemetry.finish(getattr(request.state, telemetry.SPAN_STATE, None), answer.status_code)
        return answer
    return await proxy.forward(url, body, request, sid, started, accumulator, sent_tokens, policy, extra=proxy.notes(rendering, sid))


def with_tool(body: dict[str, Any], api: str) -> dict[str, Any]:
    """``body`` with the recall tool appended to its ``tools``."""
    tool = ({"type": "function", "function": {"name": TOOL_NAME, "description": DESCRIPTION, "parameters": PARAMETERS}}
            if api == "openai" else {"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": PARAMETERS})
    return {**body, "tools": [*(body.get("tools") or []), tool]}


def without_tool(body: dict[str, Any], api: str) -> dict[str, Any]:
    def name(t: dict[str, Any]) -> Any:
        return (t.get("function") or {}).get("name") if api == "openai" else t.get("name")
    tools = [t for t in body.get("tools") or [] if name(t) != TOOL_NAME]
    out = {k: v for k, v in body.items() if k != "tools"}
    return {**out, "tools": tools} if tools else {k: v for k, v in out.items() if k != "tool_choice"}


def recalled_text(proxy: Any, session_id: str, arguments: str) -> str:
    """The answer to one recall call: each requested result's complete stored text, or the stored
    messages of a span a marker names (:meth:`~historygraph.history.graph.ContextGraph.recall_text`), each
    cut to ``recall_max_tokens`` tokens with a marker, or why it cannot be given."""
    try:
        ids = json.loads(arguments or "{}").get("ids")
    except (json.JSONDecodeError, AttributeError):
        ids = None
    if isinstance(ids, str):
        ids = [ids]
    if not isinstance(ids, list) or not ids or not all(isinstance(i, str) for i in ids):
        return f'[{TOOL_NAME}: pass {{"ids": ["<tool result id>", ...]}} with the ids the placeholders name]'
    graph = proxy.store.graph(session_id)
    limit, counter = proxy.config.recall_max_tokens, proxy.signals.counter
    parts = []
    for i in ids:
        try:
            text = graph.recall_text(i)
        except KeyError as exc:
            parts.append(f"[{exc.args[0]}]")
            continue
        n = counter.count(text)
        what = f"tool result {i}" if i in graph.result_of else f"messages {i}"
        if n > limit:
            text = counter.truncate(text, limit) + f"\n[... cut: {limit} of {n} tokens of {what} shown]"
        parts.append(text if len(ids) == 1 else f"{what}:\n{text}")
    return "\n\n".join(parts)


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
    """One upstream call: status, headers, raw bytes (chunks when streamed) and the answer."""

    def __init__(self, status: int, headers: Any, chunks: list[bytes], answer: Message | None,
                 turn: dict[str, Any] | None, complete: bool, cut: str | None = None) -> None:
        self.status, self.headers, self.chunks, self.answer = status, headers, chunks, answer
        self.turn, self.complete, self.cut = turn, complete, cut

    @property
    def recall_calls(self) -> list[Any]:
        return [c for c in (self.answer.tool_calls if self.answer else ()) if c.name == TOOL_NAME]


async def _call(proxy: Any, url: str, body: dict[str, Any], headers: dict[str, str], api: str) -> _Round:
    acc_cls = OpenAIStreamAccumulator if api == "openai" else anth.StreamAccumulator
    req = proxy.request("POST", url, json=body, headers=headers)
    try:
        up = await proxy.send(req)
    except httpx.HTTPError as exc:
        proxy.metrics.upstream_errors.labels(api, "unreachable").inc()
        raise ClientError(unreachable_message(url, exc, api, proxy.config.timeout), "upstream", 502) from None
    try:
        if up.status_code >= 400 or not body.get("stream"):
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
            answer = answer_of(data, acc_cls)
            if api == "openai":
                m = data["choices"][0]["message"]
                turn: dict[str, Any] | None = {"role": "assistant", "content": m.get("content"), **({"tool_calls": m["tool_calls"]} if m.get("tool_calls") else {})}
            else:
                turn = {"role": "assistant", "content": data.get("content") or []}
            return _Round(up.status_code, up.headers, [content], answer, turn, True)
        parser, acc, chunks, events = SSEParser(), acc_cls(), [], []
        cut = None
        try:
            try:
                async for chunk in up.aiter_raw():
                    chunks.append(chunk)
                    for event in parser.feed(chunk):
                        acc.feed(event)
                        events.append(event)
            except httpx.HTTPError as exc:
                cut = str(exc)
            answer = acc.message() if acc.complete else None
        except UNREADABLE as exc:  # relayed as a cut, without the chunk that made it unreadable: never stored
            proxy.metrics.upstream_errors.labels(api, "malformed_stream").inc()
            chunks.pop()
            return _Round(up.status_code, up.headers, chunks, None, None, False, f"upstream stream unusable: {unreadable(exc)}; {RETRY}")
        if not acc.complete and cut is None:
            cut = "the upstream closed the stream before its final event"
        turn = None
        if answer is not None:
            turn = ({"role": "assistant", "content": answer.content or None,
                     **({"tool_calls": [c.to_openai() for c in answer.tool_calls]} if answer.tool_calls else {})}
                    if api == "openai" else {"role": "assistant", "content": _anthropic_blocks(events)})
        return _Round(up.status_code, up.headers, chunks, answer, turn, acc.complete,
                      None if acc.complete else f"upstream stream cut mid-way: {cut}")
    finally:
        await up.aclose()


def _exchange(proxy: Any, session_id: str, rnd: _Round, api: str) -> list[dict[str, Any]]:
    """The model's turn and the answers to its calls, in the API's form."""
    assert rnd.answer is not None and rnd.turn is not None
    answers = []
    for c in rnd.answer.tool_calls:
        text = recalled_text(proxy, session_id, c.arguments) if c.name == TOOL_NAME else NOT_RUN.format(tool=TOOL_NAME)
        answers.append((c.id, text))
    proxy.metrics.recall_calls.labels(api).inc(len(rnd.recall_calls))
    if api == "openai":
        return [rnd.turn, *({"role": "tool", "tool_call_id": i, "content": t} for i, t in answers)]
    return [rnd.turn, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": t} for i, t in answers]}]


async def forward(proxy: Any, url: str, body: dict[str, Any], request: Request, session_id: str, started: float,
                  api: str) -> Response:
    """Forward ``body`` with the recall tool, answering its calls (see the module docstring)."""
    headers = forward_headers(request.headers)
    ours = {"x-historygraph-session": session_id}
    rounds = proxy.config.recall_rounds
    current = with_tool(body, api)
    upstream_s = 0.0
    for k in range(rounds + 1):
        last = k == rounds
        t_up = time.perf_counter()
        rnd = await _call(proxy, url, without_tool(current, api) if last else current, headers, api)
        upstream_s += time.perf_counter() - t_up
        if rnd.status < 400 and rnd.complete and rnd.recall_calls and not last:
            current = {**current, "messages": [*current["messages"], *_exchange(proxy, session_id, rnd, api)]}
            continue
        break
    if rnd.status < 400 and rnd.answer is not None:
        if not body.get("stream"):  # (a streamed answer's usage is read by the stream relay)
            try:
                data = json.loads(b"".join(rnd.chunks))
            except ValueError:
                data = None
            proxy.observe_usage(body, openai_usage(data) if api == "openai" else anthropic_usage(data), api=api)
        await run_in_threadpool(proxy.store_answer, session_id, rnd.answer)
    out_headers = {k: v for k, v in response_headers(rnd.headers).items() if k.lower() != "content-encoding"}
    if rnd.status >= 400 or not body.get("stream"):
        proxy_ms = (time.perf_counter() - started - upstream_s) * 1000
        return Response(b"".join(rnd.chunks), rnd.status, {**out_headers, **ours, "x-historygraph-proxy-ms": f"{proxy_ms:.2f}"})
    if rnd.cut is not None:
        proxy.metrics.upstream_errors.labels(api, "stream_cut").inc()
        await run_in_threadpool(proxy.store_partial, session_id, b"".join(rnd.chunks), rnd.cut)
        rnd.chunks.append(stream_error(api, rnd.cut, "upstream_stream_cut"))

    async def relay():
        for chunk in rnd.chunks:
            yield chunk

    return StreamingResponse(relay(), rnd.status, {**out_headers, **ours})
