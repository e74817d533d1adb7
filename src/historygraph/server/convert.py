"""The steps every wire endpoint (Anthropic Messages, Responses, Gemini) shares between reading its
body and forwarding it: convert the request to canonical messages and prepare its rendering
(:func:`prepare_converted`), pair each rendered message with the request's own piece
(:func:`pieces_shown`), and count a request's tokens as it would be forwarded
(:func:`count_rendered`). A conversion error is a 400 naming the request's field."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from historygraph.history.events import EventError, Message
from historygraph.history.graph import ContextGraph
from historygraph.render import Rendering
from historygraph.server.errors import ClientError

Converted = tuple[Sequence[Message], list[Any]]
"""Canonical messages and, per message, the request's own piece it came from."""


def _converted(convert: Callable[[], Converted], field: str) -> Converted:
    try:
        return convert()
    except EventError as exc:
        raise ClientError(str(exc), field) from None


def prepare_converted(proxy: Any, convert: Callable[[], Converted], field: str, sid: str | None, policy: str,
                      budget: int, pins: Sequence[str], span: Any,
                      cache_ttl: float | None = None) -> tuple[str, Rendering, int, int, list[Any]]:
    """In a worker thread: ``convert()`` the request (an :class:`EventError` becomes a 400 naming
    ``field``) and :meth:`~historygraph.server.proxy.Proxy.prepare` it (``cache_ttl``: the prompt
    cache's TTL the request asks for, seconds). Returns the session id, the rendering, its tokens,
    the events the request left the session holding, and the pieces."""
    messages, pieces = _converted(convert, field)
    return (*proxy.prepare(messages, sid, policy, budget, pins, span, cache_ttl), pieces)


def pieces_shown(rendering: Rendering, pieces: Sequence[Any]) -> list[Any]:
    """The request's piece of each rendered message (``None`` for one the proxy made: a marker, a
    placeholder, a message of the stored session the request does not hold)."""
    return [pieces[p] if p is not None and p < len(pieces) else None for p in rendering.positions]


def count_rendered(proxy: Any, convert: Callable[[], Converted], field: str, policy: str, budget: int,
                   tools: Any) -> int:
    """Input tokens of the request as the proxy would forward it (rendered under ``budget``, the
    calibration applied when on; ``tools`` counted too), without storing anything."""
    messages, _ = _converted(convert, field)
    try:
        graph = ContextGraph("count_tokens", messages)
    except EventError as exc:
        raise ClientError(str(exc), field) from None
    b = proxy.calibration.adjusted_budget(budget) if proxy.config.calibrate else budget
    rendering = proxy.render_or_smallest(graph, policy, max(1, b))
    return proxy.calibration.estimate_request(rendering.messages, tools)
