"""A re-selection that keeps its head (``tenure``; :mod:`historygraph.policies.cache_stable`, whose
module docstring gives the design and the measurements): where a re-selection's head ends
(:func:`tenure_point`) and the next re-selection with that head kept byte for byte
(:func:`kept_head`)."""

from __future__ import annotations

from historygraph.history.graph import ContextGraph
from historygraph.policies.base import Policy, Signals
from historygraph.policies.stable_extend import young_start
from historygraph.render import BudgetTooSmallError, Rendering
from historygraph.render.markers import marker_message
from historygraph.render.plan import latest_plan
from historygraph.signals.tokens import TokenCounter


def tenure_point(r: Rendering, graph: ContextGraph, share: float, counter: TokenCounter) -> int:
    """The tenure point of a re-selected rendering ``r``: how many of its leading messages the next
    re-selection keeps byte for byte (:func:`kept_head`), the first step boundary (a rendered
    stored message that is not a tool result or a system message) where those messages hold at
    least ``share`` of its input tokens; 0 (none) when no boundary before its young generation
    (:func:`young_start`) reaches it (:mod:`~historygraph.policies.cache_stable`'s docstring, "A re-selection that keeps its head")."""
    total, acc = r.input_tokens, 0
    for i in range(young_start(r, graph)):
        m = r.messages[i]
        if i and r.positions[i] is not None and m.role not in ("tool", "system") and acc >= share * total:
            return i
        acc += counter.count_message(m)
    return 0


def kept_head(prev: Rendering, head: int, graph: ContextGraph, low: int, signals: Signals, base: Policy,
              whole: set[int]) -> Rendering | None:
    """A re-selection that keeps ``prev``'s first ``head`` messages byte for byte (its cached head,
    read from the provider's cache) and renders what follows with ``base``: ``base``'s rendering
    of the whole history at ``low`` tokens, from its first step at or after the stored message
    that followed the head in ``prev``; the steps between, when ``base`` left them out, under one
    dropped-step marker. When the head is larger than the part of ``base``'s rendering it
    replaces, ``base`` renders again at ``low`` less the excess, once. ``None`` (a whole
    re-selection) when the head is not a step boundary of the history, when the result passes
    ``low`` tokens or leaves a newest result (``whole``, §5.9) or the latest plan (§5.10) not
    shown, or when ``base`` cannot render (:mod:`~historygraph.policies.cache_stable`'s docstring)."""
    cut = prev.positions[head] if 0 < head < len(prev.messages) else None  # the head stands for every stored
    if cut is None:                                                          # message before this one
        return None
    plan = latest_plan(graph)
    shown = {p for m, p in zip(prev.messages[:head], prev.positions[:head]) if p is not None and m.rendered_as is None}
    if plan is not None and plan < cut and plan not in shown:
        return None
    counter = signals.counter
    target = low
    for _ in range(2):
        try:
            r = base.render(graph, max(1, target), signals)
        except BudgetTooSmallError:
            return None
        j = next((i for i, (m, p) in enumerate(zip(r.messages, r.positions))
                  if p is not None and p >= cut and m.role != "tool"), None)
        if j is None:
            return None
        out = _spliced(prev, head, r, j, graph, counter)
        if out.history_tokens <= low and whole <= set(out.full):
            return out
        target -= out.history_tokens - low
        if target <= 0 or out.history_tokens <= low:
            return None
    return None


def _spliced(prev: Rendering, head: int, r: Rendering, j: int, graph: ContextGraph, counter: TokenCounter) -> Rendering:
    """``prev``'s first ``head`` messages, a dropped-step marker for the stored messages between them
    and ``r``'s message ``j`` when there are any, then ``r`` from ``j`` on (:func:`kept_head`)."""
    cut, resume = prev.positions[head], r.positions[j]
    assert cut is not None and resume is not None
    messages, positions = prev.messages[:head], prev.positions[:head]
    if resume > cut:
        calls = sum(len(graph.messages[p].tool_calls) for p in range(cut, resume) if graph.messages[p].role == "assistant")
        messages = [*messages, marker_message(cut, resume - 1, calls)]
        positions = [*positions, None]
    messages, positions = [*messages, *r.messages[j:]], [*positions, *r.positions[j:]]
    msgs = graph.messages
    users = [p for p in range(len(msgs)) if msgs[p].role == "user"]
    outside = {p for p in range(len(msgs)) if msgs[p].role == "system"} | ({users[-1]} if users else set())
    count = counter.count_message
    sizes = [count(m) for m in messages]
    rendered = {p for p in positions if p is not None}
    full = [p for m, p in zip(messages, positions) if p is not None and m.role == "tool" and m.rendered_as is None]
    out = Rendering(policy=r.policy, budget=r.budget, messages=messages, positions=positions, full=full,
                    omitted=sorted(set(graph.results()) - set(full)),
                    dropped=[p for p in range(len(msgs)) if p not in rendered],
                    history_tokens=sum(t for t, p in zip(sizes, positions) if p not in outside),
                    input_tokens=sum(sizes), stats={**r.stats, "kept_head": head})
    before, after = prev.reasons, r.reasons
    out.defer_reasons(lambda: {**{p: x for p, x in before.items() if p < cut},
                               **{p: "kept: the head of the previous re-selection, read from the prompt cache "
                                     "(cache-stable rendering)" for p in range(cut) if p not in before},
                               **{p: x for p, x in after.items() if p >= cut}})
    return out
