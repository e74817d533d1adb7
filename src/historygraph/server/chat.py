"""The OpenAI Chat Completions endpoint (``POST /v1/chat/completions``) and the model list
(``GET /v1/models``, passed through to the upstream of the client's API).

A chat request is handled as the module docstring of :mod:`historygraph.server.proxy` describes:
its ``messages`` are parsed only as far as routing needs
(:class:`~historygraph.providers.openai_chat.RequestMessages`), routed,
rendered under B and forwarded; a message rendered unchanged is sent as the client's original JSON.
A client that restates its tool calls as text (smolagents) is read as the calls and results they
stand for, rendered under B less the echoes' framing, and sent back in its own form
(:mod:`historygraph.providers.text_calls`).
Errors are OpenAI's shape (:func:`~historygraph.server.errors.openai_error`).
"""

from __future__ import annotations

import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response

from historygraph import telemetry
from historygraph.render import Rendering
from historygraph.providers import jsonio, text_calls
from historygraph.providers.openai_chat import RequestMessages
from historygraph.server import recall_tool
from historygraph.server.errors import ClientError, openai_error
from historygraph.server.proxy import ARRIVAL
from historygraph.server.threads import run_in_threadpool
from historygraph.server.upstream import OpenAIStreamAccumulator, forward_headers, response_headers, unreachable_error


def add_routes(app: FastAPI) -> None:
    """Register this module's routes on the proxy's ``app`` (its ``app.state.proxy`` is the
    :class:`~historygraph.server.proxy.Proxy`)."""
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"], tags=["proxy"],
                      summary="OpenAI Chat Completions, rendered and forwarded")
    app.add_api_route("/v1/models", models, methods=["GET"], tags=["proxy"],
                      summary="Passed through to the upstream (Anthropic's for an Anthropic client)")
    app.add_api_route("/v1/models/{model_id:path}", models, methods=["GET"], tags=["proxy"],
                      summary="Passed through to the upstream")


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    proxy = request.app.state.proxy
    config = proxy.config
    started = getattr(request.state, ARRIVAL, None) or time.perf_counter()
    span = None
    try:
        body = await proxy.read_json(request, raw_messages=True)
        raw = body["messages"]
        span = telemetry.request_span("openai", body.get("model"), started)
        setattr(request.state, telemetry.SPAN_STATE, span)
        sid, policy, budget = proxy.options(request)
        pins = proxy.pin_refs(request)

        def read_and_prepare() -> tuple[str, Rendering, int, int, text_calls.TextCalls | None]:
            # in the worker thread, and parsed only as far as routing needs (openai_chat.RequestMessages)
            echoes = text_calls.read(raw, proxy.signals.counter.count_message)
            b = budget if echoes is None else max(1, budget - echoes.framing)  # what is forwarded stays within B
            return (*proxy.prepare(RequestMessages(raw, echoes.events if echoes else None), sid, policy, b, pins, span), echoes)

        sid, rendering, sent_tokens, at, echoes = await run_in_threadpool(read_and_prepare)
        out = [raw[p] if p is not None and p < len(raw) and m.rendered_as is None
               else (echoes is not None and text_calls.client_form(m, echoes)) or m.to_openai()
               for m, p in zip(rendering.messages, rendering.positions)]
        url = config.upstream.rstrip("/") + "/chat/completions"
        # the recall tool reads and extends the messages: plain values for it, raw JSON otherwise
        return await recall_tool.send(proxy, url, {**body, "messages": out}, {**body, "messages": jsonio.plain(out)}, request,
                                      sid, started, "openai", OpenAIStreamAccumulator, sent_tokens, policy, rendering, at)
    except ClientError as exc:
        telemetry.finish(span, exc.status, error=exc.param or "client_error")
        return openai_error(exc)


async def models(request: Request) -> Response:
    """``GET /v1/models[/{id}]``: an Anthropic client (its ``anthropic-version`` header) lists the
    Anthropic upstream's models, any other the OpenAI-compatible upstream's."""
    proxy = request.app.state.proxy
    config = proxy.config
    anthropic = "anthropic-version" in request.headers
    base = config.anthropic_upstream.rstrip("/") + "/v1" if anthropic else config.upstream.rstrip("/")
    url = base + request.url.path.removeprefix("/v1")
    try:
        r = await proxy.send(proxy.request("GET", url, headers=forward_headers(request.headers),
                                           params=list(request.query_params.multi_items())))
        try:
            content = await r.aread()
        finally:
            await r.aclose()
    except httpx.HTTPError as exc:
        return openai_error(unreachable_error(url, exc, "anthropic" if anthropic else "openai", timeout=config.timeout))
    return Response(content, r.status_code, response_headers(r.headers))
