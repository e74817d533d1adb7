"""OpenTelemetry spans: one per rendering (``historygraph.render``) and one per proxied request
(issue 40), through the OpenTelemetry API only.

Nothing is exported unless the application configures an OpenTelemetry SDK tracer provider with
an exporter (``opentelemetry.trace.set_tracer_provider``, or ``opentelemetry-instrument`` with
``OTEL_TRACES_EXPORTER``); without one the API's spans do nothing, and without the
``opentelemetry-api`` package (the ``otel`` extra) every function here is a no-op. Attributes are
computed only for a span that records (``span.is_recording()``).

* ``historygraph.render`` (kind INTERNAL): ``historygraph.policy``, ``historygraph.budget`` (B,
  tokens), ``historygraph.session_id``, ``historygraph.events`` (messages rendered from),
  ``historygraph.history_tokens`` (tokens charged to B), ``historygraph.input_tokens`` (the whole
  rendered message list), ``historygraph.omitted`` (tool results not shown complete),
  ``historygraph.over_budget`` (the B asked for, when the proxy sent the smallest valid rendering
  over it).
* A proxied request (kind CLIENT), named ``"{gen_ai.operation.name} {gen_ai.request.model}"`` and
  carrying the attributes of the OpenTelemetry GenAI semantic conventions
  (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/): ``gen_ai.operation.name``
  (``chat``), ``gen_ai.provider.name`` (``openai`` or ``anthropic``; the convention's successor of
  the deprecated ``gen_ai.system``), ``gen_ai.request.model``, ``gen_ai.conversation.id`` (the
  session), ``gen_ai.usage.input_tokens`` and ``gen_ai.usage.output_tokens`` (as the provider
  reported them; input includes prompt-cache reads and writes), ``gen_ai.response.model``,
  ``http.response.status_code``, ``error.type`` on failure; plus ``historygraph.session_id``,
  ``historygraph.policy``, ``historygraph.budget``, ``historygraph.history_tokens``,
  ``historygraph.omitted`` and ``historygraph.request_tokens`` (our count of the forwarded
  messages). The request's rendering span is its child.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

try:
    from opentelemetry import trace as _trace
except ImportError:  # the otel extra is not installed: every span is a no-op
    _trace = None  # type: ignore[assignment]

from historygraph.render.rendering import Rendering

SCOPE = "historygraph"
"""The instrumentation scope name of every span here."""


_TRACER = None if _trace is None else _trace.get_tracer(SCOPE)
"""The API's tracer: a proxy of the global provider's, so a provider set after import is used."""


def _tracer() -> Any:
    return _TRACER


@contextmanager
def render_span(session_id: str | None, budget: int | None, parent: Any = None) -> Iterator[Any]:
    """A ``historygraph.render`` span around a rendering (a child of ``parent``, a span, when
    given); yields the span (``None`` without the API) for :func:`rendered`."""
    tracer = _tracer()
    if tracer is None:
        yield None
        return
    context = _trace.set_span_in_context(parent) if parent is not None else None
    with tracer.start_as_current_span("historygraph.render", context=context) as span:
        if span.is_recording():
            if session_id is not None:
                span.set_attribute("historygraph.session_id", session_id)
            if budget is not None:
                span.set_attribute("historygraph.budget", budget)
        yield span


def rendered(span: Any, rendering: Rendering, events: int) -> None:
    """Put what ``rendering`` (of ``events`` messages) did on a :func:`render_span` span."""
    if span is None or not span.is_recording():
        return
    span.set_attributes({"historygraph.policy": rendering.policy, "historygraph.events": events,
                         "historygraph.history_tokens": rendering.history_tokens,
                         "historygraph.input_tokens": rendering.input_tokens,
                         "historygraph.omitted": int(rendering.position_arrays()[0].size)})
    if "over_budget" in rendering.stats:
        span.set_attribute("historygraph.over_budget", rendering.stats["over_budget"])


SPAN_STATE = "historygraph_span"
"""``request.state`` attribute of a proxied request's span (set by its endpoint)."""


def request_span(provider: str, model: Any, started: float | None = None) -> Any:
    """Start the span of one proxied request (not made current: it is ended by :func:`finish`,
    possibly in another task), ``started`` a ``time.perf_counter()`` of its arrival; ``None``
    without the API or when it does not record."""
    tracer = _tracer()
    if tracer is None:
        return None
    start_ns = None if started is None else time.time_ns() - int((time.perf_counter() - started) * 1e9)
    name = f"chat {model}" if isinstance(model, str) and model else "chat"
    span = tracer.start_span(name, kind=_trace.SpanKind.CLIENT, start_time=start_ns)
    if not span.is_recording():
        return None
    span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider})
    if isinstance(model, str) and model:
        span.set_attribute("gen_ai.request.model", model)
    return span


def request_rendered(span: Any, session_id: str, rendering: Rendering, request_tokens: int) -> None:
    """Put the request's session and rendering on its span."""
    if span is None:
        return
    span.set_attributes({"gen_ai.conversation.id": session_id, "historygraph.session_id": session_id,
                         "historygraph.policy": rendering.policy, "historygraph.history_tokens": rendering.history_tokens,
                         "historygraph.omitted": int(rendering.position_arrays()[0].size),
                         "historygraph.request_tokens": request_tokens})
    if rendering.budget is not None:
        span.set_attribute("historygraph.budget", rendering.stats.get("over_budget", rendering.budget))


def output_tokens(obj: Any) -> int | None:
    """Output tokens a provider reported in an answer or stream event: ``usage.completion_tokens``
    (Chat Completions), ``usage.output_tokens`` (Anthropic Messages, its ``message_start`` event's
    ``message.usage`` and ``message_delta``'s cumulative ``usage``; OpenAI Responses, its
    ``response.completed`` event's ``response.usage``); ``None`` when there is none."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    for key in ("message", "response"):
        inner = obj.get(key)
        if usage is None and isinstance(inner, dict):
            usage = inner.get("usage")
    if not isinstance(usage, dict):
        return None
    n = usage.get("completion_tokens", usage.get("output_tokens"))
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def finish(span: Any, status: int, input_tokens: int | None = None, output: int | None = None,
           response_model: Any = None, error: str | None = None) -> None:
    """End a :func:`request_span` span with the status returned to the client, the provider's
    token usage when known and ``error`` (an ``error.type`` value) when the request failed."""
    if span is None or not span.is_recording():  # (not recording: ended already)
        return
    span.set_attribute("http.response.status_code", status)
    if input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
    if output is not None:
        span.set_attribute("gen_ai.usage.output_tokens", output)
    if isinstance(response_model, str) and response_model:
        span.set_attribute("gen_ai.response.model", response_model)
    if error is not None or status >= 400:
        span.set_attribute("error.type", error or str(status))
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, error))
    span.end()
