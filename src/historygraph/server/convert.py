"""The steps every wire endpoint (Anthropic Messages, Responses, Gemini) shares between reading its
body and forwarding it: convert the request to canonical messages and prepare its rendering
(:func:`prepare_converted`), pair each rendered message with the request's own piece
(:func:`pieces_shown`), and count a request's tokens as it would be forwarded
(:func:`count_rendered`, :func:`outside_tokens`), and check the pins a request names before
anything is stored (:func:`check_pins`). A conversion error is a 400 naming the request's field. The Anthropic
endpoint converts only the wire turns it has not seen last time (:class:`TurnCache`)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from typing import Any, Callable, Sequence

from historygraph.history.events import EventError, Message
from historygraph.history.graph import ContextGraph
from historygraph.history.sessions import known_prefix
from historygraph.providers import anthropic as anth
from historygraph.providers import jsonio
from historygraph.render import Rendering
from historygraph.signals.tokens import TokenCounter
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


class TurnCache:
    """The Anthropic endpoint's "Incremental comparison" (:mod:`historygraph.history.sessions`):
    per conversation (an LRU of ``size`` per process), the wire turns last converted (their
    unparsed bytes, or JSON values) and their canonical messages. Wire turns do not map one to one onto events (a user turn holds any
    number of tool results), but each turn's conversion depends on that turn and its index alone
    (:func:`historygraph.providers.anthropic.turn_to_canonical`), so a request whose leading turns
    equal those last converted reuses their messages (the same objects the store holds, so
    comparing them with the stored events is cheap) and parses and converts only the rest.
    ``size`` 0 keeps nothing (every request converted in full)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[str, tuple[list[Any], list[list[tuple[Message, anth.Piece]]]]] = OrderedDict()
        self._guard = threading.Lock()

    @staticmethod
    def key(session_id: str | None, system: Any, turns: Sequence[Any]) -> str:
        """The conversation: the session header, else the system field and the first turn (any
        key is correct, since only equal turns at equal indices are reused; it decides hits)."""
        if session_id:
            return "id:" + session_id
        first = bytes(turns[0]) if turns and isinstance(turns[0], jsonio.Raw) else repr(turns[:1]).encode()
        return "auto:" + hashlib.sha256(repr(system).encode() + b"\0" + first).hexdigest()

    def convert(self, key: str, system: Any, turns: list[Any]) -> tuple[list[Message], list[anth.Piece | None]]:
        """:func:`~historygraph.providers.anthropic.to_canonical` of ``system`` and ``turns`` (items
        unparsed or JSON values). Raises :class:`EventError` naming the field at fault."""
        with self._guard:
            cached = self._items.get(key)
            if cached is not None:
                self._items.move_to_end(key)
        n = known_prefix(cached[0], turns) if cached is not None else 0
        converted = list(cached[1][:n]) if cached is not None else []
        for i in range(n, len(turns)):
            try:
                turn = jsonio.item(turns[i], check=True)
            except ValueError as exc:
                raise EventError(f"messages[{i}]: not valid JSON: {exc}") from None
            converted.append(anth.turn_to_canonical(turn, i))
        if self.size > 0:
            with self._guard:
                self._items[key] = (list(turns), converted)
                self._items.move_to_end(key)
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return anth.join_turns(system, converted)


def check_pins(messages: Sequence[Message], refs: Sequence[str]) -> None:
    """Raise :class:`ClientError` naming the ``X-HistoryGraph-Pin`` header when one of ``refs`` names
    no item of the request's ``messages`` (a tool call id with a result in them, or a message
    number such as ``#3``), before anything is stored. The session the request is routed to holds
    exactly its messages (:class:`~historygraph.history.sessions.Ingest`), so what passes here is
    found by :meth:`~historygraph.server.proxy.Proxy.pin` after storing."""
    results = {m.tool_call_id for m in messages if m.role == "tool"}
    for ref in refs:
        number = re.fullmatch(r"\s*#?(\d+)\s*", ref)
        if ref not in results and not (number and int(number.group(1)) < len(messages)):
            raise ClientError(f"X-HistoryGraph-Pin: no item {ref!r} in the request's messages: name a tool call id "
                              f"with a result in them, or a message number #0–#{len(messages) - 1}; nothing was stored",
                              "X-HistoryGraph-Pin")


def outside_tokens(rendering: Rendering, graph: Any, counter: TokenCounter) -> int:
    """Tokens of the rendered messages outside the history (docs/architecture.md, invariant
    §5.1): those at the positions of the graph's system messages and of its latest user
    message. With ``rendering.history_tokens`` (checked against a recount by ``check_invariants``)
    they make ``counter.count_messages(rendering.messages)``."""
    msgs = graph.messages
    last_user = next((p for p in range(len(msgs) - 1, -1, -1) if msgs[p].role == "user"), None)
    return sum(counter.count_message(m) for m, p in zip(rendering.messages, rendering.positions)
               if p is not None and (p == last_user or msgs[p].role == "system"))
