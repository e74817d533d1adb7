"""The one-call API: provider-form messages in, the messages to send out.

>>> from historygraph import render_messages
>>> render_messages([{"role": "user", "content": "hi"}], budget=2000, policy="prune")
[{'role': 'user', 'content': 'hi'}]

:func:`render_messages` takes OpenAI Chat Completions messages, :func:`render_anthropic_messages`
Anthropic Messages API turns (plus the ``system`` field, which is outside the budget and is
passed on by the caller unchanged). Each call parses the messages into canonical events, renders
them with a registered policy under a history budget B (tokens of the default ``o200k_base``
tokenizer; what B covers is ContextRender, arXiv 2609.37743, Appendix A.4), checks the rendering
invariants and returns the messages to send. A message the policy shows unchanged is returned as
the caller's own object (images, thinking blocks and unknown fields untouched); only placeholders,
excerpts and summaries are new.

Without ``session`` nothing is stored: the messages given are the whole history; the process keeps
the graphs of the conversations it rendered last (:data:`RECENT`), so that the next call of one,
its messages the previous call's plus what came since, extends the previous rendering (below). With ``session``
(an id) the messages are routed like the proxy does (:class:`historygraph.history.sessions.
SessionRouter`): a stored session that is a prefix of ``messages`` receives only what is new, and a
request that rewrote earlier messages continues in a branch (``<id>~1``, …; the id used is in
:attr:`Rendered.session_id`). Sessions live in ``store`` (default: one in-memory store per process,
so repeated calls in one process share their sessions; pass :func:`historygraph.open_store` for a
persistent one). With ``store`` but no ``session`` the session id is derived from the
conversation's start as the proxy does. A policy given by name, with or without a store, is
wrapped for cache-stable rendering as in the proxy (:mod:`historygraph.policies.cache_stable`:
between re-selections the rendering only appends, or rewrites only its young part, so a provider's
prompt cache serves the previous request; its state is kept in the store for a stored session, so processes sharing the store extend
one rendering, and with the process's recent graphs otherwise); pass an instance
(``policy=historygraph.create("learned")``) to re-select at every call.

``explain=True`` returns a :class:`Rendered`: the messages, the
:class:`~historygraph.render.Rendering` (selected and omitted positions, tokens, per-position
reasons) and the session id. A rendering of a stored session also appends a compact record of
what it left out and why to the session's omission stream (:mod:`historygraph.render.omissions`;
read with ``store.omitted(session_id)``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Literal, NamedTuple, Sequence, overload

from historygraph import telemetry
from historygraph.history.events import EventError, Message
from historygraph.history.graph import ContextGraph
from historygraph.history.sessions import derived_session_id, same_event, stamped
from historygraph.policies import DEFAULT_POLICY, Policy, Signals, create
from historygraph.policies.cache_stable import cache_stable
from historygraph.render import Rendering, check_invariants
from historygraph.render.omissions import omission_record
from historygraph.store import MemoryStore, Store


class Rendered(NamedTuple):
    """What ``explain=True`` returns.

    Attributes:
        messages: the messages to send, in the caller's provider form (for the Responses API its
            ``input``: a list of items, or the caller's string when it sent one).
        rendering: the policy's rendering (``rendering.reasons`` per graph position,
            ``rendering.omitted`` positions of results not shown whole, ``history_tokens``).
        session_id: the stored session used (``None`` when nothing was stored).
    """

    messages: list[Any] | str
    rendering: Rendering
    session_id: str | None


_lock = threading.Lock()
_default_store: MemoryStore | None = None
_signals: dict[int, tuple[Any, Signals]] = {}  # id(store) -> (store, its signals); 0 = no store
_policies: dict[str, Policy] = {}
_routers: dict[int, tuple[Store, Any]] = {}

RECENT, BRANCHES = 32, 4
"""Conversations rendered without a store whose graphs the process keeps: the :data:`RECENT` openings
(system messages and first user message) rendered last, least recently used dropped first, and
for each the :data:`BRANCHES` graphs rendered last (runs of one task share their opening). Our
choice, as the proxy's ``--session-cache`` keeps a few hundred sessions: enough for the agents of
one process, each graph the size of its conversation."""
_recent: OrderedDict[str, list[ContextGraph]] = OrderedDict()
_recent_lock = threading.Lock()


def _unstored_graph(events: Sequence[Message]) -> ContextGraph:
    """The graph of ``events`` rendered without a store: the kept graph of this conversation
    (:data:`RECENT`) whose messages are the first of ``events`` (the longest such), extended with
    the rest, so its cache-stable state goes on; else a new graph. Events without a timestamp are
    kept with the time they arrived (a cache-stable policy re-selects after a pause longer than
    the prompt cache's TTL). Raises EventError/GraphError
    for invalid events (the kept graph is then dropped)."""
    key = derived_session_id(events)
    with _recent_lock:
        family = _recent.pop(key, [])
        best = max((g for g in family if len(g) <= len(events)
                    and all(same_event(a, b) for a, b in zip(g.messages, events))), key=len, default=None)
        try:
            if best is not None:
                family.remove(best)  # extended in place: dropped if an event is refused half-way
                best.extend(stamped(events[len(best):], time.time()))
            graph = best if best is not None else ContextGraph("messages", stamped(events, time.time()))
        except BaseException:
            _recent[key] = family
            raise
        _recent[key] = [graph, *family][:BRANCHES]
        while len(_recent) > RECENT:
            _recent.popitem(last=False)
    return graph


def default_store() -> MemoryStore:
    """The in-memory store that calls with a ``session`` but no ``store`` share (one per process)."""
    global _default_store
    with _lock:
        if _default_store is None:
            _default_store = MemoryStore()
        return _default_store


def _signals_for(store: Store | None) -> Signals:
    key = 0 if store is None else id(store)
    with _lock:
        hit = _signals.get(key)
        if hit is None or hit[0] is not store:
            hit = (store, Signals(store=store))
            _signals[key] = hit
        return hit[1]


def _policy(policy: str | Policy) -> Policy:
    """The shared instance of a named policy, wrapped for cache-stable rendering
    (:mod:`historygraph.policies.cache_stable`): between re-selections the rendering only
    appends, so a provider's prompt cache serves the previous request; an instance as it is."""
    if not isinstance(policy, str):
        return policy
    with _lock:
        if policy not in _policies:
            _policies[policy] = cache_stable(create(policy))
        return _policies[policy]


def _router(store: Store) -> Any:
    from historygraph.history.sessions import SessionRouter

    with _lock:
        hit = _routers.get(id(store))
        if hit is None or hit[0] is not store:
            hit = (store, SessionRouter(store))
            _routers[id(store)] = hit
        return hit[1]


def render_events(events: Sequence[Message], *, budget: int, policy: str | Policy = DEFAULT_POLICY,
                  session: str | None = None, store: Store | None = None,
                  signals: Signals | None = None) -> tuple[Rendering, str | None]:
    """Render canonical events (the core of :func:`render_messages`, for adapters).

    Returns ``(rendering, session_id)``; ``rendering.positions[i]`` indexes ``events`` (after
    routing, a session's graph position ``i`` is ``events[i]``).

    Raises:
        ValueError: ``budget`` is not a positive integer.
        PolicyError: unknown policy name.
        EventError/GraphError: invalid events (nothing is stored).
        BudgetTooSmallError: the protected history alone exceeds ``budget``.
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive integer (tokens), got {budget!r}")
    chosen = _policy(policy)
    if session is None and store is None:
        graph = _unstored_graph(events)
        sid = None
    else:
        store = store if store is not None else default_store()
        sid = _router(store).ingest(list(events), session, arrived=time.time()).session_id
        graph = store.graph(sid)
    sig = signals if signals is not None else _signals_for(store)
    with telemetry.render_span(sid, budget) as span:
        rendering = chosen.render(graph, budget, sig)
        check_invariants(rendering, graph, sig.counter)
        telemetry.rendered(span, rendering, len(graph))
    if store is not None and sid is not None:
        store.record_omitted(sid, omission_record(rendering, len(graph)))
    return rendering, sid


def _openai_events(messages: Sequence[dict[str, Any]]) -> list[Message]:
    if not isinstance(messages, (list, tuple)):
        raise EventError(f"messages must be a list of message objects, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        try:  # a "developer" message is the newer name of a system message
            dev = isinstance(m, dict) and m.get("role") == "developer"
            out.append(Message.from_openai({**m, "role": "system"} if dev else m))
        except EventError as exc:
            raise EventError(f"messages[{i}]: {exc}") from None
    return out


@overload
def render_messages(messages: Sequence[dict[str, Any]], *, budget: int, policy: str | Policy = ...,
                    session: str | None = ..., store: Store | None = ..., signals: Signals | None = ...,
                    explain: Literal[False] = ...) -> list[dict[str, Any]]: ...
@overload
def render_messages(messages: Sequence[dict[str, Any]], *, budget: int, policy: str | Policy = ...,
                    session: str | None = ..., store: Store | None = ..., signals: Signals | None = ...,
                    explain: Literal[True]) -> Rendered: ...
def render_messages(messages: Sequence[dict[str, Any]], *, budget: int, policy: str | Policy = DEFAULT_POLICY,
                    session: str | None = None, store: Store | None = None, signals: Signals | None = None,
                    explain: bool = False) -> list[dict[str, Any]] | Rendered:
    """OpenAI chat messages → the OpenAI chat messages to send, history within ``budget`` tokens.

    Args:
        messages: the whole conversation (``system``/``developer``, ``user``, ``assistant`` with
            ``tool_calls``, ``tool``), as sent to Chat Completions.
        budget: history budget B in tokens (system and current user messages are outside B).
        policy: a registered policy name (``historygraph policies``) or an instance from
            :func:`historygraph.create` (to set parameters).
        session, store: see the module docstring.
        signals: shared signal providers (default: one per store, so embeddings are cached).
        explain: return a :class:`Rendered` instead of the list.

    Raises:
        EventError: a message that cannot be parsed (names ``messages[i]`` and the field).
        ValueError, PolicyError, GraphError, BudgetTooSmallError: see :func:`render_events`.
    """
    events = _openai_events(messages)
    rendering, sid = render_events(events, budget=budget, policy=policy, session=session, store=store, signals=signals)
    out = [messages[p] if p is not None and m.rendered_as is None else m.to_openai()
           for m, p in zip(rendering.messages, rendering.positions)]
    return Rendered(out, rendering, sid) if explain else out


@overload
def render_anthropic_messages(messages: Sequence[dict[str, Any]], *, budget: int, system: Any = ...,
                              policy: str | Policy = ..., session: str | None = ..., store: Store | None = ...,
                              signals: Signals | None = ..., explain: Literal[False] = ...) -> list[dict[str, Any]]: ...
@overload
def render_anthropic_messages(messages: Sequence[dict[str, Any]], *, budget: int, system: Any = ...,
                              policy: str | Policy = ..., session: str | None = ..., store: Store | None = ...,
                              signals: Signals | None = ..., explain: Literal[True]) -> Rendered: ...
def render_anthropic_messages(messages: Sequence[dict[str, Any]], *, budget: int, system: Any = None,
                              policy: str | Policy = DEFAULT_POLICY, session: str | None = None,
                              store: Store | None = None, signals: Signals | None = None,
                              explain: bool = False) -> list[dict[str, Any]] | Rendered:
    """Anthropic Messages API ``messages`` → the ``messages`` to send (``system`` is not returned:
    it is outside B and sent unchanged).

    A user turn holding several ``tool_result`` blocks stays one turn; a result a policy does not
    show whole becomes a ``tool_result`` block whose text is a placeholder naming its id. Other
    arguments and errors as :func:`render_messages`; ``EventError`` names the wire field
    (``messages[3].content[1].tool_use_id`` …). The client's ``cache_control`` breakpoints are
    kept, on the placeholder of a block replaced and on the next message shown for one left out
    (:mod:`historygraph.providers.anthropic_cache`, rule 1); none are added.
    """
    from historygraph.providers import anthropic as anth
    from historygraph.providers.anthropic_cache import moved_breakpoints

    events, pieces = anth.to_canonical(system, list(messages) if isinstance(messages, tuple) else messages)
    rendering, sid = render_events(events, budget=budget, policy=policy, session=session, store=store, signals=signals)
    out = anth.from_canonical(rendering.messages, [pieces[p] if p is not None and p < len(pieces) else None
                                                   for p in rendering.positions],
                              moved_breakpoints(rendering.positions, pieces))
    return Rendered(out, rendering, sid) if explain else out


@overload
def render_responses_input(input: str | Sequence[Any], *, budget: int, instructions: Any = ...,
                           policy: str | Policy = ..., session: str | None = ..., store: Store | None = ...,
                           signals: Signals | None = ..., explain: Literal[False] = ...) -> str | list[Any]: ...
@overload
def render_responses_input(input: str | Sequence[Any], *, budget: int, instructions: Any = ...,
                           policy: str | Policy = ..., session: str | None = ..., store: Store | None = ...,
                           signals: Signals | None = ..., explain: Literal[True]) -> Rendered: ...
def render_responses_input(input: str | Sequence[Any], *, budget: int, instructions: Any = None,
                           policy: str | Policy = DEFAULT_POLICY, session: str | None = None,
                           store: Store | None = None, signals: Signals | None = None,
                           explain: bool = False) -> str | list[Any] | Rendered:
    """OpenAI Responses API ``input`` (a string or a list of items) → the ``input`` to send
    (``instructions`` is not returned: it is outside B and sent unchanged).

    An item a policy shows unchanged is returned as the caller's own object (a reasoning item's
    ``encrypted_content`` untouched); a result not shown whole becomes a ``function_call_output``
    (``custom_tool_call_output`` for a custom call) whose ``output`` is a placeholder naming its
    ``call_id`` (:mod:`historygraph.providers.openai_responses`). A string ``input`` is one user
    message, returned unchanged. The caller forwards a request naming provider-kept state
    (``previous_response_id``, ``conversation``) unrendered: its history is not in ``input``.
    Other arguments and errors as :func:`render_messages`; ``EventError`` names the item
    (``input[3].call_id is missing`` …).
    """
    from historygraph.providers import openai_responses as resp

    items = list(input) if isinstance(input, tuple) else input
    events, pieces = resp.to_canonical(instructions, items)
    rendering, sid = render_events(events, budget=budget, policy=policy, session=session, store=store, signals=signals)
    out = items if isinstance(items, str) else resp.from_canonical(
        rendering.messages, [pieces[p] if p is not None and p < len(pieces) else None for p in rendering.positions])
    return Rendered(out, rendering, sid) if explain else out
