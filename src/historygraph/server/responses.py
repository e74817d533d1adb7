"""The OpenAI Responses API endpoint.

``POST /v1/responses``: the request's ``instructions`` and ``input`` are converted to canonical
events (:mod:`historygraph.providers.openai_responses`), routed to a session, rendered under B and
forwarded with every other field unchanged (``tools``, ``tool_choice``, ``store``, ``include``,
``reasoning`` …), streamed or not, exactly as the other two APIs (:meth:`Proxy.forward`; with the
recall tool when it is on, :mod:`historygraph.server.recall_tool`). A request
that names state the provider keeps (``previous_response_id``, ``conversation``) or sends no
``input`` is forwarded byte for byte, stores nothing, and is marked
``X-HistoryGraph-Passthrough: <field>`` and logged.

Errors are OpenAI's shape (:func:`~historygraph.server.errors.openai_error`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.background import BackgroundTask

from historygraph import telemetry
from historygraph.providers import openai_responses as resp
from historygraph.server import recall_tool
from historygraph.server.convert import pieces_shown, prepare_converted
from historygraph.server.errors import ClientError, openai_error
from historygraph.server.proxy import ARRIVAL
from historygraph.server.threads import run_in_threadpool
from historygraph.server.upstream import forward_headers, response_headers, unreachable_error

log = logging.getLogger("historygraph.server")

PASSTHROUGH_HEADER = "x-historygraph-passthrough"


def add_routes(app: FastAPI) -> None:
    """Register this module's route on the proxy's ``app`` (its ``app.state.proxy`` is the
    :class:`~historygraph.server.proxy.Proxy`)."""
    app.add_api_route("/v1/responses", create_response, methods=["POST"], tags=["proxy"],
                      summary="OpenAI Responses, rendered and forwarded")


async def create_response(request: Request) -> Response:
    """``POST /v1/responses`` (see the module docstring)."""
    proxy = request.app.state.proxy
    started = getattr(request.state, ARRIVAL, None) or time.perf_counter()
    url = proxy.config.upstream.rstrip("/") + "/responses"
    span = None
    try:
        body = await proxy.read_json(request, require=None)
        reason = resp.passthrough_reason(body) or (None if body.get("input") else "input")
        if reason is not None:
            return await passthrough(proxy, request, url, reason)
        span = telemetry.request_span("openai", body.get("model"), started)
        setattr(request.state, telemetry.SPAN_STATE, span)
        sid, policy, budget = proxy.options(request)
        pins = proxy.pin_refs(request)

        sid, rendering, sent_tokens, at, pieces = await run_in_threadpool(
            prepare_converted, proxy, lambda: resp.to_canonical(body.get("instructions"), body["input"]), "input",
            sid, policy, budget, pins, span)
        items = body["input"] if isinstance(body["input"], str) else resp.from_canonical(
            rendering.messages, pieces_shown(rendering, pieces))
        forwarded = {**body, "input": items}
        return await recall_tool.send(proxy, url, forwarded, forwarded, request, sid, started, "responses",
                                      resp.StreamAccumulator, sent_tokens, policy, rendering, at)
    except ClientError as exc:
        telemetry.finish(span, exc.status, error=exc.param or "client_error")
        return openai_error(exc)


async def passthrough(proxy: Any, request: Request, url: str, reason: str) -> Response:
    """Forward the request's body byte for byte to ``url`` and relay the answer (streamed as it
    arrives when it is an event stream), marked ``X-HistoryGraph-Passthrough: <reason>``; nothing
    is stored."""
    log.info("passthrough", extra={"reason": reason, "path": request.url.path})
    headers = forward_headers(request.headers)
    headers.setdefault("content-type", "application/json")
    try:
        up = await proxy.send(proxy.request("POST", url, content=request.state.historygraph_body, headers=headers))
    except httpx.HTTPError as exc:
        raise unreachable_error(url, exc, timeout=proxy.config.timeout) from None
    ours = {PASSTHROUGH_HEADER: reason}
    if up.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(up.aiter_raw(), up.status_code, {**response_headers(up.headers), **ours},
                                 background=BackgroundTask(up.aclose))
    try:
        content = await up.aread()
    finally:
        await up.aclose()
    return Response(content, up.status_code, {**response_headers(up.headers), **ours})
