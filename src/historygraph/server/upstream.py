"""Talking to the upstream model provider: header forwarding, SSE parsing, answer accumulation.

Header rule: every request header is forwarded except hop-by-hop headers, ``host``,
``content-length`` and the proxy's own ``x-historygraph-*`` headers; ``accept-encoding`` is set to
``identity`` so streamed bytes can be read as they are relayed. API keys (``authorization``,
``x-api-key``, ``x-goog-api-key``) therefore reach the provider and are never stored or logged by the proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from functools import lru_cache
from typing import Any, Iterator
from urllib.parse import urlsplit

import aiohttp
import httpx

from historygraph.history.events import EventError, Message
from historygraph.providers.anthropic_cache import EXTENDED_TTL_BETA, asks_hour
from historygraph.server.config import masked_url
from historygraph.server.errors import ClientError
from historygraph.signals.calibration import Usage, openai_usage

_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
                 "proxy-authorization", "proxy-connection", "accept-encoding"}
_DROP_RESPONSE = {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}


def forward_headers(headers: Any, body: Any = None) -> dict[str, str]:
    """Request headers for the upstream call (see module docstring). ``body``: the request to send;
    an Anthropic Messages request with a 1-hour breakpoint (the client's, or the proxy's rule 6,
    :mod:`historygraph.providers.anthropic_cache`) gets :data:`~historygraph.providers.anthropic_cache.EXTENDED_TTL_BETA`
    added to its ``anthropic-beta`` header when the client did not send it."""
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP_REQUEST and not k.lower().startswith("x-historygraph-")}
    out["accept-encoding"] = "identity"
    if isinstance(body, dict) and "messages" in body and asks_hour(body):
        key = next((k for k in out if k.lower() == "anthropic-beta"), "anthropic-beta")
        betas = [b.strip() for b in out.get(key, "").split(",") if b.strip()]
        if EXTENDED_TTL_BETA not in betas:
            out[key] = ",".join([*betas, EXTENDED_TTL_BETA])
    return out


def response_headers(headers: Any) -> dict[str, str]:
    """Upstream response headers worth returning to the client (request ids, rate limits, type)."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_RESPONSE}


UPSTREAM_OPTION = {"openai": "historygraph serve --upstream", "responses": "historygraph serve --upstream",
                   "anthropic": "historygraph serve --anthropic-upstream", "gemini": "historygraph serve --gemini-upstream"}


def unreachable_message(url: str, exc: BaseException, api: str = "openai", timeout: float | None = None) -> str:
    """The 502 message for an upstream request that got no answer: ``url``, why in words (from the
    socket error at the root of ``exc``'s chain, e.g. aiohttp's ``ClientConnectorError`` under
    httpx's), and what to check: the ``historygraph serve`` option naming the upstream of ``api``
    (``"openai"`` or ``"anthropic"``), or for a timeout ``--timeout`` (``timeout``: its seconds).
    Credentials in ``url`` are never shown (:func:`~historygraph.server.config.masked_url`).
    aiohttp's own text ("Cannot connect to host … ssl:default") names neither the URL nor whether
    TLS was used, so it is not quoted."""
    parts = urlsplit(url)
    address = parts.netloc.rpartition("@")[2] or url  # never the credentials a URL may carry
    secrets = [s for s in (parts.password, parts.username) if s]
    url = masked_url(url)
    root: BaseException = exc
    seen: set[int] = set()
    while id(root) not in seen:  # the innermost cause: the OS or TLS error when there is one
        seen.add(id(root))
        inner = getattr(root, "os_error", None) or root.__cause__ or root.__context__
        if inner is None:
            break
        root = inner
    if isinstance(root, ConnectionRefusedError):
        why = f"connection refused at {address} (nothing listens there)"
    elif isinstance(root, socket.gaierror):
        why = f"the host name {parts.hostname!r} could not be resolved"
    elif isinstance(root, ssl.SSLError):
        why = f"the TLS handshake with {address} failed ({root.reason or root}); for a plain-http server the URL must start with http://"
    elif isinstance(root, (TimeoutError, asyncio.TimeoutError)) or (isinstance(exc, httpx.TimeoutException) and root is exc):
        within = f" within {timeout:g} s" if timeout is not None else " in time"
        return (f"upstream {url} timed out: no answer{within} (historygraph serve --timeout); check that the provider "
                f"at that address is up and not overloaded, or allow it longer")
    elif isinstance(root, OSError) and root.strerror:
        why = f"{root.strerror} ({address})"
    else:
        why = f"{type(root).__name__}: {root}" if str(root) else type(root).__name__
    for secret in secrets:  # an error text that quotes the URL
        why = why.replace(secret, "***")
    return f"upstream {url} unreachable: {why}; check that the provider runs at that address and that {UPSTREAM_OPTION[api]} names it"


