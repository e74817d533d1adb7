"""A recording pass-through in front of ``historygraph serve`` for the ``clients`` tests: every
request an agent program makes (any method, any path, streamed or not) goes on to the proxy
unchanged and the answer comes back unchanged, byte for byte as it streams; the method, path and
status of each (and the JSON body of each model call) are kept at ``GET /_tap`` (cleared by ``POST /_tap/reset``), so a test sees every
4xx/5xx the proxy gave, on routes the proxy does not serve too. A test double, run as a process:
``python tests/clients/tap.py --port N --to http://127.0.0.1:M``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL_CALLS = ("/v1/chat/completions", "/v1/messages", "/v1/responses")  # their request bodies are kept too
GEMINI_CALLS = (":generateContent", ":streamGenerateContent")  # /v1beta/models/{model}:…, kept too
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}


def build_app(target: str) -> Starlette:
    seen: list[dict[str, Any]] = []
    client = httpx.AsyncClient(base_url=target, timeout=httpx.Timeout(600.0, connect=10.0))

    async def tap(request: Request) -> Any:
        if request.url.path == "/_tap":
            return JSONResponse(seen)
        if request.url.path == "/_tap/reset":
            seen.clear()
            return JSONResponse({"cleared": 1})
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
        content = await request.body()
        upstream = await client.send(client.build_request(request.method, request.url.path, params=request.query_params,
                                                           headers=headers, content=content), stream=True)
        seen.append({"method": request.method, "path": request.url.path, "status": upstream.status_code, "bytes": len(content)})
        if request.url.path in MODEL_CALLS or request.url.path.endswith(GEMINI_CALLS):
            seen[-1]["request"] = json.loads(content)
        out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
        if upstream.status_code >= 400:
            body = await upstream.aread()
            seen[-1]["body"] = body[:2000].decode("utf-8", "replace")
            await upstream.aclose()
            return Response(body, upstream.status_code, out)
        return StreamingResponse(upstream.aiter_raw(), upstream.status_code, out, background=_closer(upstream))

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", tap, methods=methods)])


def _closer(upstream: httpx.Response) -> Any:
    from starlette.background import BackgroundTask

    return BackgroundTask(upstream.aclose)


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--to", required=True, help="the proxy's base URL")
    args = ap.parse_args()
    uvicorn.run(build_app(args.to), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
