"""The Gemini API endpoints (Google's Gemini API reference, ``models`` resource):

* ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (streamed as
  server-sent events with ``?alt=sse``, as Google's SDKs and Gemini CLI ask): the request's
  ``systemInstruction`` and ``contents`` are converted to canonical events
  (:mod:`historygraph.providers.gemini`), routed to a session, rendered under B and forwarded to
  ``{gemini_upstream}/v1beta/models/{model}:{method}`` with every other field (``tools``,
  ``toolConfig``, ``generationConfig``, ``safetySettings`` …) and query parameter unchanged, as the
  module docstring of :mod:`historygraph.server.proxy` describes; the answer (candidate 0) is
  stored when its ``finishReason`` arrives. With the recall tool on, its function is declared and
  its calls answered as on the other APIs (:mod:`historygraph.server.recall_tool`; a stream only
  with ``alt=sse``).
* ``POST /v1beta/models/{model}:countTokens``: ``{"totalTokens": N}``, N = the proxy's token
  counter over the ``contents`` (or ``generateContentRequest``) as they would be forwarded after
  rendering, plus the tools' JSON text, as for Anthropic's ``count_tokens``
  (:meth:`TokenCalibration.estimate_request`); nothing is stored and the upstream is not asked.
* ``GET /v1beta/models`` and ``/v1beta/models/{model}``: passed through to the Gemini upstream.

The API key reaches the upstream as the client sent it: the ``x-goog-api-key`` header, or the
``key`` query parameter, which the proxy's messages and logs show as ``key=***``
(:func:`~historygraph.server.config.masked_url`); never stored. Errors are Google's shape
(:func:`~historygraph.server.errors.google_error`), unknown routes under ``/v1beta/`` too.
"""

from __future__ import annotations

import time
from urllib.parse import quote

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from historygraph import telemetry
from historygraph.providers import gemini as gem
from historygraph.server import recall_tool
from historygraph.server.convert import count_rendered, pieces_shown, prepare_converted
from historygraph.server.errors import SERVED, ClientError, google_error
from historygraph.server.proxy import ARRIVAL
from historygraph.server.threads import run_in_threadpool
from historygraph.server.upstream import forward_headers, response_headers, unreachable_error

GENERATE = ("generateContent", "streamGenerateContent")


def add_routes(app: FastAPI) -> None:
    """Register this module's routes on the proxy's ``app`` (its ``app.state.proxy`` is the
    :class:`~historygraph.server.proxy.Proxy`)."""
    app.add_api_route("/v1beta/models/{target}", model_method, methods=["POST"], tags=["proxy"],
                      summary="Gemini generateContent / streamGenerateContent (rendered and forwarded), countTokens")
    app.add_api_route("/v1beta/models", models, methods=["GET"], tags=["proxy"], summary="Passed through to the Gemini upstream")
    app.add_api_route("/v1beta/models/{target}", models, methods=["GET"], tags=["proxy"],
                      summary="Passed through to the Gemini upstream")


def upstream_url(base: str, path: str, request: Request) -> str:
    """``base`` + ``path`` with the client's query (``alt=sse``, ``key`` …) as it sent it."""
    query = request.url.query
    return base.rstrip("/") + path + ("?" + query if query else "")


async def model_method(request: Request, target: str) -> Response:
    """``POST /v1beta/models/{model}:{method}`` (see the module docstring)."""
    model, _, method = target.rpartition(":")
    try:
        if not model or method not in (*GENERATE, "countTokens"):
            raise ClientError(f"historygraph proxy: no route POST {request.url.path}; it serves {SERVED}", None, 404)
        if method == "countTokens":
            return await count_tokens(request)
        return await generate(request, model, method)
    except ClientError as exc:
        telemetry.finish(getattr(request.state, telemetry.SPAN_STATE, None), exc.status, error=exc.param or "client_error")
        return google_error(exc)


async def generate(request: Request, model: str, method: str) -> Response:
    """``generateContent`` / ``streamGenerateContent``: convert, route, render, forward."""
    proxy = request.app.state.proxy
    started = getattr(request.state, ARRIVAL, None) or time.perf_counter()
    body = await proxy.read_json(request, require="contents")
    span = telemetry.request_span("gcp.gemini", model, started)
    setattr(request.state, telemetry.SPAN_STATE, span)
    sid, policy, budget = proxy.options(request)
    pins = proxy.pin_refs(request)

    sid, rendering, sent_tokens, at, pieces = await run_in_threadpool(
        prepare_converted, proxy, lambda: gem.to_canonical(body.get("systemInstruction"), body["contents"]), "contents",
        sid, policy, budget, pins, span)
    contents = gem.from_canonical(rendering.messages, pieces_shown(rendering, pieces))
    url = upstream_url(proxy.config.gemini_upstream, f"/v1beta/models/{quote(model, safe='')}:{method}", request)
    accumulator = gem.StreamAccumulator.for_turn(len(body["contents"]))
    forwarded = {**body, "contents": contents}
    return await recall_tool.send(proxy, url, forwarded, forwarded, request, sid, started, "gemini", accumulator, sent_tokens,
                                  policy, rendering, at, stream=method == "streamGenerateContent")


async def count_tokens(request: Request) -> Response:
    """``countTokens`` (see the module docstring); the session, policy and budget headers are
    read as for ``generateContent``."""
    proxy = request.app.state.proxy
    body = await proxy.read_json(request, require=None)
    inner = body.get("generateContentRequest")
    source = inner if isinstance(inner, dict) else body
    _, policy, budget = proxy.options(request)

    tokens = await run_in_threadpool(count_rendered, proxy,
                                     lambda: gem.to_canonical(source.get("systemInstruction"), source.get("contents")),
                                     "contents", policy, budget, source.get("tools"))
    return JSONResponse({"totalTokens": tokens})


async def models(request: Request, target: str | None = None) -> Response:
    """``GET /v1beta/models[/{model}]``: passed through to the Gemini upstream."""
    proxy = request.app.state.proxy
    url = upstream_url(proxy.config.gemini_upstream, request.url.path, request)
    try:
        r = await proxy.send(proxy.request("GET", url, headers=forward_headers(request.headers)))
        try:
            content = await r.aread()
        finally:
            await r.aclose()
    except httpx.HTTPError as exc:
        return google_error(unreachable_error(url, exc, "gemini", timeout=proxy.config.timeout))
    return Response(content, r.status_code, response_headers(r.headers))