log = logging.getLogger("historygraph.server")


def unreachable_error(url: str, exc: BaseException, api: str = "openai", timeout: float | None = None,
                      session: str | None = None) -> ClientError:
    """The 502 :class:`ClientError` for an upstream request that got no answer, with
    :func:`unreachable_message` (credentials masked), logged as a WARNING ``"upstream unreachable"``
    record with ``api``, ``session`` (when known) and that message as ``reason``: an operator sees
    why in the log, not only the ``"request"`` record's status 502."""
    message = unreachable_message(url, exc, api, timeout)
    log.warning("upstream unreachable", extra={"api": api, "session": session, "reason": message})
    return ClientError(message, "upstream", 502)


class SSEParser:
    """Incremental Server-Sent Events parser: :meth:`feed` bytes, get each complete event's
    ``data`` parsed as JSON (``"[DONE]"`` is returned as the string itself; unparsable data is
    skipped, since the bytes are relayed to the client regardless)."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[Any]:
        self._buf += chunk
        while True:
            cut = self._buf.find(b"\n")
            if cut < 0:
                return
            line, self._buf = self._buf[:cut].rstrip(b"\r").decode("utf-8", "replace"), self._buf[cut + 1:]
            if line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
            elif not line and self._data:
                data, self._data = "\n".join(self._data), []
                if data == "[DONE]":
                    yield data
                    continue
                try:
                    yield json.loads(data)
                except json.JSONDecodeError:
                    continue


class OpenAIStreamAccumulator:
    """Rebuilds the assistant message of a Chat Completions stream (choice 0): content deltas are
    concatenated, tool-call deltas merged by ``index`` (id and name from the first delta, argument
    text concatenated). :meth:`message` is ``None`` until a ``finish_reason`` or ``[DONE]`` came."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.complete = False
        self.usage: Usage | None = None  # from the include_usage chunk, when the client asked for it

    def feed(self, event: Any) -> None:
        if event == "[DONE]":
            self.complete = True
            return
        if not isinstance(event, dict):
            return
        self.usage = openai_usage(event) or self.usage
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta.get("content"), str):
                self.content.append(delta["content"])
            for tc in delta.get("tool_calls") or ():
                slot = self.calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": []})
                slot["id"] = slot["id"] or tc.get("id")
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"].append(fn.get("arguments") or "")
            if choice.get("finish_reason"):
                self.complete = True

    def message(self) -> Message | None:
        if not self.complete:
            return None
        calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
                 for _, c in sorted(self.calls.items())]
        try:
            return Message.from_openai({"role": "assistant", "content": "".join(self.content), "tool_calls": calls})
        except EventError:
            return None


@lru_cache(maxsize=64)
def parsed_url(url: str) -> httpx.URL:
    """``httpx.URL(url)``, parsed once per URL: a request goes to one of a handful (the configured
    upstreams' endpoints), and parsing took half of building an ``httpx.Request``."""
    return httpx.URL(url)


UPSTREAM_MAX_CONNECTIONS = 1000
UPSTREAM_KEEPALIVE_S = 4.0
"""Idle upstream connections are dropped after this many seconds, before the 5 s keep-alive
timeout of uvicorn and similar servers closes one just as it is reused (a ReadError: 502)."""


def upstream_session() -> aiohttp.ClientSession:
    """The aiohttp session of the upstream transport (opened on the first upstream request, in the
    event loop): at most :data:`UPSTREAM_MAX_CONNECTIONS` connections, idle ones closed after
    :data:`UPSTREAM_KEEPALIVE_S`, TLS verified as httpx verifies it, and no cookie jar (a cookie
    one client's answer set is never sent with another client's request)."""
    connector = aiohttp.TCPConnector(limit=UPSTREAM_MAX_CONNECTIONS, keepalive_timeout=UPSTREAM_KEEPALIVE_S,
                                     ssl=httpx.create_ssl_context())
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
