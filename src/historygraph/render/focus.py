"""What the agent is working on now: the values a focused excerpt keeps the lines of
(:func:`historygraph.render.markers.excerpt_for`, issue 39, item 3).

The focus of a rendering is the set of Tool-Flow Analysis values (ContextRender A.2,
:func:`~historygraph.history.reuse.extract_values`) of the last :data:`FOCUS_MESSAGES` assistant
messages' operations (their text and each tool call's name and arguments) and of the current
user message. These are production signals only: the stored messages before the call being
rendered, never what a later turn did (the evaluator's reuse labels). An oversized result's lines
that hold one of these values are where the next calls are likely to look (a file name the agent
opened, a function it grepped for, an error it is fixing). :data:`FOCUS_MESSAGES` is our choice
(the papers do not excerpt by content); ``docs/policies.md`` gives the measurements behind it.
"""

from __future__ import annotations

from historygraph.history.graph import ContextGraph, operations
from historygraph.history.reuse import extract_values

#: How many of the latest assistant messages the focus reads (our choice; docs/policies.md).
FOCUS_MESSAGES = 3
_VALUES = "render.focus.values"  # graph.memo key: {position: frozenset of the message's TFA values}


def focus_values(graph: ContextGraph, current_user: int | None, messages: int = FOCUS_MESSAGES) -> frozenset[str]:
    """The TFA values of the last ``messages`` assistant messages of ``graph`` (text and tool
    calls, :func:`~historygraph.history.graph.operations`) and of the message at position
    ``current_user`` (``None``: no user message), as one set; empty when ``messages`` is 0.
    A stored message's values never change: kept per graph. Raises ValueError when ``messages``
    is negative."""
    if messages < 0:
        raise ValueError(f"focus_values: messages must be >= 0, got {messages}")
    if messages == 0:
        return frozenset()
    memo: dict[int, frozenset[str]] = graph.memo(_VALUES, dict)
    msgs = graph.messages
    picked: list[int] = [current_user] if current_user is not None else []
    found = 0
    for p in range(len(msgs) - 1, -1, -1):
        if msgs[p].role == "assistant":
            picked.append(p)
            found += 1
            if found == messages:
                break
    out: set[str] = set()
    for p in picked:
        vals = memo.get(p)
        if vals is None:
            m = msgs[p]
            texts = operations(m) if m.role == "assistant" else [m.content]
            vals = memo[p] = frozenset().union(*map(extract_values, texts))
        out |= vals
    return frozenset(out)
