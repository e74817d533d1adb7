"""The Anthropic Messages endpoints: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

* ``POST /v1/messages``: the request's ``system`` and ``messages`` are converted to canonical events
  (:mod:`historygraph.providers.anthropic`; only the turns not seen last time,
  :class:`~historygraph.server.convert.TurnCache`), routed, rendered under B and forwarded as the module docstring of :mod:`historygraph.server.proxy`
  describes; a turn rendered unchanged is sent as the client's original JSON. The client's
  ``cache_control`` breakpoints are kept (on a placeholder for a block it replaces) and, with
  ``serve --cache-breakpoints`` (the default), the proxy adds its own after the tools and system
  prompt, on the opening (the first message), at the end of each generation of a cache-stable
  rendering and on the last message, never more than 4 in all
  (:mod:`historygraph.providers.anthropic_cache`).
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` (Anthropic's shape), N = the
  proxy's token counter (:class:`~historygraph.signals.tokens.TokenCounter`, the counter that
  enforces B) over the messages as they would be forwarded after rendering, plus the tool schemas'
  JSON text (:meth:`TokenCalibration.estimate_request`). Nothing is stored and the upstream is not
  asked.

Errors are Anthropic's shape (:func:`~historygraph.server.errors.anthropic_error`).
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from historygraph import telemetry
from historygraph.providers import anthropic as anth
from historygraph.providers.anthropic_cache import moved_breakpoints, place_breakpoints, requested_ttl
from historygraph.server import recall_tool
from historygraph.server.convert import Converted, TurnCache, count_rendered, pieces_shown, prepare_converted
from historygraph.server.errors import ClientError, anthropic_error
from historygraph.server.proxy import ARRIVAL
from historygraph.server.threads import run_in_threadpool


def add_routes(app: FastAPI) -> None:
    """Register this module's routes on the proxy's ``app`` (its ``app.state.proxy`` is the
    :class:`~historygraph.server.proxy.Proxy`)."""
    app.add_api_route("/v1/messages", messages_endpoint, methods=["POST"], tags=["proxy"],
                      summary="Anthropic Messages, rendered and forwarded")
    app.add_api_route("/v1/messages/count_tokens", count_tokens, methods=["POST"], tags=["proxy"],
                      summary="Anthropic token count of the request as it would be forwarded")


async def messages_endpoint(request: Request) -> Response:
    """``POST /v1/messages`` (see the module docstring)."""
    proxy = request.app.state.proxy
    config = proxy.config
    started = getattr(request.state, ARRIVAL, None) or time.perf_counter()
    span = None
    try:
        body = await proxy.read_json(request, raw_messages=True)
        span = telemetry.request_span("anthropic", body.get("model"), started)
        setattr(request.state, telemetry.SPAN_STATE, span)
        sid, policy, budget = proxy.options(request)
        pins = proxy.pin_refs(request)
        turns, system = body["messages"], body.get("system")

        def convert() -> Converted:  # in the worker thread too: only turns not seen last time are parsed and converted
            return proxy.turns.convert(TurnCache.key(sid, system, turns), system, turns)

        sid, rendering, sent_tokens, at, pieces = await run_in_threadpool(
            prepare_converted, proxy, convert, "messages", sid, policy, budget, pins, span, requested_ttl(body))
        places: list[tuple[int, int] | None] = [None] * len(rendering.messages)
        out = anth.from_canonical(rendering.messages, pieces_shown(rendering, pieces), moved_breakpoints(rendering.positions, pieces),
                                  places)
        url = config.anthropic_upstream.rstrip("/") + "/v1/messages"
        forwarded = {**body, "messages": out}
        if config.cache_breakpoints:
            ends = [anth.boundary_block(places, b) for b in rendering.stats.get("cache_boundaries", ())]
            forwarded = place_breakpoints(forwarded, [w for w in ends if w is not None],
                                          rendering.stats.get("cache_stable") == "collected" or "tenure" in rendering.stats,
                                          bool(rendering.stats.get("cache_young_ttl")),
                                          bool(rendering.stats.get("cache_old_ttl")))
        return await recall_tool.send(proxy, url, forwarded, forwarded, request, sid, started, "anthropic",
                                      anth.StreamAccumulator, sent_tokens, policy, rendering, at)
    except ClientError as exc:
        telemetry.finish(span, exc.status, error=exc.param or "client_error")
        return anthropic_error(exc)


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens`` (see the module docstring); the session header, policy
    and budget headers are read as for ``/v1/messages``."""
    proxy = request.app.state.proxy
    try:
        body = await proxy.read_json(request)
        _, policy, budget = proxy.options(request)

        tokens = await run_in_threadpool(count_rendered, proxy, lambda: anth.to_canonical(body.get("system"), body["messages"]),
                                         "messages", policy, budget, body.get("tools"))
        return JSONResponse({"input_tokens": tokens})
    except ClientError as exc:
        return anthropic_error(exc)
