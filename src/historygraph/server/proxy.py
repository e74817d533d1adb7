"""The proxy: OpenAI Chat Completions and Anthropic Messages endpoints in front of a provider.

Per request (ContextRender Appendix D, "OpenAI-compatible proxy"; Algorithm 1 lines 3–7):

1. parse the messages into canonical events (Anthropic via :mod:`historygraph.providers.anthropic`);
2. route them to a session and store only what is new (:mod:`historygraph.history.sessions`);
3. render the session's graph with the policy under the budget (``X-HistoryGraph-Policy`` and
   ``X-HistoryGraph-Budget`` headers, else the configured defaults) and check the invariants of
   docs/architecture.md, invariant §5; a message rendered unchanged is sent as the client's original JSON, so images,
   thinking blocks and unknown fields pass through untouched;
4. forward the request, all other fields unchanged, to the upstream; stream answers are relayed
   chunk by chunk as they arrive while a copy is parsed;
5. store the answer (text and tool calls) once it is complete (for a stream: when its final event
   arrives, before relaying that event). An upstream error is returned to
   the client unchanged (status, body, headers) and stores nothing.

``X-HistoryGraph-Pin: <id>[,<id>…]`` pins items of the request's session (tool call ids, message
numbers such as ``#3``) before step 3, for this and every later request (docs/proxy.md, "Pins");
an id the request's messages do not hold is a 400 naming the header, checked before step 2:
nothing is pinned or stored.

Every response carries ``X-HistoryGraph-Session`` (the session used), ``X-HistoryGraph-Omitted``
and ``X-HistoryGraph-Omitted-Record`` (how many tool results the rendering did not show complete,
and the session API path of the record saying which and why: :meth:`Proxy.notes`) and
``X-HistoryGraph-Proxy-Ms``: the time spent in the proxy excluding the upstream call; for a
streamed answer, whose headers are sent before its events, the time until the upstream request
was sent (the relaying and the storing of the answer afterwards are not in it).
Client errors are JSON in the API's own error shape and name the field at fault.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any, Callable, Sequence, TypeGuard
from urllib.parse import quote

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from httpx_aiohttp import AiohttpTransport
from starlette.background import BackgroundTask

from historygraph import telemetry
from historygraph.history.events import EventError, Message
from historygraph.history.sessions import SESSION_HEADER, Ingest, SessionRouter, derived_session_id, session_id_problem
from historygraph.policies.cache_stable import cache_stable, inspect
from historygraph.policies import PolicyError, Signals, check_production, create
from historygraph.providers import anthropic as anth
from historygraph.providers import jsonio
from historygraph.providers.openai_chat import MessageError
from historygraph.render import BudgetTooSmallError, Rendering, check_invariants
from historygraph.render.omissions import omission_record
from historygraph.server.config import ServerConfig
from historygraph.server.convert import TurnCache, check_pins, outside_tokens
from historygraph.server.curated import client_curated
from historygraph.server.errors import RETRY, ClientError, not_json, store_full, stream_error, too_large, upstream_fault
from historygraph.server.metrics import ProxyMetrics
from historygraph.server.threads import run_in_threadpool
from historygraph.server.answers import UNREADABLE, answer_of, json_or_none, unreadable
from historygraph.server.upstream import (OpenAIStreamAccumulator, SSEParser, forward_headers, parsed_url, response_headers,
                                         unreachable_error, upstream_session)
from historygraph.signals.calibration import TokenCalibration, Usage, anthropic_usage, openai_usage
from historygraph.signals.embeddings import create_embedder
from historygraph.signals.tokens import TokenCounter
from historygraph.store import Store, StoreFullError, open_store
from historygraph.store.full import disk_full

log = logging.getLogger("historygraph.server")

PIN_HEADER = "x-historygraph-pin"  # items to pin in the request's session (Proxy.pin_refs)
OMITTED_HEADER = "x-historygraph-omitted"
OMITTED_RECORD_HEADER = "x-historygraph-omitted-record"
PROXY_MS_HEADER = "x-historygraph-proxy-ms"  # the proxy's own time: whole answers after, streams before the upstream's

ARRIVAL = "historygraph_arrival"  # request.state attribute: time.perf_counter() when the request reached the app

UPSTREAM_RETRIES = 2
"""Retries of an upstream request whose connection failed before any answer (:meth:`Proxy.send`;
what httpx's own transport did with ``retries=2``, plus the keep-alive race)."""


class Proxy:
    """State shared by the endpoints: config, store, router, signals, policy instances, the
    upstream transport."""

    def __init__(self, config: ServerConfig, store: Store | None = None) -> None:
        self.config = config
        self.store = store if store is not None else open_store(config.store)
        self.store.graph_cache = config.session_cache
        self.router = SessionRouter(self.store, prefix_cache=config.session_cache)
        self.turns = TurnCache(config.session_cache)  # the Anthropic endpoint's converted wire turns
        self.arrays = jsonio.ArrayCache(config.session_cache)  # recent requests' messages arrays, split
        self.signals = Signals(counter=TokenCounter(config.encoding), store=self.store,
                               embedder_factory=partial(create_embedder, config.embedder, threads=config.embed_threads))
        self.calibration = TokenCalibration(self.signals.counter)  # our counts vs the provider's usage
        self.clock: Callable[[], float] = time.time  # the time stored with each new message (seconds since the epoch)
        self.metrics = ProxyMetrics(self.calibration)
        self._policies: dict[str, Any] = {}
        # The upstream transport: httpx's request and response types on aiohttp's connection pool
        # (httpx-aiohttp): httpcore's pool visits every pooled connection on each request, 2.5-2.7
        # CPU ms per 27 KB request at 25-50 upstream connections against 0.6-0.8 through aiohttp
        # (bench/RESULTS.md). Requests go to the transport directly, not through an httpx client:
        # a client keeps the cookies an upstream sets (a provider's load-balancer cookie) and sends
        # them with every later request, whichever client of the proxy made it, and its
        # per-request merging of URL, headers and cookies is CPU on the request path.
        self.timeout = httpx.Timeout(config.timeout, connect=30.0)
        self._timeouts = self.timeout.as_dict()
        self.transport: httpx.AsyncBaseTransport = AiohttpTransport(client=upstream_session)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Request:
        """An upstream request (``httpx.Request``'s arguments: ``content``, ``json``, ``headers``,
        ``params``) carrying the configured timeouts."""
        return httpx.Request(method, parsed_url(url), extensions={"timeout": self._timeouts}, **kwargs)

    async def send(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` upstream, its answer streamed. A connection that failed before any
        answer came (refused, timed out connecting, or a pooled keep-alive connection the upstream
        had just closed) is tried again, :data:`UPSTREAM_RETRIES` times at most. Raises
        ``httpx.HTTPError`` (the last failure, or any other)."""
        for attempt in range(UPSTREAM_RETRIES + 1):
            try:
                return await self.transport.handle_async_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError):
                if attempt == UPSTREAM_RETRIES:
                    raise
        raise AssertionError("unreachable")

    def options(self, request: Request) -> tuple[str | None, str, int]:
        """Session id, policy and budget from headers, else the configured defaults."""
        policy = request.headers.get("x-historygraph-policy", self.config.policy)
        try:
            check_production(policy)
        except PolicyError as exc:
            raise ClientError(f"X-HistoryGraph-Policy: {exc}", "X-HistoryGraph-Policy") from None
        raw = request.headers.get("x-historygraph-budget")
        try:
            budget = int(raw) if raw is not None else self.config.budget
        except ValueError:
            raise ClientError(f"X-HistoryGraph-Budget must be a positive integer (tokens), got {raw!r}",
                              "X-HistoryGraph-Budget") from None
        if budget < 1:
            raise ClientError(f"X-HistoryGraph-Budget must be a positive integer (tokens), got {budget}", "X-HistoryGraph-Budget")
        sid = request.headers.get(SESSION_HEADER) or None
        if sid is not None and (problem := session_id_problem(sid)):
            raise ClientError(f"X-HistoryGraph-Session: {problem}", "X-HistoryGraph-Session")
        return sid, policy, budget

    def pin_refs(self, request: Request) -> tuple[str, ...]:
        """The items the ``X-HistoryGraph-Pin`` header names (comma-separated tool call ids or
        message numbers such as ``#3``), pinned in the request's session by :meth:`prepare`
        for this and every later request; ``()`` without the header."""
        raw = request.headers.get(PIN_HEADER)
        return tuple(r for r in (x.strip() for x in raw.split(",")) if r) if raw else ()

    def pin(self, session_id: str, refs: Sequence[str], graph: Any = None) -> None:
        """Pin the items ``refs`` name in the stored session (all or none: each is looked up in
        ``graph``, else the store's, before any is pinned). Raises :class:`ClientError` naming the
        header and an unknown item."""
        if graph is None:
            graph = self.store.graph(session_id)
        try:
            positions = [graph.position_of(r) for r in refs]
        except KeyError as exc:
            raise ClientError(f"X-HistoryGraph-Pin: {exc.args[0]}", "X-HistoryGraph-Pin") from None
        for p in positions:
            self.store.pin(session_id, p)

    def policy(self, name: str) -> Any:
        if name not in self._policies:
            base = create(name, **self.config.policy_params.get(name, {}))  # (-P learned-stable.x: the wrapper's)
            self._policies[name] = cache_stable(base, self.config.policy_params.get(f"{name}-stable")) if self.config.cache_stable else base
        return self._policies[name]

    def render(self, session_id: str, policy: str, budget: int) -> Rendering:
        """Render the stored session and check docs/architecture.md, invariant §5 (the session API:
        raises :class:`ClientError` when the budget cannot hold the protected history; a proxied
        request is forwarded over B instead, :meth:`render_or_smallest`)."""
        try:
            return self._render(session_id, policy, budget, smallest=False, record=False)[0]
        except BudgetTooSmallError as exc:
            raise ClientError(f"X-HistoryGraph-Budget: {exc}", "X-HistoryGraph-Budget") from None

    def _render(self, session_id: str, policy: str, budget: int, graph: Any = None,
                smallest: bool = True, record: bool = True, span: Any = None) -> tuple[Rendering, int]:
        """:meth:`render`, and the tokens of every rendered message (what
        :meth:`TokenCounter.count_messages` gives them): the history's, just recounted by
        ``check_invariants`` and equal to ``rendering.history_tokens``, plus the messages outside
        the history (system messages and the latest user message), counted here. ``graph``: the
        session's graph as the request's routing left it (:attr:`Ingest.graph`), else the store's.
        ``record``: queue the rendering's omission record (a model call's rendering; not the
        session API's inspection renders). ``span``: the request's span (:mod:`historygraph.telemetry`),
        parent of the rendering's."""
        if graph is None:
            graph = self.store.graph(session_id)
        t0 = time.perf_counter()
        with telemetry.render_span(session_id, budget, span) as render_span:
            rendering = self.render_or_smallest(graph, policy, budget, smallest, keep=record)
            telemetry.rendered(render_span, rendering, len(graph))
        named = rendering.policy or policy  # as the records name it: "prune-stable" when cache-stable wraps "prune"
        if "over_budget" in rendering.stats:
            self.metrics.over_budget.labels(policy).inc()
            log.warning("over budget", extra={"session": session_id, "policy": named, "budget": budget,
                                              "history_tokens_out": rendering.history_tokens})
        if record:
            self.store.record_omitted(session_id, omission_record(rendering, len(graph)))
        seconds = time.perf_counter() - t0
        tokens_in, tokens_out = self.metrics.observe_render(policy, seconds, rendering, graph, self.signals.counter)
        log.info("rendered", extra={"session": session_id, "policy": named, "budget": budget,
                                    "history_tokens_in": tokens_in, "history_tokens_out": tokens_out,
                                    "omitted": len(rendering.omitted), "render_ms": round(seconds * 1000, 2)})
        return rendering, rendering.history_tokens + outside_tokens(rendering, graph, self.signals.counter)

    def render_or_smallest(self, graph: Any, policy: str, budget: int, smallest: bool = True, keep: bool = True) -> Rendering:
        """The policy's rendering of ``graph`` under ``budget``, checked (docs/architecture.md,
        invariant §5). When the part every rendering must keep exceeds B (the policy raises
        :class:`BudgetTooSmallError`), the proxy never fails the agent: it renders at the budget
        that part needs (the smallest valid rendering, over B; a few tries when the policy asks for
        more again, then the whole history) and marks it ``rendering.stats["over_budget"] = B``.
        ``smallest=False``: the error is raised instead. ``keep=False``: an inspection (the session
        API), which leaves a cache-stable policy's state as the last model call left it
        (:func:`~historygraph.policies.cache_stable.inspect`)."""
        chosen = self.policy(policy)

        def draw(b: int) -> Rendering:
            return chosen.render(graph, b, self.signals) if keep else inspect(chosen, graph, b, self.signals)

        try:
            rendering = draw(budget)
        except BudgetTooSmallError as exc:
            if not smallest:
                raise
            need = max(exc.required, budget + 1)
            for _ in range(3):
                try:
                    rendering = draw(need)
                    break
                except BudgetTooSmallError as again:
                    need = max(again.required, need * 2)
            else:
                rendering = draw(1 << 40)  # under B: the history unchanged (§5.5)
            rendering.stats["over_budget"] = budget
        check_invariants(rendering, graph, self.signals.counter)
        return rendering

    def notes(self, rendering: Rendering, session_id: str) -> dict[str, str]:
        """Response headers describing ``rendering`` of ``session_id``: ``X-HistoryGraph-Omitted:
        <tool results not shown complete>`` and ``X-HistoryGraph-Omitted-Record: <session API path
        of the session's omission records>`` (the last record is this request's, unless requests
        of the session ran concurrently; :mod:`historygraph.render.omissions`);
        ``X-HistoryGraph-Over-Budget: <history tokens sent>`` when it exceeds B
        (:meth:`render_or_smallest`); ``X-HistoryGraph-Context: client-curated`` when the client's
        own context was forwarded as sent (:func:`client_curated`)."""
        out = {OMITTED_HEADER: str(rendering.position_arrays()[0].size),
               OMITTED_RECORD_HEADER: f"/api/sessions/{quote(session_id, safe='')}/omitted"}
        if "client_curated" in rendering.stats:
            out["x-historygraph-context"] = "client-curated"
        elif "over_budget" in rendering.stats:
            out["x-historygraph-over-budget"] = str(rendering.history_tokens)
        return out

    def prepare(self, messages: Sequence[Message], session_id: str | None, policy: str,
                budget: int, pins: Sequence[str] = (), span: Any = None,
                cache_ttl: float | None = None) -> tuple[str, Rendering, int, int]:
        """Steps 1–3 of the module docstring, in a worker thread: the session used, its rendering,
        the rendered messages' tokens (:meth:`_render`) and the number of events the request left
        the session holding (its messages: where its answer goes, :meth:`store_answer`). ``messages``: parsed events, or a
        :class:`~historygraph.providers.openai_chat.RequestMessages` parsed as far as routing needs
        (the prefix this process last stored is recognised without parsing it). ``pins``: items to pin in the session once the
        request's messages are stored (:meth:`pin_refs`, :meth:`pin`). New messages are stored with
        the request's time; ``cache_ttl``: the prompt cache's TTL the request asks for, in seconds
        (:attr:`~historygraph.history.graph.ContextGraph.cache_ttl`; ``None``: the provider's default)."""
        try:
            root = session_id or derived_session_id(messages)
            if pins:  # refused before anything is stored: a client's corrected retry must not fork the session
                check_pins(messages, pins)
        except MessageError as exc:
            raise ClientError(str(exc), f"messages[{exc.index}]") from None
        except EventError as exc:
            raise ClientError(f"messages: {exc}", "messages") from None
        with self.router.lock(root):  # no other request of this conversation between ingest and render
            try:
                ingest = self.router.ingest(messages, session_id, arrived=self.clock())
            except MessageError as exc:
                raise ClientError(str(exc), f"messages[{exc.index}]") from None
            except EventError as exc:
                raise ClientError(f"messages: {exc}", "messages") from None
            except StoreFullError as exc:  # nothing is forwarded that is not stored
                log.error("store disk full: request refused", extra={"session": root, "error": str(exc)})
                raise store_full(exc) from None
            if self.config.calibrate:  # the provider counts more than we do: shrink B (never grows it)
                budget = self.calibration.adjusted_budget(budget)
            if ingest.graph is not None:
                ingest.graph.cache_ttl = cache_ttl
            if pins:
                self.pin(ingest.session_id, pins, ingest.graph)
            if client_curated(messages, ingest):
                rendering, tokens = self._curated(ingest, budget, span)
            else:  # the graph routing has just brought up to the request's messages: no second look-up
                rendering, tokens = self._render(ingest.session_id, policy, budget, ingest.graph, span=span)
            telemetry.request_rendered(span, ingest.session_id, rendering, tokens)
            return ingest.session_id, rendering, tokens, len(messages)

    def _curated(self, ingest: Ingest, budget: int, span: Any = None) -> tuple[Rendering, int]:
        """A request whose client curates its own context (:func:`client_curated`): its messages are
        the context the client chose for this call, stored and forwarded as they are."""
        graph = ingest.graph if ingest.graph is not None else self.store.graph(ingest.session_id)
        with telemetry.render_span(ingest.session_id, budget, span) as render_span:
            rendering = self.policy("full").render(graph, None, self.signals)
            telemetry.rendered(render_span, rendering, len(graph))
        rendering.stats["client_curated"] = budget
        self.store.record_omitted(ingest.session_id, omission_record(rendering, len(graph)))
        log.info("client-curated context forwarded as sent", extra={"session": ingest.session_id, "budget": budget,
                                                                     "history_tokens_out": rendering.history_tokens})
        return rendering, rendering.history_tokens + outside_tokens(rendering, graph, self.signals.counter)

    def store_answer(self, session_id: str, answer: Message, at: int | None = None) -> None:
        """Store the upstream answer to a request that left ``session_id`` holding ``at`` events
        (:meth:`prepare`): after them, in a branch of its own when a concurrent request of the
        session stored its answer there first (:meth:`SessionRouter.store_answer`). The client
        already has it, so a failure (an answer invalid after the stored events, or a full disk)
        is logged, never raised: the answer is relayed all the same (it was paid for), and nothing
        is lost because the client sends it back in its next request, which stores it, or is
        refused with 507 while the disk is still full (docs/proxy.md, "A full disk")."""
        if answer.timestamp is None:
            answer = replace(answer, timestamp=self.clock())
        try:
            target = self.router.store_answer(session_id, answer, at)
        except EventError as exc:
            log.warning("answer not stored in session %s: %s", session_id, exc)
            return
        except StoreFullError as exc:
            log.error("answer not stored in session %s: %s", session_id, exc)
            return
        if target != session_id:
            log.info("answer stored in a branch: a concurrent request's answer was stored first",
                     extra={"session": target, "parent": session_id})

    def prefetches(self, policy: str | None) -> TypeGuard[str]:
        """Whether ``policy`` has a :meth:`prefetch` hook (else no background task is scheduled:
        each one is a hand-off to the thread pool)."""
        return policy is not None and getattr(self.policy(policy), "prefetch", None) is not None

    def prefetch(self, session_id: str, policy: str, answer: Message | None) -> None:
        """After the response is sent (a background task, off the request path): let the policy
        compute what its next render of the session needs and the stored answer already
        determines (its ``prefetch(graph, signals)``, when it has one: ContextRender embeds its
        query texts). Only when the answer calls tools: the next request then carries their
        results and the latest user message is unchanged, so the query text is the one the next
        render embeds; after a text answer the client's next message changes it. Never raises
        (a failure costs only the time saved)."""
        hook = getattr(self.policy(policy), "prefetch", None)
        if hook is None or answer is None or not answer.tool_calls:
            return
        try:
            with self.router.lock(session_id):
                graph = self.store.graph(session_id)
            hook(graph, self.signals)
        except Exception as exc:  # noqa: BLE001 - a background task: log and go on
            log.warning("prefetch for session %s failed: %s: %s", session_id, type(exc).__name__, exc)

    def observe_usage(self, body: dict[str, Any], usage: Usage | None, sent: Sequence[Message] | int | None = None,
                      api: str = "openai") -> None:
        """Count the reported prompt tokens by cache kind (``/metrics``,
        ``historygraph_input_tokens_total``) and feed the calibration hook: our estimate of the forwarded request (messages + tool
        schemas) against the prompt tokens the provider reported for it (fresh, cache read and
        cache write kept apart; both APIs, streamed or not). ``sent``: the forwarded messages as
        parsed events (the rendering), so that the request body is not parsed again, or their
        tokens already counted (:meth:`prepare`)."""
        if usage is None:
            return
        self.metrics.observe_usage(api, usage)
        try:
            if sent is None:
                sent = ([Message.from_openai(m) for m in body["messages"]] if api == "openai"
                        else anth.to_canonical(body.get("system"), body["messages"])[0])
            if isinstance(sent, int):
                estimate = sent + self.calibration.estimate_request((), body.get("tools"))
            else:
                estimate = self.calibration.estimate_request(sent, body.get("tools"))
        except (ValueError, KeyError, TypeError, EventError):
            return  # a shape we do not count
        self.calibration.observe(estimate, usage)

    def store_partial(self, session_id: str, raw: bytes, reason: str) -> None:
        """Keep the relayed part of a stream that was cut, marked partial, outside the history:
        store text kind ``"partial_answer"``, key ``<session>:<n>`` (n = events stored so far)."""
        key = f"{session_id}:{len(self.store.messages(session_id))}"
        try:
            self.store.put_text("partial_answer", key, json.dumps({"partial": True, "reason": reason,
                                                                    "stream": raw.decode("utf-8", "replace")}))
        except Exception as exc:  # the client gets its error event all the same
            if not disk_full(exc):
                raise
            self.store.full = f"{type(exc).__name__}: {exc}"
            log.error("partial answer not stored in session %s: %s", session_id, exc)

    async def read_json(self, request: Request, raw_messages: bool = False, require: str | None = "messages") -> dict[str, Any]:
        """The request body as a JSON object; 413 over the size limit, 400 when not JSON.
        ``raw_messages``: the items of ``messages`` stay unparsed (:func:`jsonio.loads_request`, with
        this process's :class:`jsonio.ArrayCache`;
        :class:`~historygraph.providers.openai_chat.RequestMessages` parses those it needs).
        ``require``: the list field the body must have (``None``: none). The bytes read are kept
        in ``request.state.historygraph_body``."""
        size, chunks = 0, []
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.config.max_body_bytes:
                raise ClientError(too_large(self.config.max_body_bytes), "body", 413)
            chunks.append(chunk)
        try:
            data = request.state.historygraph_body = b"".join(chunks)
            body, fast = (jsonio.loads_request(data, arrays=self.arrays, check=True) if raw_messages
                          else jsonio.loads(data, check=True))
        except jsonio.UnusableJSON as exc:  # parses, but no provider reads it: refused before anything is stored
            raise ClientError(f"request body: {exc}", exc.where or "body") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ClientError(f"request body is not valid JSON: {exc}", "body") from None
        request.state.historygraph_json_fast = fast  # then the forwarded body may be encoded by msgspec too
        if not isinstance(body, dict):
            raise ClientError("request body must be a JSON object", "body")
        if require is not None and not isinstance(body.get(require), list):
            raise ClientError(f"{require}: required, a list of messages", require)
        return body

    async def forward(self, url: str, body: dict[str, Any], request: Request, session_id: str, started: float,
                      accumulator: Callable[[], Any], sent: Sequence[Message] | int | None = None,
                      policy: str | None = None, extra: dict[str, str] | None = None, at: int | None = None,
                      stream: bool | None = None) -> Response:
        """Step 4–5: send ``body`` upstream and relay the answer (streamed when ``body["stream"]``),
        stored after the request's ``at`` events (:meth:`store_answer`);
        ``sent``: the rendered messages ``body`` carries, or their tokens, for :meth:`observe_usage`; ``policy``:
        the policy that rendered it, whose :meth:`prefetch` runs once the response is sent; ``extra``:
        response headers of ours (:meth:`notes`); ``stream``: whether the answer is a stream (``None``: the
        body's ``stream`` field says; the Gemini API streams by its method). An accumulator class may name its ``api`` and
        bring ``usage_of``, ``answer_of`` and ``cut_event`` (the Responses API's does)."""
        headers = forward_headers(request.headers, body)
        request.state.historygraph_session = session_id  # the request log's session, also when no response carries it (a 502)
        ours = {"x-historygraph-session": session_id, **(extra or {})}
        api = getattr(accumulator, "api", None) or ("openai" if accumulator is OpenAIStreamAccumulator else "anthropic")
        if not any(k.lower() == "content-type" for k in headers):
            headers["content-type"] = "application/json"
        content = jsonio.dumps(body, getattr(request.state, "historygraph_json_fast", False))
        request_up = self.request("POST", url, content=content, headers=headers)
        t_up = time.perf_counter()
        try:
            upstream = await self.send(request_up)
        except httpx.HTTPError as exc:
            self.metrics.upstream_errors.labels(api, "unreachable").inc()
            telemetry.finish(getattr(request.state, telemetry.SPAN_STATE, None), 502, error="upstream_unreachable")
            raise unreachable_error(url, exc, api, self.config.timeout, session_id) from None
        if upstream.status_code >= 400:
            self.metrics.upstream_errors.labels(api, str(upstream.status_code)).inc()
        if upstream.status_code >= 400 or not (body.get("stream") if stream is None else stream):
            return await self.answer_whole(url, upstream, body, session_id, started, t_up, accumulator, api, sent, policy, ours,
                                           getattr(request.state, telemetry.SPAN_STATE, None), at)
        ours[PROXY_MS_HEADER] = f"{(t_up - started) * 1000:.2f}"  # a stream's headers go first: its time until sent
        return self.relay_stream(upstream, body, session_id, accumulator, api, sent, policy, ours,
                                 getattr(request.state, telemetry.SPAN_STATE, None), at)

    async def answer_whole(self, url: str, upstream: httpx.Response, body: dict[str, Any], session_id: str,
                           started: float, t_up: float, accumulator: Callable[[], Any], api: str,
                           sent: Sequence[Message] | int | None, policy: str | None, ours: dict[str, str],
                           span: Any = None, at: int | None = None) -> Response:
        """:meth:`forward` for an answer that is not a stream (or an upstream error): read it
        whole, store its message, relay it with ``X-HistoryGraph-Proxy-Ms`` (``t_up``: when the
        upstream call began); ``span``: the request's (:mod:`historygraph.telemetry`), ended here. A body cut after the headers, or a 2xx body that is not a JSON
        object, is a 502 saying so (:func:`~historygraph.server.errors.upstream_fault`)."""
        try:
            content = await self.read_answer(url, upstream, api)
        except ClientError:
            telemetry.finish(span, 502, error="upstream_body_cut")
            raise
        upstream_s = time.perf_counter() - t_up
        answer = None
        if upstream.status_code >= 400:
            telemetry.finish(span, upstream.status_code)
        else:
            data = json_or_none(content)
            if not isinstance(data, dict):
                self.metrics.upstream_errors.labels(api, "not_json").inc()
                telemetry.finish(span, 502, error="upstream_not_json")
                raise upstream_fault(url, upstream.status_code, not_json(content, upstream.headers.get("content-type")))
            usage_of = getattr(accumulator, "usage_of", None) or (openai_usage if api == "openai" else anthropic_usage)
            usage = usage_of(data)
            self.observe_usage(body, usage, sent, api)
            if span is not None:
                telemetry.finish(span, upstream.status_code, None if usage is None else usage.total,
                                 telemetry.output_tokens(data), data.get("model"))
            answer = answer_of(data, accumulator)
            if answer is not None:
                await run_in_threadpool(self.store_answer, session_id, answer, at)
        proxy_ms = (time.perf_counter() - started - upstream_s) * 1000
        headers = {k: v for k, v in response_headers(upstream.headers).items() if k.lower() != "content-encoding"}
        after = (BackgroundTask(self.prefetch, session_id, policy, answer)
                 if self.prefetches(policy) and answer is not None and answer.tool_calls else None)
        return Response(content, upstream.status_code, {**headers, **ours, PROXY_MS_HEADER: f"{proxy_ms:.2f}"},
                        background=after)

    async def read_answer(self, url: str, upstream: httpx.Response, api: str) -> bytes:
        """The whole body of ``upstream`` (closed afterwards); a 502 saying so when the upstream
        closed the connection before the body was complete."""
        try:
            return await upstream.aread()
        except httpx.HTTPError as exc:
            self.metrics.upstream_errors.labels(api, "body_cut").inc()
            what = f"closed the connection before its body was complete ({type(exc).__name__}: {exc})"
            raise upstream_fault(url, upstream.status_code, what) from None
        finally:
            await upstream.aclose()

    def relay_stream(self, upstream: httpx.Response, body: dict[str, Any], session_id: str,
                     accumulator: Callable[[], Any], api: str, sent: Sequence[Message] | int | None,
                     policy: str | None, ours: dict[str, str], span: Any = None, at: int | None = None) -> Response:
        """:meth:`forward` for a streamed answer: relayed chunk by chunk as it arrives while a copy
        is parsed; the answer is stored once complete. A stream cut mid-way, or one whose answer
        cannot be read (a tool call's input that never became complete JSON), ends in the
        provider's error event (:func:`~historygraph.server.errors.stream_error`), its answer
        not stored."""
        answer: Message | None = None

        async def relay():
            # The answer is stored as soon as the event completing it arrives and before that event
            # is relayed: clients close the connection right after the final event.
            # The usage is fed to the calibration as soon as the answer is complete and its usage has
            # come (OpenAI sends it after the finish_reason chunk), also before that chunk is relayed,
            # so that a client's next request or a read of /calibration sees it.
            nonlocal answer
            parser, acc, stored, observed = SSEParser(), accumulator(), False, False
            output: int | None = None  # the provider's output tokens, for the request's span
            relayed: list[bytes] = []
            cut: str | None = None
            fault: str | None = None
            try:
                try:
                    async for chunk in upstream.aiter_raw():
                        completed = False
                        try:
                            for event in parser.feed(chunk):
                                acc.feed(event)
                                if span is not None:
                                    output = telemetry.output_tokens(event) or output
                            if not stored and acc.complete:
                                stored, completed, answer = True, True, acc.message()
                        except UNREADABLE as exc:  # the chunk that made it unreadable is not relayed
                            fault = unreadable(exc)
                            relayed.append(chunk)
                            break
                        if completed and answer is not None:
                            await run_in_threadpool(self.store_answer, session_id, answer, at)
                        if not observed and acc.complete and acc.usage is not None:
                            observed = True
                            self.observe_usage(body, acc.usage, sent, api)
                        relayed.append(chunk)
                        yield chunk
                    if not acc.complete and fault is None:
                        cut = "the upstream closed the stream before its final event"
                except httpx.HTTPError as exc:  # after the final event the answer is complete: not a cut
                    cut = None if acc.complete else str(exc)
                if fault is not None:
                    self.metrics.upstream_errors.labels(api, "malformed_stream").inc()
                    await run_in_threadpool(self.store_partial, session_id, b"".join(relayed), fault)
                    yield stream_error(api, f"upstream stream unusable: {fault}; {RETRY}", "upstream_malformed_answer")
                elif cut is not None:
                    self.metrics.upstream_errors.labels(api, "stream_cut").inc()
                    # A stream cut mid-way (a dropped connection, or one closed cleanly before the
                    # final event): the partial answer is kept apart from the history (never
                    # presented as a complete turn) and the client gets a well-formed error event.
                    await run_in_threadpool(self.store_partial, session_id, b"".join(relayed), cut)
                    yield stream_error(api, f"upstream stream cut mid-way: {cut}", "upstream_stream_cut")
            finally:
                await upstream.aclose()
                telemetry.finish(span, upstream.status_code, None if acc.usage is None else acc.usage.total, output,
                                 error="upstream_malformed_stream" if fault is not None else
                                 "upstream_stream_cut" if cut is not None else None)

        after = BackgroundTask(lambda: self.prefetch(session_id, policy, answer)) if self.prefetches(policy) else None
        return StreamingResponse(relay(), upstream.status_code, {**response_headers(upstream.headers), **ours}, background=after)

