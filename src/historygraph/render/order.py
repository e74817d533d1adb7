"""The order a rendering shows the stored messages in, and the active tool loop's opening
(docs/architecture.md, invariants §5.3, §5.7): tool results directly after the assistant message
that made their call, everything else chronological; the messages every rendering must keep so
that, on the wire, the active tool loop opens with its thinking block."""

from __future__ import annotations

from historygraph.history.graph import ContextGraph
from historygraph.render._memo import token_memo
from historygraph.render.markers import placeholder_for
from historygraph.signals.tokens import TokenCounter

def render_order(graph: ContextGraph) -> list[int]:
    """Graph positions in the order a rendering shows them: chronological, except that the tool
    results of an assistant message follow it directly (in the order they arrived), so a message
    stored between a call and its result comes after the result (docs/architecture.md, invariant §5.3 exception, §5.7:
    both providers reject a request where anything sits between a call and its result)."""
    out: list[int] = []
    result_of = graph.result_of
    for p, m in enumerate(graph.messages):
        if m.role == "tool":
            continue
        out.append(p)
        calls = m.tool_calls
        if len(calls) == 1:  # the common case, without a sort
            r = result_of.get(calls[0].id)
            if r is not None:
                out.append(r)
        elif calls:
            out.extend(sorted(result_of[c.id] for c in calls if c.id in result_of))
    return out


def kept_render_order(graph: ContextGraph, counter: TokenCounter) -> list[int]:
    """:func:`render_order` read from the per-graph layout skeleton (extended on append, not
    rebuilt per call); a new list."""
    return token_memo(graph, counter, placeholder_for).render_order(graph)


def loop_opening(graph: ContextGraph) -> int | None:
    """Position of the assistant message that opens the active tool loop when it starts with a
    thinking block (it must then be rendered, byte-exact), else ``None``.

    Anthropic's rule (Messages API, "Extended thinking" with tool use): while a tool-use cycle is
    in progress, its first assistant message must be sent back starting with its ``thinking`` or
    ``redacted_thinking`` block, signature unmodified; otherwise the request is rejected
    ("a final assistant message must start with a thinking block"). The active loop is what
    follows the last user message that starts a new exchange: one neither stored between a call
    and its result nor following a tool result (or an assistant message with tool calls, whose
    results a rendering shows right after it) with only user messages between (on the wire such
    text shares the user turn of the results, which continues the loop). docs/architecture.md, invariant §5.7 protects that message like the
    latest assistant message; with no thinking block no provider requires it, and it is not."""
    return loop_bounds(graph)[2]


def loop_guard(graph: ContextGraph, users: list[int] | None = None) -> tuple[int, ...]:
    """Positions every rendering must keep so that, on the wire, the active tool loop opens with
    its thinking block (docs/architecture.md, invariant §5.7): the user message that starts the
    loop's exchange, the assistant message before it (when there is one) and :func:`loop_opening`;
    empty when the loop opens without a thinking block.

    The provider finds the loop from the wire: it starts after the last user turn holding no tool
    result. Consecutive user messages merge into one turn, and a dropped-step marker or a summary
    is a user message, so if that assistant message were left out, the starting user message
    would share a turn with the tool results rendered before it, and the provider's loop would
    begin at an earlier assistant message, usually one without a thinking block; if the user
    message were left out without a marker (under a summary), the two assistant messages would
    merge into one turn that does not start with the thinking block.

    ``users``: the positions of the graph's user messages, ascending, when the caller has them
    (found by a scan otherwise)."""
    before, start, opening = loop_bounds(graph, users)
    if opening is None:
        return ()
    return tuple(p for p in (before, start, opening) if p is not None)


def loop_bounds(graph: ContextGraph, users: list[int] | None = None) -> tuple[int | None, int | None, int | None]:
    """``(assistant message before the user message that starts the active loop, that user
    message, loop_opening(graph))``, each ``None`` when there is none; ``users`` as for
    :func:`loop_guard`."""
    msgs = graph.messages
    start, before, user = 0, None, None
    if users is None:
        users = [p for p, m in enumerate(msgs) if m.role == "user"]
    for p in reversed(users):
        q = p - 1
        while q >= 0 and msgs[q].role == "user":  # consecutive user turns merge on the wire
            q -= 1
        if (q >= 0 and (msgs[q].role == "tool" or msgs[q].tool_calls)) or between_call_and_result(graph, p):
            continue
        start, user, before = p + 1, p, (q if q >= 0 and msgs[q].role == "assistant" else None)
        break
    first = next((p for p in range(start, len(msgs)) if msgs[p].role == "assistant"), None)
    if first is None or not msgs[first].opens_with_thinking:
        return None, None, None
    return before, user, first


def between_call_and_result(graph: ContextGraph, p: int) -> bool:
    """Whether position ``p`` lies strictly between a call and its (latest) result, looking at
    the shorter side of ``p``: the calls made before it, or the results stored after it."""
    msgs, result_of, owner = graph.messages, graph.result_of, graph.call_owner
    if p <= len(msgs) - p:
        return any(result_of.get(c.id, -1) > p for a in range(p) for c in msgs[a].tool_calls)
    return any(m.role == "tool" and result_of.get(m.tool_call_id or "") == r and owner[m.tool_call_id or ""] < p
               for r in range(p + 1, len(msgs)) for m in (msgs[r],))
