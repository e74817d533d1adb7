"""The ASGI app of ``historygraph serve``: :func:`create_app` assembles the proxy's endpoints, the
session API and the operations routes around one :class:`~historygraph.server.proxy.Proxy`, with
its middleware (:class:`Arrival`, :class:`SizeLimit`, request counting) and its lifespan (the
upstream transport and the store closed at shutdown).

Where each part lives: :mod:`.config` (settings and the table of serve defaults), :mod:`.proxy`
(the per-request pipeline: route, store, render, forward, relay), :mod:`.errors` (the provider-
shaped error bodies), :mod:`.chat` (OpenAI Chat Completions, models), :mod:`.messages` (Anthropic
Messages, token counting), :mod:`.responses` (OpenAI Responses), :mod:`.api` (session API),
:mod:`.ops` (health, metrics), :mod:`.recall_tool`, :mod:`.upstream` (headers, SSE parsing).
"""

from __future__ import annotations

import json
import os
import time
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException

from historygraph.server import chat, gemini, messages, responses
from historygraph.server.api import EncodedSegments
from historygraph.server.api import router as api_router
from historygraph.server.config import CONFIG_ENV, LOG_ENV, ServerConfig
from historygraph.server.errors import ClientError, anthropic_error, google_error, not_found, openai_error, too_large
from historygraph.server.ops import CountRequests
from historygraph.server.ops import router as ops_router
from historygraph.server.proxy import ARRIVAL, Proxy
from historygraph.store import Store

GC_THRESHOLDS = (50_000, 20, 20)
"""Collector thresholds of a serving process (CPython's defaults: 700, 10, 10). A proxied request
allocates tens of thousands of short-lived objects (the request's JSON, events, the rendering),
so with the defaults a young collection ran about every 0.4 requests and a full one, which walks
every cached session's graph, every few dozen: 1.1–1.2 of 9.5–10.5 CPU ms per request
(``python bench/proxy_profile.py --breakdown``, prune, 200-message sessions), 0.1 ms with these."""


def tune_gc() -> None:
    """For a serving process, once the app is built: move everything allocated so far (modules,
    routes, tokenizer tables) out of the collector's reach (``gc.freeze``) and collect less often
    (:data:`GC_THRESHOLDS`). Reference counting still frees nearly everything at once; only
    cyclic garbage waits longer."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def create_app_from_env() -> FastAPI:
    """The app built from the :class:`ServerConfig` JSON in ``$HISTORYGRAPH_SERVE_CONFIG``: the
    factory each worker process calls when ``historygraph serve --workers N`` runs several
    (:func:`historygraph.server.workers.run_workers`, or uvicorn's multi-process mode, needs an import string, not an app object). The workers are
    spawned, not forked, so each configures its own logs from ``$HISTORYGRAPH_SERVE_LOG``."""
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        raise RuntimeError(f"${CONFIG_ENV} is not set (it is set by historygraph serve --workers)")
    if logs := os.environ.get(LOG_ENV):
        from historygraph.server.logs import configure

        opts = json.loads(logs)
        configure(opts["level"], json=opts["json"])
    app = create_app(ServerConfig(**json.loads(raw)))
    tune_gc()
    return app


def create_app(config: ServerConfig | None = None, store: Store | None = None) -> FastAPI:
    """The ASGI app: the proxy endpoints and the session API (:mod:`historygraph.server.api`)."""
    config = config or ServerConfig()
    proxy = Proxy(config, store)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await proxy.transport.aclose()
        proxy.store.close()

    app = FastAPI(title="historygraph", version="0.1.0", lifespan=lifespan,
                  description="OpenAI- and Anthropic-compatible proxy that renders each session's stored history "
                              "under a token budget, and a session API (append, render, read, fetch results).")
    app.state.proxy = proxy
    chat.add_routes(app)  # /v1/chat/completions, /v1/models
    messages.add_routes(app)  # /v1/messages, /v1/messages/count_tokens
    responses.add_routes(app)  # /v1/responses
    gemini.add_routes(app)  # /v1beta/models/{model}:generateContent, :streamGenerateContent, :countTokens; /v1beta/models
    app.add_exception_handler(HTTPException, not_found)  # provider-shaped 404s and 405s under /v1/
    app.include_router(api_router)
    app.include_router(ops_router)
    app.add_middleware(EncodedSegments)  # session ids holding "/" (sent as %2F) stay one path segment
    app.add_middleware(SizeLimit, limit=config.max_body_bytes)
    app.add_middleware(CountRequests, metrics=proxy.metrics)
    app.add_middleware(Arrival)  # added last: outermost
    return app


class Arrival:
    """ASGI middleware, outermost: stamps ``scope["state"][ARRIVAL]`` when a request reaches the
    application, before any other middleware, routing or reading of the body, so that
    ``X-HistoryGraph-Proxy-Ms`` includes the time a request waits behind others in this process."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[ARRIVAL] = time.perf_counter()
        await self.app(scope, receive, send)


class SizeLimit:
    """ASGI middleware: 413 for a declared ``Content-Length`` over ``limit`` bytes, before the body
    is read (bodies without one are counted while read by :meth:`Proxy.read_json`)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"")
            if length.isdigit() and int(length) > self.limit:
                err = ClientError(too_large(self.limit), "body", 413)
                path = scope["path"]
                response = (anthropic_error(err) if path.startswith("/v1/messages") else google_error(err)
                            if path.startswith("/v1beta/") else openai_error(err))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
