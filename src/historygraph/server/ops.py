"""Operations endpoints and request accounting: ``GET /health``, ``GET /metrics`` and the ASGI
middleware that counts and logs every proxied request.

* ``/health``: 200 ``{"status": "ok", "version", "store"}`` when the store answers a query, else
  503 with ``"status": "error"`` and the store's error (for load balancers and orchestrators),
  also while the store's disk is full (``"store": "disk full: <the backend's error>"``, from the
  last write that failed for lack of space until a write succeeds again, :attr:`Store.full`);
* ``/metrics``: the Prometheus text exposition of :class:`~historygraph.server.metrics.ProxyMetrics`.

Neither needs the session API's bearer token (a scraper or probe has none); neither shows stored
content.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from historygraph import __version__

router = APIRouter(tags=["operations"])
log = logging.getLogger("historygraph.server")
PROXY_PATHS = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic", "/v1/responses": "responses"}
GEMINI_METHODS = (":generateContent", ":streamGenerateContent")


def proxy_api(path: str) -> str | None:
    """The API of a proxied request's path (:data:`PROXY_PATHS`; ``gemini`` for
    ``/v1beta/models/{model}:generateContent`` and ``:streamGenerateContent``), else ``None``."""
    api = PROXY_PATHS.get(path)
    if api is None and path.startswith("/v1beta/models/") and path.endswith(GEMINI_METHODS):
        return "gemini"
    return api


@router.get("/health", summary="Liveness and store reachability")
def health(request: Request) -> JSONResponse:
    proxy = request.app.state.proxy
    try:
        proxy.store.has_session("health-check")
    except Exception as exc:  # any failure of the store is what this endpoint reports
        return JSONResponse({"status": "error", "version": __version__, "store": f"{type(exc).__name__}: {exc}"}, 503)
    if proxy.store.full is not None:  # the last write failed for lack of space (until one succeeds)
        return JSONResponse({"status": "error", "version": __version__, "store": f"disk full: {proxy.store.full}"}, 503)
    return JSONResponse({"status": "ok", "version": __version__, "store": "ok"})


@router.get("/metrics", summary="Prometheus metrics (text exposition format)")
def metrics(request: Request) -> Response:
    body, content_type = request.app.state.proxy.metrics.exposition(request.headers.get("accept"))
    return Response(body, headers={"content-type": content_type})


class CountRequests:
    """ASGI middleware: for the proxy endpoints, counts ``historygraph_requests_total{api,
    status}`` and logs one ``"request"`` record (api, status, session from the response header,
    else the one the client sent for a request routed nowhere, duration_ms) when the response starts."""

    def __init__(self, app: Any, metrics: Any) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        api = proxy_api(scope.get("path", "")) if scope["type"] == "http" else None
        if api is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status = int(message["status"])
                self.metrics.requests.labels(api, str(status)).inc()
                headers = dict(message.get("headers") or [])
                session = (headers.get(b"x-historygraph-session", b"").decode("latin-1")  # the session the proxy routed to
                           or scope.get("state", {}).get("historygraph_session")  # (set by Proxy.forward: a 502 has no header)
                           or dict(scope.get("headers") or []).get(b"x-historygraph-session", b"").decode("latin-1")
                           or None)  # a refused request (400) was routed nowhere: the session the client named
                log.info("request", extra={"api": api, "status": status, "session": session,
                                           "duration_ms": round((time.perf_counter() - started) * 1000, 2)})
            await send(message)

        await self.app(scope, receive, counting_send)
